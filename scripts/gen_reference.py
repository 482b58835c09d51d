"""Write docs/reference/<package>.md: the arguments of every public class and function, from the docstrings.

Run from the repository root after changing a docstring or a signature::

    .venv/bin/python scripts/gen_reference.py           # rewrite the pages
    .venv/bin/python scripts/gen_reference.py --check   # exit 1 if a page is not current

Each page lists the names in the package's ``__all__``: the signature (defaults as written in the
code), the docstring's description, and a table of the arguments with the text of the Google-style
``Args:`` section. An argument documented as "see :class:`Base`" gets the base class's text for it.
``tests/test_reference_docs.py`` fails when a checked-in page differs from what this script writes.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import os
import re
import sys
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "docs", "reference")
PACKAGES = ("callbacks", "engine", "metrics", "quantization")
_SECTIONS = ("Args:", "Arguments:", "Returns:", "Raises:", "Example:", "Examples:", "Yields:", "Attributes:", "Note:")


def _inline(text: str) -> str:
    """RST roles and literals as Markdown code; pipes escaped for tables."""
    text = re.sub(r":(?:class|func|meth|attr|mod|data|exc):`~?\.?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return text.replace("|", "\\|")


def _split_sections(doc: str) -> tuple[list[str], list[str]]:
    """The description lines (up to the first section or example) and the ``Args:`` lines."""
    lines = doc.splitlines()
    description: list[str] = []
    args: list[str] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped in _SECTIONS or stripped.startswith(">>>"):
            break
        description.append(lines[i])
        i += 1
    while i < len(lines):
        if lines[i].strip() in ("Args:", "Arguments:"):
            indent = None
            i += 1
            while i < len(lines):
                line = lines[i]
                if line.strip() and (len(line) - len(line.lstrip())) == 0 and indent is not None:
                    break
                if line.strip() in _SECTIONS or line.strip().startswith(">>>"):
                    break
                if indent is None and line.strip():
                    indent = len(line) - len(line.lstrip())
                args.append(line)
                i += 1
            break
        i += 1
    return description, args


def parse_args_section(doc: str) -> dict[str, str]:
    """``{name: text}`` from a Google-style ``Args:`` section (``a, b: text`` documents both).

    >>> parse_args_section('''Do it.
    ...
    ... Args:
    ...     size: how many,
    ...         at most 3.
    ...     x, y: the point.
    ... ''')
    {'size': 'how many, at most 3.', 'x': 'the point.', 'y': 'the point.'}
    """
    _, lines = _split_sections(inspect.cleandoc(doc))
    entries: dict[str, str] = {}
    indent = None
    current: list[str] = []
    names: list[str] = []

    def flush() -> None:
        for name in names:
            entries[name] = " ".join(current).strip()

    for line in lines:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        match = re.match(r"^\s*(\*{0,2}[\w]+(?:\s*,\s*\*{0,2}[\w]+)*)\s*(?:\([^)]*\))?:\s*(.*)$", line)
        if width == indent and match:
            flush()
            names = [n.strip().lstrip("*") for n in match.group(1).split(",")]
            current = [match.group(2).strip()]
        else:
            current.append(line.strip())
    flush()
    return entries


def _description(doc: str) -> str:
    description, _ = _split_sections(inspect.cleandoc(doc))
    paragraphs = "\n".join(description).strip().split("\n\n")
    return "\n\n".join(_inline(" ".join(p.split())) for p in paragraphs if p.strip())


def _default(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "required"
    if inspect.isfunction(value) or inspect.isclass(value) or inspect.isbuiltin(value):
        return f"`{value.__qualname__}`"
    text = repr(value)
    if " at 0x" in text:
        text = f"<{type(value).__name__}>"
    return f"`{text}`".replace("|", "\\|")


def _other_texts(cls: type, module: Any) -> dict[str, tuple[str, str]]:
    """``{name: (text, class name)}`` from the ``Args:`` of the class's bases (nearest first), then
    of the package's classes its docstring names (":class:`Float2Calibration`'s arguments")."""
    owners = [b for b in cls.__mro__[1:] if b is not object and b.__module__.startswith("hat_ignite")]
    for ref in re.findall(r":class:`~?\.?([\w.]+)`", cls.__doc__ or ""):
        named = getattr(module, ref.split(".")[-1], None)
        if inspect.isclass(named) and named is not cls:
            owners.append(named)
    found: dict[str, tuple[str, str]] = {}
    for owner in owners:
        for name, text in parse_args_section(owner.__doc__ or "").items():
            found.setdefault(name, (text, owner.__name__))
    return found


