"""The strings in a ``.pt2`` program that torch evaluates as Python, checked before it does.

A program's ``models/model.json`` is JSON, but three kinds of string in it become code when
:func:`torch.export.load` reads the program or when the loaded module first runs:

* symbolic sizes (``expr_str``), given to ``sympy.sympify``, which ``eval``\\ s its input:
  ``Symbol('s0', positive=True, integer=True)``, ``Mul(Integer(2), Symbol('s0', ...))``;
* input guards (``guards_code``), pasted into a function that ``exec`` compiles:
  ``L['x'].size()[0] <= 64``;
* pytree specs of the inputs and outputs (``in_spec``/``out_spec``), where a ``defaultdict``
  or an ``Enum`` key makes torch import a module named in the file.

Each string must parse as one Python expression made only of the pieces torch itself writes
(sympy constructors, comparisons and arithmetic on sizes; ``L[...]`` sizes, ``math.*`` and
``min``/``max`` in guards), with no attribute walk, lambda, comprehension or call of anything
else, so evaluating it cannot reach ``__import__``, ``eval`` or a file.

>>> expression_problem("Mul(Integer(2), Symbol('s0', positive=True, integer=True))", SYMPY)
>>> expression_problem("__import__('os').system('id')", SYMPY)
"calls __import__('os').system, which is not one of the sympy constructors torch writes"
>>> expression_problem("L['x'].size()[0] <= 64", GUARD)
>>> expression_problem("L['x'].__class__", GUARD)
'reads the attribute __class__'
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Callable, Optional

import attrs

__all__ = ["Grammar", "SYMPY", "GUARD", "expression_problem", "treespec_problem"]


@attrs.frozen
class Grammar:
    """What one kind of code string may contain.

    Attributes:
        kind: how messages name such a string.
        calls: the names it may call.
        string_args: the called names whose first argument may be a string.
        attributes: attribute names it may read (``size`` of ``L['x'].size()``).
        modules: names whose attributes it may read and call (``math`` of ``math.floor``).
        subscript_roots: names it may index (``L`` of ``L['x']``).
        characters: the characters the whole string may use.
    """

    kind: str
    calls: frozenset[str]
    string_args: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    subscript_roots: frozenset[str] = frozenset()
    characters: re.Pattern[str] = re.compile(r"[\w\s()',.=+\-*/%<>!&|~\[\]]*")


# Names torch's deserializer gives sympy beside its own (torch/_export/serde/serialize.py), and
# the sympy classes ``srepr`` writes for sizes, relations and logic.
_TORCH_SYMPY = frozenset({
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity",
})
_SYMPY_CORE = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs", "floor",
    "ceiling", "sqrt", "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan",
    "GreaterThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise",
    "ExprCondPair", "BooleanTrue", "BooleanFalse", "Infinity", "NegativeInfinity", "Half", "One",
    "Zero", "NegativeOne",
})

#: Symbolic size expressions (``expr_str``), evaluated by ``sympy.sympify``.
SYMPY = Grammar(kind="symbolic size", calls=_TORCH_SYMPY | _SYMPY_CORE, string_args=frozenset({"Symbol", "Float"}))

#: Input guards (``guards_code``), compiled with ``exec`` when the program becomes a module.
GUARD = Grammar(
    kind="input guard",
    calls=frozenset({"abs", "max", "min", "round", "int", "float", "IsNonOverlappingAndDenseIndicator",
                     "floor", "ceil", "trunc", "log2", "sqrt", "sym_float", "sym_max", "sym_min", "_sym_sqrt",
                     "size", "stride", "storage_offset", "dim", "numel"}),
    attributes=frozenset({"size", "stride", "storage_offset", "dim", "numel", "shape", "floor", "ceil", "trunc",
                          "log2", "sqrt", "inf", "nan", "sym_float", "sym_max", "sym_min", "_sym_sqrt"}),
    modules=frozenset({"math", "torch"}),
    subscript_roots=frozenset({"L"}),
)

_SAFE_STRING = re.compile(r"[\w.\-]*")
_NODES: tuple[type, ...] = (
    ast.Expression, ast.Call, ast.keyword, ast.Name, ast.Constant, ast.Tuple, ast.BinOp, ast.UnaryOp,
    ast.BoolOp, ast.Compare, ast.Subscript, ast.Attribute, ast.Load, ast.operator, ast.unaryop, ast.boolop,
    ast.cmpop,
)


def _callee(func: ast.expr) -> str:
    return ast.unparse(func)


def _call_problem(node: ast.Call, grammar: Grammar) -> Optional[str]:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or name not in grammar.calls:
        which = "the sympy constructors torch writes" if grammar is SYMPY else "the functions torch's guards use"
        return f"calls {_callee(func)}, which is not one of {which}"
    for i, arg in enumerate(node.args):
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if i != 0 or name not in grammar.string_args or not _SAFE_STRING.fullmatch(arg.value):
                return f"passes the string {arg.value!r} to {name}"
    return None


def _attribute_problem(node: ast.Attribute, grammar: Grammar) -> Optional[str]:
    if node.attr not in grammar.attributes:
        return f"reads the attribute {node.attr}"
    base = node.value
    if isinstance(base, ast.Name) and base.id not in grammar.modules | grammar.subscript_roots:
        return f"reads an attribute of {base.id}"
    return None


def _subscript_problem(node: ast.Subscript, grammar: Grammar) -> Optional[str]:
    root: ast.expr = node
    while isinstance(root, (ast.Subscript, ast.Call, ast.Attribute)):
        root = root.value if isinstance(root, (ast.Subscript, ast.Attribute)) else root.func
    if not (isinstance(root, ast.Name) and root.id in grammar.subscript_roots):
        return f"indexes {ast.unparse(node.value)}"
    key = node.slice
    if not (isinstance(key, ast.Constant) and isinstance(key.value, (int, str)) and not isinstance(key.value, bool)
            and _SAFE_STRING.fullmatch(str(key.value))):
        return f"indexes with {ast.unparse(key)}"
    return None


def _node_problem(node: ast.AST, grammar: Grammar) -> Optional[str]:
    if not isinstance(node, _NODES):
        return f"contains a {type(node).__name__} expression"
    if isinstance(node, ast.Name) and ("__" in node.id or node.id in {"eval", "exec", "compile", "open", "getattr"}):
        return f"names {node.id}"
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        return f"holds the constant {node.value!r}"
    checks: dict[type, Callable[[Any, Grammar], Optional[str]]] = {
        ast.Call: _call_problem, ast.Attribute: _attribute_problem, ast.Subscript: _subscript_problem,
    }
    check = checks.get(type(node))
    return check(node, grammar) if check else None


def expression_problem(text: Any, grammar: Grammar) -> Optional[str]:
    """Why ``text`` is not a code string of ``grammar``'s kind, or ``None`` when it is one."""
    if not isinstance(text, str):
        return f"is a {type(text).__name__}, not a string"
    if not grammar.characters.fullmatch(text):
        bad = sorted({c for c in text if not grammar.characters.fullmatch(c)})
        return f"contains the character(s) {''.join(bad)!r}"
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return "is not one Python expression"
    for node in ast.walk(tree):
        problem = _node_problem(node, grammar)
        if problem:
            return problem
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    if any(not _SAFE_STRING.fullmatch(text) for text in strings):
        return "holds a string with characters other than letters, digits, '_', '.' and '-'"
    return None


#: pytree node types whose specs make torch import a module the file names.
_IMPORTING_TYPES = frozenset({"collections.defaultdict"})


def treespec_problem(text: Any) -> Optional[str]:
    """Why a serialized pytree spec would make torch import something, or ``None``.

    >>> treespec_problem('[1, {"type": "builtins.tuple", "context": "null", "children_spec": []}]')
    >>> treespec_problem('[1, {"type": "collections.defaultdict", "context": "{}", "children_spec": []}]')
    'has a collections.defaultdict node, whose context names a module torch would import'
    """
    try:
        protocol, spec = json.loads(text)
    except (TypeError, ValueError):
        return "is not a serialized pytree spec"
    pending = [spec]
    while pending:
        node = pending.pop()
        if not isinstance(node, dict):
            return "is not a serialized pytree spec"
        kind, context = node.get("type"), node.get("context")
        if kind in _IMPORTING_TYPES:
            return f"has a {kind} node, whose context names a module torch would import"
        if isinstance(context, str) and "__enum__" in context:
            return "has an Enum key, which names a module torch would import"
        children = node.get("children_spec") or []
        if not isinstance(children, list):
            return "is not a serialized pytree spec"
        pending.extend(children)
    return None
