"""Which of its ``**kwargs`` a HAT hook really reads, found once from its bytecode.

HAT hooks take ``**kwargs`` and pick what they need. Passing a 10-18-entry keyword dict into a
``**kwargs`` parameter makes Python unpack and rebuild it on every call (about 1 µs), which is most
of what a trivial callback costs. :func:`keywords_read` looks at the hook's code when it is
attached: when every use of the ``**kwargs`` parameter reads one constant key (``kwargs["epoch_id"]``,
``kwargs.get("batch")``, ``kwargs.get("batch", None)``, ``"loop" in kwargs``), the hook is passed
just those keys, and a hook that never touches its ``**kwargs`` gets none. What the hook observes is
unchanged: each of those expressions gives the same value (or the same ``KeyError``) with the
smaller dict. Any other use — passing ``**kwargs`` on, iterating, ``len``, storing into it, a
non-constant key, a nested function or ``locals()``/``eval`` that could see it — gets the full dict.

>>> def on_step_end(self, **kwargs):
...     if "loop" in kwargs and kwargs.get("batch") is not None:
...         return kwargs["global_step_id"]
>>> sorted(keywords_read(on_step_end))
['batch', 'global_step_id', 'loop']
>>> def forwards(self, **kwargs):
...     return print(**kwargs)
>>> keywords_read(forwards) is None
True
>>> keywords_read(lambda **kwargs: None)
frozenset()
"""

from __future__ import annotations

import dis
import inspect
from types import FunctionType, MethodType
from typing import Any, Callable

__all__ = ["keywords_read"]

#: Names whose call could read a frame's locals (and so the whole ``**kwargs`` dict).
_FRAME_READERS = frozenset(
    {"locals", "vars", "eval", "exec", "breakpoint", "_getframe", "currentframe", "getframeinfo", "stack", "trace"}
)
_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_CALLS = frozenset({"PRECALL", "CALL", "CALL_METHOD", "CALL_FUNCTION"})
_SKIP = frozenset({"CACHE", "EXTENDED_ARG", "NOP"})


def _var_keyword_name(code: Any) -> str | None:
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return None
    index = code.co_argcount + code.co_kwonlyargcount + (1 if code.co_flags & inspect.CO_VARARGS else 0)
    return code.co_varnames[index]


def _str_const(ins: Any) -> str | None:
    return ins.argval if ins.opname == "LOAD_CONST" and isinstance(ins.argval, str) else None


def _constant_key(instrs: list, i: int) -> str | None:
    """The key of a ``kwargs[K]`` / ``kwargs.get(K[, const])`` / ``K in kwargs`` read at ``instrs[i]``."""
    nxt = instrs[i + 1: i + 5]
    names = [ins.opname for ins in nxt]
    if len(nxt) >= 2 and _str_const(nxt[0]) is not None and names[1] == "BINARY_SUBSCR":
        return _str_const(nxt[0])
    if i > 0 and _str_const(instrs[i - 1]) is not None and names[:1] == ["CONTAINS_OP"]:
        return _str_const(instrs[i - 1])
    if len(nxt) >= 3 and names[0] in ("LOAD_METHOD", "LOAD_ATTR") and nxt[0].argval == "get":
        key = _str_const(nxt[1])
        if key is None:
            return None
        if names[2] in _CALLS and nxt[2].arg == 1:
            return key
        if len(nxt) >= 4 and names[2] == "LOAD_CONST" and names[3] in _CALLS and nxt[3].arg == 2:
            return key
    return None


def keywords_read(func: Callable) -> frozenset[str] | None:
    """The keys ``func`` reads from its ``**kwargs``, when it reads them only by constant key.

    Args:
        func: a hook (function or bound method) taking ``**kwargs``.

    Returns:
        The keys read (empty when ``**kwargs`` is never used), or ``None`` when ``func`` must get
        the full keyword dict: it uses ``**kwargs`` some other way, is not a plain Python
        function, or takes no ``**kwargs``.
    """
    target = func.__func__ if isinstance(func, MethodType) else func
    if not isinstance(target, FunctionType):
        return None
    code = target.__code__
    name = _var_keyword_name(code)
    if name is None or name in code.co_cellvars or _FRAME_READERS & set(code.co_names):
        return None
    instrs = [ins for ins in dis.get_instructions(code) if ins.opname not in _SKIP]
    keys: set[str] = set()
    for i, ins in enumerate(instrs):
        argval = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        if name not in argval or "FAST" not in ins.opname:
            continue
        if ins.opname not in _LOADS:
            return None  # stored, deleted, or loaded with another local in one instruction
        key = _constant_key(instrs, i)
        if key is None:
            return None
        keys.add(key)
    return frozenset(keys)
