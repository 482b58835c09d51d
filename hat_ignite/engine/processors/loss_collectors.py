"""Loss collectors: pick the loss tensors out of a model's outputs."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch

__all__ = ["collect_loss_by_index", "collect_loss_by_regex", "flatten_outputs", "to_flat_ordered_dict"]


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


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields") and hasattr(obj, "_asdict")


def to_flat_ordered_dict(
    obj: Any, key_prefix: str = "", flat_condition: Callable[[str, Any], bool] | None = None,
) -> "OrderedDict[str, Any]":
    """Flatten nested dicts, namedtuples, lists and tuples into ``{key: leaf}``, keys as HAT makes them.

    A key joins the path with ``_``: dict keys and namedtuple field names as they are, list and
    tuple positions as numbers (``{"a": [x]}`` -> ``"a_0"``). HAT's regex loss collectors and
    metric update functions match their patterns against these keys, so a HAT model's
    ``OrderedOutput(task1_toy_ToyLoss=...)`` inside a tuple is ``"0_task1_toy_ToyLoss"``.

    Args:
        obj: the object to flatten.
        key_prefix: put in front of every key (joined with ``_``).
        flat_condition: ``f(key, value) -> bool``; a value for which it is false is kept whole
            under its key instead of being flattened.

    Example:
        >>> obj = dict(a=[dict(c=1)], d=(2, 3))
        >>> to_flat_ordered_dict(obj, key_prefix="test")
        OrderedDict([('test_a_0_c', 1), ('test_d_0', 2), ('test_d_1', 3)])
        >>> to_flat_ordered_dict(obj, flat_condition=lambda k, v: not isinstance(v, tuple))
        OrderedDict([('a_0_c', 1), ('d', (2, 3))])
    """
    if not isinstance(key_prefix, str):
        raise TypeError(f"to_flat_ordered_dict: key_prefix must be a str, got {type(key_prefix).__name__}.")
    flat: OrderedDict[str, Any] = OrderedDict()
    if flat_condition is not None and not flat_condition(key_prefix, obj):
        flat[key_prefix] = obj
        return flat
    if isinstance(obj, dict):
        items: Any = obj.items()
    elif _is_namedtuple(obj):
        items = zip(obj._fields, obj)
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        flat[key_prefix] = obj
        return flat
    for key, value in items:
        name = f"{key_prefix}_{key}" if key_prefix != "" else str(key)
        flat.update(to_flat_ordered_dict(value, name, flat_condition))
    return flat


def collect_loss_by_regex(loss_name_pattern: str) -> Callable[[Any], list]:
    """Flatten the model outputs (:func:`to_flat_ordered_dict` keys) and collect the matching losses.

    The pattern is matched with ``re.match``, ignoring case (as HAT: ``'^.*loss.*'`` finds
    ``"0_task1_toy_ToyLoss"``). A matching key whose value is ``None`` is skipped; one whose value
    is not a tensor, or no match at all, is an error naming the keys.

    Args:
        loss_name_pattern: a :mod:`re` pattern, e.g. ``'^.*loss.*'``.

    Returns:
        ``collector(model_outs) -> list[Tensor]`` in the outputs' order.

    Example:
        >>> model_outs = dict(
        ...     toy_loss_1=torch.tensor(1.0),
        ...     toy_predict=torch.tensor(2.0),
        ...     toy_Loss_2=torch.tensor(3.0),
        ... )
        >>> collector = collect_loss_by_regex('^.*loss.*')
        >>> collector(model_outs)
        [tensor(1.), tensor(3.)]
    """
    try:
        pattern = re.compile(loss_name_pattern, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"collect_loss_by_regex: {loss_name_pattern!r} is not a valid regex: {exc}.") from exc

    def collector(model_outs: Any) -> list:
        flat = to_flat_ordered_dict(model_outs)
        losses = []
        for key, value in flat.items():
            if value is None or not pattern.match(key):
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"collect_loss_by_regex({loss_name_pattern!r}): the model output {key!r} matches but is a "
                    f"{type(value).__name__}, not a tensor. Narrow the pattern."
                )
            losses.append(value)
        if not losses:
            raise ValueError(
                f"collect_loss_by_regex({loss_name_pattern!r}): no model output matches; the outputs "
                f"are {list(flat)}. Change the pattern (matched with re.match, ignoring case)."
            )
        return losses

    return collector
