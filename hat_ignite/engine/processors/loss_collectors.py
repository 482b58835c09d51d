"""Loss collectors: pick the loss tensors out of a model's outputs."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch

__all__ = ["collect_loss_by_index", "collect_loss_by_regex", "flatten_outputs"]


def collect_loss_by_index(indexes: int | Sequence[int]) -> Callable[[Any], list]:
    """Collect the losses at the given indexes of a sequence of model outputs.

    Suits outputs such as ``(losses, preds)`` or ``(loss1, loss2, preds)``. Each selected item is
    one tensor or a list of tensors; the result is the flat list.

    Args:
        indexes: one index or several indexes into the model outputs.

    Returns:
        ``collector(model_outs) -> list[Tensor]``.

    Example:
        >>> model_outs = [
        ...     [torch.tensor(1.0), torch.tensor(2.0)],  # losses
        ...     [torch.tensor(3.0), torch.tensor(4.0)],  # preds
        ... ]
        >>> collector = collect_loss_by_index(0)
        >>> collector(model_outs)
        [tensor(1.), tensor(2.)]
        >>> collect_loss_by_index([0, 1])((torch.tensor(5.0), torch.tensor(6.0), "pred"))
        [tensor(5.), tensor(6.)]
    """
    index_list = [indexes] if isinstance(indexes, int) else list(indexes)
    for i in index_list:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"collect_loss_by_index: indexes must be ints, got {i!r}.")

    def collector(model_outs: Any) -> list:
        if not isinstance(model_outs, (list, tuple)):
            raise TypeError(
                f"collect_loss_by_index({indexes!r}) needs model outputs that are a list or tuple, "
                f"got {type(model_outs).__name__}. Use collect_loss_by_regex for dict outputs."
            )
        n = len(model_outs)
        losses: list = []
        for i in index_list:
            if not -n <= i < n:
                raise IndexError(
                    f"collect_loss_by_index({indexes!r}): index {i} is out of range for model "
                    f"outputs of length {n}."
                )
            item = model_outs[i]
            kind = item.__class__  # exact classes first: a Mapping check costs an ABC lookup per step
            if kind is dict:
                losses.extend(item.values())
            elif kind is list or kind is tuple or isinstance(item, (list, tuple)):
                losses.extend(item)
            elif isinstance(item, Mapping):
                losses.extend(item.values())
            else:
                losses.append(item)
        return losses

    return collector


def flatten_outputs(outputs: Any, prefix: str = "") -> "OrderedDict[str, Any]":
    """Flatten nested dicts/lists/tuples into an ordered ``{dotted_key: leaf}`` dict.

    >>> list(flatten_outputs({"a": {"loss": 1}, "b": [2, 3]}).items())
    [('a.loss', 1), ('b.0', 2), ('b.1', 3)]
    """
    flat: OrderedDict[str, Any] = OrderedDict()
    if isinstance(outputs, Mapping):
        items = ((str(k), v) for k, v in outputs.items())
    elif isinstance(outputs, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(outputs))
    else:
        flat[prefix] = outputs
        return flat
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, (Mapping, list, tuple)):
            flat.update(flatten_outputs(value, name))
        else:
            flat[name] = value
    return flat


def collect_loss_by_regex(loss_name_pattern: str) -> Callable[[Any], list]:
    """Flatten the model outputs to dotted keys and collect the tensors whose key matches.

    Args:
        loss_name_pattern: a :mod:`re` pattern, e.g. ``'^.*loss.*'``, matched with
            ``re.match`` against each flattened key (``"head.cls_loss"``, ``"losses.0"``).

    Returns:
        ``collector(model_outs) -> list[Tensor]`` in the outputs' order.

    Example:
        >>> model_outs = dict(
        ...     toy_loss_1=torch.tensor(1.0),
        ...     toy_predict=torch.tensor(2.0),
        ...     toy_loss_2=torch.tensor(3.0),
        ... )
        >>> collector = collect_loss_by_regex('^.*loss.*')
        >>> collector(model_outs)
        [tensor(1.), tensor(3.)]
    """
    try:
        pattern = re.compile(loss_name_pattern)
    except re.error as exc:
        raise ValueError(f"collect_loss_by_regex: {loss_name_pattern!r} is not a valid regex: {exc}.") from exc

    def collector(model_outs: Any) -> list:
        return [
            v for k, v in flatten_outputs(model_outs).items() if isinstance(v, torch.Tensor) and pattern.match(k)
        ]

    return collector
