"""The values a TensorBoard point holds: losses found in ``model_outs``, numbers, update-function keywords."""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Sequence

import torch

from hat_ignite.engine.processors.loss_collectors import flatten_outputs

__all__ = ["call_style", "loss_scalars", "scalar_number"]


def scalar_number(value: Any) -> float | None:
    """``value`` as a float (a tensor is summed), or ``None`` when it is not a real number."""
    if isinstance(value, torch.Tensor):
        if not value.numel() or value.is_complex():
            return None
        if not value.dim():  # a scalar loss: one read instead of three tensor ops
            return float(value.item())
        return float(value.detach().float().sum())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _short_names(keys: Sequence[str]) -> list[str]:
    """Keys without their numeric parts (``0.cls_loss`` -> ``cls_loss``) where that stays unique."""
    short = [".".join(p for p in k.split(".") if not p.isdigit()) or k for k in keys]
    return [s if short.count(s) == 1 else k for s, k in zip(short, keys)]


def loss_scalars(model_outs: Any, pattern: re.Pattern[str]) -> dict[str, torch.Tensor]:
    """The losses in ``model_outs`` whose flattened key (or its last part) matches ``pattern``.

    Returns:
        ``{tag name: tensor}`` (tensors as they are, nothing is read from the device).

    >>> outs = ({"cls_loss": torch.tensor(0.5), "reg_loss": torch.tensor(0.25)}, torch.zeros(2, 3))
    >>> sorted(loss_scalars(outs, re.compile("^.*loss.*")))
    ['cls_loss', 'reg_loss']
    >>> list(loss_scalars({"a": {"loss": torch.tensor(1.0)}, "b": {"loss": torch.tensor(2.0)}}, re.compile("loss$")))
    ['a.loss', 'b.loss']
    """
    found = [
        (key, value) for key, value in flatten_outputs(model_outs).items()
        if isinstance(value, torch.Tensor) and key and (pattern.match(key) or pattern.match(key.rsplit(".", 1)[-1]))
    ]
    return dict(zip(_short_names([k for k, _ in found]), (v for _, v in found)))


def call_style(func: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names ``func`` takes, or ``None`` when it takes ``**kwargs`` (gets all)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: pass everything
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