def _argument_rows(target: Callable, doc_args: dict[str, str], bases: dict[str, tuple[str, str]]) -> list[str]:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    rows = []
    for name, param in signature.parameters.items():
        if name in ("self", "cls"):
            continue
        text = doc_args.get(name, "")
        if (not text or text.startswith("see ")) and name in bases:
            base_text, base_name = bases[name]
            text = f"{base_text} (from `{base_name}`)"
        shown = name
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            shown = f"*{name}"
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            shown = f"**{name}"
        default = "" if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) else _default(param.default)
        rows.append(f"| `{shown}` | {default} | {_inline(text) if text else '(not documented)'} |")
    return rows


def _signature_text(name: str, target: Callable) -> str:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return f"{name}(...)"
    parts = []
    for pname, param in signature.parameters.items():
        if pname in ("self", "cls"):
            continue
        if param.kind is param.VAR_POSITIONAL:
            parts.append(f"*{pname}")
        elif param.kind is param.VAR_KEYWORD:
            parts.append(f"**{pname}")
        elif param.default is inspect.Parameter.empty:
            parts.append(pname)
        else:
            default = _default(param.default).strip("`")
            parts.append(f"{pname}={default}")
    return f"{name}({', '.join(parts)})"


def _entry(name: str, obj: Any, module: Any) -> list[str]:
    out = [f"## {name}", ""]
    rows: list[str] = []
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        doc = inspect.getdoc(obj) or ""
        out += ["Members: " + ", ".join(f"`{member.name}`" for member in obj), ""]
    elif inspect.isclass(obj):
        doc = inspect.getdoc(obj) or ""
        doc_args = parse_args_section(obj.__doc__ or "")
        init = vars(obj).get("__init__")
        if init is not None and init.__doc__:
            doc_args = {**parse_args_section(init.__doc__), **doc_args}
        out += [f"`{_signature_text(name, obj)}`", ""]
        bases = [b.__name__ for b in obj.__mro__[1:-1] if b.__module__.startswith("hat_ignite") and not b.__name__.startswith("_")]
        if bases:
            out += [f"Subclass of {', '.join(f'`{b}`' for b in bases)}.", ""]
        if obj.__init__ is not object.__init__:
            rows = _argument_rows(obj, doc_args, _other_texts(obj, module))
    elif callable(obj):
        doc = inspect.getdoc(obj) or ""
        out += [f"`{_signature_text(name, obj)}`", ""]
        rows = _argument_rows(obj, parse_args_section(obj.__doc__ or ""), {})
    else:
        doc = ""
        text = repr(obj)
        out += [f"A constant: `{_inline(text)}`" if len(text) < 200 else f"A `{type(obj).__name__}`.", ""]
    description = _description(doc) if doc else ""
    if description:
        out += [description, ""]
    if rows:
        out += ["| argument | default | description |", "|---|---|---|", *rows, ""]
    return out


def render(package: str) -> str:
    """The Markdown page of ``hat_ignite.<package>``."""
    module = importlib.import_module(f"hat_ignite.{package}")
    names = list(getattr(module, "__all__", []))
    out = [
        f"# `hat_ignite.{package}` reference",
        "",
        "Generated from the docstrings by `scripts/gen_reference.py`; do not edit by hand. After changing",
        "a docstring or a signature, run `.venv/bin/python scripts/gen_reference.py`.",
        "",
    ]
    summary = _description(module.__doc__ or "")
    if summary:
        out += [summary, ""]
    out += [" · ".join(f"[{n}](#{n.lower()})" for n in names), ""]
    for name in names:
        out += _entry(name, getattr(module, name), module)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not current")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    stale = []
    for package in PACKAGES:
        path = os.path.join(OUT_DIR, f"{package}.md")
        text = render(package)
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not args.check:
            os.makedirs(OUT_DIR, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if args.check and stale:
        print(f"not current: {', '.join(stale)}; run .venv/bin/python scripts/gen_reference.py", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
