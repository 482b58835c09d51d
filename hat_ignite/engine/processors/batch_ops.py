"""Batch helpers of the processors: device moves, channels_last, AMP dtypes, transforms, losses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch

__all__ = ["move_to_device", "convert_channels_last", "resolve_amp_dtype", "total_loss", "compose", "compose_inverse", "as_model_args"]


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to ``device``, keeping the containers' types.

    >>> b = move_to_device({"x": [torch.ones(1)], "n": 3}, torch.device("cpu"))
    >>> b["x"][0].device, b["n"]
    (device(type='cpu'), 3)
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)((k, move_to_device(v, device)) for k, v in batch.items())  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def convert_channels_last(batch: Any, keys: Sequence[str] | None = None) -> Any:
    """Convert 4-D tensors of a batch to ``torch.channels_last``.

    Args:
        batch: a tensor or a nested dict/list/tuple.
        keys: convert only dict entries with these keys (at any depth); ``None`` converts every
            4-D tensor.

    >>> b = convert_channels_last({"img": torch.ones(1, 3, 4, 4), "mask": torch.ones(1, 2, 4, 4)}, ["img"])
    >>> b["img"].is_contiguous(memory_format=torch.channels_last), b["mask"].is_contiguous(memory_format=torch.channels_last)
    (True, False)
    """
    if isinstance(batch, torch.Tensor):
        if keys is None and batch.dim() == 4:
            return batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, Mapping):
        out = {}
        for k, v in batch.items():
            if keys is not None and k in keys and isinstance(v, torch.Tensor) and v.dim() == 4:
                out[k] = v.contiguous(memory_format=torch.channels_last)
            else:
                out[k] = convert_channels_last(v, keys)
        return type(batch)(out) if not isinstance(batch, dict) or type(batch) is not dict else out  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(convert_channels_last(v, keys) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(convert_channels_last(v, keys) for v in batch)
    return batch


def resolve_amp_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """Accept ``torch.float16``/``torch.bfloat16`` or their names as configs write them.

    >>> resolve_amp_dtype("bfloat16"), resolve_amp_dtype("torch.float16")
    (torch.bfloat16, torch.float16)
    """
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        dtype = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16}.get(name, dtype)
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"enable_amp_dtype must be torch.float16 or torch.bfloat16, got {dtype!r}.")
    return dtype


def as_model_args(batch: Any) -> tuple:
    return tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)


def compose(transforms: Any) -> Callable | None:
    if not transforms:
        return None
    if callable(transforms):
        return transforms
    funcs = list(transforms)

    def composed(batch: Any) -> Any:
        for f in funcs:
            batch = f(batch)
        return batch

    return composed


def total_loss(losses: Any) -> torch.Tensor | None:
    if losses.__class__ is list and len(losses) == 1:  # the common case: one loss, used as is
        t = losses[0]
        if isinstance(t, torch.Tensor):
            return t.sum() if t.dim() else t
    if isinstance(losses, torch.Tensor):
        return losses.sum() if losses.dim() else losses
    items = losses.values() if isinstance(losses, Mapping) else losses or ()
    total = None
    for t in items:
        if t is None:
            continue
        t = t.sum() if t.dim() else t
        total = t if total is None else total + t
    return total


def compose_inverse(transforms: Any) -> Callable | None:
    if not transforms:
        return None
    if callable(transforms):
        return transforms
    funcs = list(transforms)

    def composed(model_outs: Any, batch: Any) -> Any:
        for f in funcs:
            model_outs = f(model_outs, batch)
        return model_outs

    return composed
