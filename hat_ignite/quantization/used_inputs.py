"""Which entries of a dict input an exported graph uses: the graph takes only those.

``torch.export`` makes every entry of a dict argument part of the graph's signature, used or not.
HAT configs export a deploy model (``losses=None``) from the same kind of batch the training
model saw (``{"img", "labels"}``), then trace or call it with the deploy inputs alone
(``SaveTraced(trace_inputs=dict(img=...))``): the graph would ask for a ``labels`` it never uses.
So after an export, :func:`unused_entries` lists the tensor entries of top-level dict arguments
whose graph inputs feed nothing, and the converter exports again without them.
:func:`keep_keys` then lets the prepared module be called with more entries than its graph takes
(a predictor's whole batch).

>>> class Deploy(nn.Module):
...     def forward(self, data):
...         target = data.get("labels")  # read, but it feeds nothing
...         return data["img"] * 2
>>> args = ({"img": torch.ones(2, 3), "labels": torch.zeros(2)},)
>>> unused_entries(torch.export.export(Deploy(), args), args, {})
{0: ['labels']}
>>> keep_keys(({"img": 1, "labels": 2},), [frozenset({"img"})])
({'img': 1},)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from torch.utils._pytree import MappingKey, SequenceKey, tree_flatten_with_path

__all__ = ["unused_entries", "without_entries", "input_keys", "keep_keys"]


def unused_entries(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> dict[int, list[Any]]:
    """``{argument index: [keys]}``: the tensor entries of dict arguments the graph never uses.

    ``program`` was exported from ``args`` and ``kwargs``; its user inputs are their flattened
    leaves, in order. Empty when the two cannot be matched up.
    """
    leaves = tree_flatten_with_path((args, kwargs))[0]
    specs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(specs) != len(leaves):
        return {}
    users = {node.name: len(node.users) for node in program.graph.nodes if node.op == "placeholder"}
    unused: dict[int, list[Any]] = {}
    for (path, leaf), spec in zip(leaves, specs):
        name = getattr(spec.arg, "name", None)
        if not isinstance(leaf, torch.Tensor) or name is None or users.get(name, 1):
            continue
        # (args or kwargs, argument, key): an entry of a top-level dict argument
        if len(path) == 3 and path[0] == SequenceKey(0) and isinstance(path[1], SequenceKey) \
                and isinstance(path[2], MappingKey) and type(args[path[1].idx]) is dict:
            unused.setdefault(path[1].idx, []).append(path[2].key)
    return unused


def without_entries(args: tuple, unused: dict[int, list[Any]]) -> tuple:
    """``args`` without those entries of its dict arguments."""
    return tuple(
        {k: v for k, v in a.items() if k not in unused[i]} if i in unused else a for i, a in enumerate(args)
    )


def input_keys(args: tuple) -> list[frozenset | None] | None:
    """The keys of each dict argument (``None`` for other arguments; ``None`` when no dict)."""
    keys = [frozenset(a) if type(a) is dict else None for a in args]
    return keys if any(k is not None for k in keys) else None


def keep_keys(args: tuple, keys: Sequence[frozenset | None]) -> tuple:
    """``args`` with each dict argument cut down to the keys its graph takes."""
    out = []
    for i, arg in enumerate(args):
        wanted = keys[i] if i < len(keys) else None
        if wanted is not None and isinstance(arg, dict) and len(arg) != len(wanted):
            arg = {k: v for k, v in arg.items() if k in wanted}
        out.append(arg)
    return tuple(out)
