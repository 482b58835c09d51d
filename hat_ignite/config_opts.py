"""``--opts`` overrides: parsing ``KEY=VALUE`` items and HAT's ``KEY VALUE`` pairs, and setting key paths.

Kept apart from :mod:`hat_ignite.config` (which re-exports :func:`parse_opts`); imports nothing heavy.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping
from typing import Any, Sequence

from hat_ignite.errors import ConfigError

__all__ = ["parse_opts", "parse_items", "set_path", "path_exists", "format_path", "split_key", "literal"]

_NAME = r"[^.\[\]\s]+"
_KEY_PATH = re.compile(rf"{_NAME}(?:\.{_NAME}|\[-?\d+\])*")
_KEY_PART = re.compile(rf"\.?({_NAME})|\[(-?\d+)\]")
_OPT_FORM = (
    "KEY=VALUE or KEY VALUE pairs, e.g. float_trainer.num_epochs=3, float_trainer.num_epochs 3 or "
    "float_trainer.callbacks[1].lr=0.1"
)


def split_key(key: str, item: str) -> list[str | int]:
    """``"a.b[2].c"`` -> ``["a", "b", 2, "c"]``; numeric dotted parts (``a.2``) are indexes too."""
    if not _KEY_PATH.fullmatch(key):
        raise ConfigError(f"--opts item {item!r}: {key!r} is not a key path. Expected {_OPT_FORM}.")
    parts: list[str | int] = []
    for m in _KEY_PART.finditer(key):
        name, index = m.groups()
        parts.append(int(index) if index is not None else int(name) if re.fullmatch(r"-?\d+", name) else name)
    if not isinstance(parts[0], str):
        raise ConfigError(f"--opts item {item!r}: a key path starts with a top-level name. Expected {_OPT_FORM}.")
    return parts


def is_key_value(item: Any) -> bool:
    """Whether ``item`` is one ``KEY=VALUE`` override (its text before ``=`` is a key path)."""
    return isinstance(item, str) and "=" in item and bool(_KEY_PATH.fullmatch(item.partition("=")[0].strip()))


def literal(text: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_items(opts: Sequence[str]) -> list[tuple[list[str | int], Any, str]]:
    """``(key parts, value, the item as written)`` for each override, ``K=V`` or ``K V``."""
    parsed: list[tuple[list[str | int], Any, str]] = []
    items = list(opts)
    i = 0
    while i < len(items):
        item = items[i]
        if not isinstance(item, str):
            raise ConfigError(f"--opts item {item!r} is not a string. Expected {_OPT_FORM}.")
        if is_key_value(item):
            key, _, text = item.partition("=")
            parsed.append((split_key(key.strip(), item), literal(text), item))
            i += 1
            continue
        if "=" in item:  # text before '=' that is no key path
            raise ConfigError(f"--opts item {item!r}: {item.partition('=')[0]!r} is not a key path. Expected {_OPT_FORM}.")
        if i + 1 >= len(items):
            raise ConfigError(
                f"--opts item {item!r} has no value: it is neither KEY=VALUE nor followed by its value "
                f"(HAT's KEY VALUE pairs). Expected {_OPT_FORM}."
            )
        value = items[i + 1]
        if not isinstance(value, str):
            raise ConfigError(f"--opts value {value!r} of {item!r} is not a string.")
        parsed.append((split_key(item.strip(), item), literal(value), f"{item} {value}"))
        i += 2
    return parsed


def parse_opts(opts: Sequence[str]) -> list[tuple[list[str | int], Any]]:
    """Parse ``--opts`` items into ``(key parts, value)`` pairs.

    An item is ``KEY=VALUE``, or (HAT's form) a ``KEY`` followed by its ``VALUE`` as the next
    item; the two forms may be mixed. Values are read with :func:`ast.literal_eval` (numbers,
    ``None``, ``True``, lists, dicts, quoted strings); anything else is kept as a string.

    Raises:
        ConfigError: a key that is not a key path, or a ``KEY`` without its value.

    >>> parse_opts(["a.b=1", "c=[1, 2]", "d=hello", "e[0]=None"])
    [(['a', 'b'], 1), (['c'], [1, 2]), (['d'], 'hello'), (['e', 0], None)]
    >>> parse_opts(["float_trainer.num_epochs", "1", "lr=0.5", "name", "'a=b'"])
    [(['float_trainer', 'num_epochs'], 1), (['lr'], 0.5), (['name'], 'a=b')]
    """
    return [(parts, value) for parts, value, _ in parse_items(opts)]


def format_path(parts: Sequence[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def path_exists(data: Any, parts: Sequence[str | int]) -> bool:
    """Whether ``data`` has a value at the key path ``parts``.

    >>> path_exists({"a": [1, {"b": 2}]}, ["a", 1, "b"]), path_exists({"a": []}, ["a", 0])
    (True, False)
    """
    node: Any = data
    for part in parts:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    return True


def set_path(data: Any, parts: Sequence[str | int], value: Any, item: str, filename: str) -> None:
    """Set the value at the key path ``parts`` of ``data`` in place (the last part may be new).

    Raises:
        ConfigError: an earlier part is missing (with the closest keys), an index out of range,
            or a key used on a list / an index on a dict.
    """
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = format_path(parts[: depth + 1])
        if isinstance(node, Mapping) and not isinstance(part, int):
            if last:
                node[part] = value  # type: ignore[index]
                return
            if part not in node:
                close = difflib.get_close_matches(part, [str(k) for k in node], n=3)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ConfigError(f"--opts item {item!r}: {filename} has no key {where!r}.{hint}")
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int):
            if not -len(node) <= part < len(node):
                raise ConfigError(
                    f"--opts item {item!r}: index {part} is out of range at {where!r} (a list of {len(node)})."
                )
            if last:
                node[part] = value
                return
            node = node[part]
        else:
            kind = "an index" if isinstance(part, int) else "a key"
            raise ConfigError(
                f"--opts item {item!r}: {where!r} uses {kind} on a {type(node).__name__} value "
                f"({node!r:.60}); only dicts have keys and lists have indexes."
            )
