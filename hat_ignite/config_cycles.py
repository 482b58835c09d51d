"""Finding a config value that contains itself, named by key paths, before anything walks it.

A config is a tree of dicts, lists and tuples that may share a node (``model`` used by the
trainer and by the predictor is fine); a node inside itself (``float_trainer["callbacks"][0]["me"]
= float_trainer``) cannot be built, dumped or searched, and every recursive walk over it would
end in a ``RecursionError`` after seconds. :func:`self_reference` finds such a cycle with one
iterative walk over the containers and names both ends.

>>> cfg = {"trainer": {"callbacks": [{"type": "X"}]}, "model": {}}
>>> cfg["trainer"]["callbacks"][0]["me"] = cfg["trainer"]
>>> self_reference(cfg)
('trainer.callbacks[0].me', 'trainer')
>>> self_reference({"a": cfg["model"], "b": cfg["model"]}) is None  # shared, not cyclic
True
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Optional

__all__ = ["self_reference", "cycle_message"]

_CONTAINERS = (dict, list, tuple, set, frozenset)


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield child, f"{path}.{key}" if path else str(key)
    elif isinstance(value, (list, tuple)):
        for i, child in enumerate(value):
            yield child, f"{path}[{i}]"
    else:
        for child in value:
            yield child, f"{path}[...]"


def self_reference(data: Mapping[str, Any]) -> Optional[tuple[str, str]]:
    """The first ``(reference path, path of the container it refers back to)``, or ``None``."""
    done: set[int] = set()
    open_paths: dict[int, str] = {}  # containers on the current walk -> their path
    stack: list[tuple[int, Iterator[tuple[Any, str]]]] = [(id(data), _children(data, ""))]
    open_paths[id(data)] = "<config>"
    while stack:
        node, children = stack[-1]
        for child, path in children:
            if not isinstance(child, _CONTAINERS) and not isinstance(child, Mapping):
                continue
            if id(child) in open_paths:
                return path, open_paths[id(child)]
            if id(child) not in done:
                open_paths[id(child)] = path
                stack.append((id(child), _children(child, path)))
                break
        else:
            stack.pop()
            open_paths.pop(node, None)
            done.add(node)
    return None


def cycle_message(found: tuple[str, str]) -> str:
    """What to tell the user about a self-containing value."""
    reference, target = found
    return (
        f"{reference} refers back to {target}, which contains it: a config value that contains itself "
        f"cannot be built, written or searched. Give a copy there (e.g. dict({target.rsplit('.', 1)[-1]}) or "
        f"copy.deepcopy(...)) or remove the reference."
    )
