"""Gradient clipping of the batch processors, applied once per optimizer step.

:class:`GradClipper` is built from the processors' ``clip_grad_norm`` / ``clip_norm_type`` /
``clip_grad_value`` arguments (names as :class:`~hat_ignite.callbacks.GradScale` spells them;
``clip_grad_value`` also takes ClsTrainer's ``(lower, upper)`` pair). The processor calls it
right before the optimizer update:

* after the last backward of the step (with ``grad_accumulation_step > 1`` or several batches
  per step, the whole accumulated gradient is clipped, once);
* after ``GradScaler.unscale_(optimizer)`` when an enabled scaler runs fp16 training, so the
  threshold applies to the true gradient; the scaler's ``step`` then knows the gradients are
  already unscaled and still skips a step whose gradients overflowed;
* over every parameter of the optimizer's param groups that has a gradient;
* by value first, then by norm, when both are given.

The total norm before clipping (a tensor, not read back, so no device sync) is left in
``engine.state.grad_norm`` for loggers.

>>> import torch
>>> p = torch.nn.Parameter(torch.zeros(2))
>>> p.grad = torch.tensor([3.0, 4.0])
>>> opt = torch.optim.SGD([p], lr=0.1)
>>> float(GradClipper(clip_grad_norm=1.0)(opt, None))  # the norm before clipping
5.0
>>> p.grad
tensor([0.6000, 0.8000])
>>> p.grad = torch.tensor([-3.0, 0.2])
>>> _ = GradClipper(clip_grad_value=(-0.1, 0.5))(opt, None)
>>> p.grad
tensor([-0.1000,  0.2000])
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

__all__ = ["GradClipper", "build_grad_clipper"]


def _unscaled(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` already ran for this update (a hook such as HAT's
    ``GradScale`` may unscale in ``on_optimizer_step_begin``); a second call would raise."""
    states = getattr(scaler, "_per_optimizer_states", None)
    if not isinstance(states, dict) or id(optimizer) not in states:
        return False
    return states[id(optimizer)].get("stage") is OptState.UNSCALED


def _number(value: Any, what: str, owner: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{owner}: {what} must be a positive finite number, got {value!r}.")
    return float(value)


class GradClipper:
    """Clip an optimizer's gradients by value and/or by total norm (see the module docstring).

    Args:
        clip_grad_norm: maximum total norm (``torch.nn.utils.clip_grad_norm_``'s ``max_norm``);
            ``None``: no norm clipping.
        clip_norm_type: the norm's order (``2.0``; ``float("inf")`` or ``"inf"`` for the max norm).
        clip_grad_value: clamp each gradient entry to ``[-v, v]`` (``clip_grad_value_``), or to
            ``[lower, upper]`` for a pair; ``None``: no value clipping.
        owner: the name used in error messages.
    """

    def __init__(
        self,
        clip_grad_norm: float | None = None,
        clip_norm_type: float | str = 2.0,
        clip_grad_value: float | tuple[float, float] | None = None,
        owner: str = "GradClipper",
    ) -> None:
        self.max_norm = None if clip_grad_norm is None else _number(clip_grad_norm, "clip_grad_norm", owner)
        if isinstance(clip_norm_type, str) and clip_norm_type.lower() == "inf":
            clip_norm_type = math.inf
        if isinstance(clip_norm_type, bool) or not isinstance(clip_norm_type, (int, float)) or clip_norm_type <= 0:
            raise ValueError(f"{owner}: clip_norm_type must be a positive number or 'inf', got {clip_norm_type!r}.")
        self.norm_type = float(clip_norm_type)
        self.bounds: tuple[float, float] | None = None
        if clip_grad_value is not None:
            if isinstance(clip_grad_value, (list, tuple)):
                if len(clip_grad_value) != 2 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in clip_grad_value
                ) or clip_grad_value[0] >= clip_grad_value[1]:
                    raise ValueError(
                        f"{owner}: clip_grad_value as a pair must be (lower, upper) with lower < upper, "
                        f"got {clip_grad_value!r}."
                    )
                self.bounds = (float(clip_grad_value[0]), float(clip_grad_value[1]))
            else:
                v = _number(clip_grad_value, "clip_grad_value", owner)
                self.bounds = (-v, v)

    def __call__(self, optimizer: torch.optim.Optimizer, scaler: Any) -> torch.Tensor | None:
        """Unscale (if ``scaler`` is enabled), then clip; return the total norm before clipping."""
        if scaler is not None and scaler.is_enabled() and not _unscaled(scaler, optimizer):
            scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if self.bounds is not None:
            lower, upper = self.bounds
            if lower == -upper:
                torch.nn.utils.clip_grad_value_(params, upper)
            else:
                with torch.no_grad():
                    for p in params:
                        p.grad.clamp_(lower, upper)
        if self.max_norm is None:
            return None
        return torch.nn.utils.clip_grad_norm_(params, self.max_norm, norm_type=self.norm_type)

    def __repr__(self) -> str:
        return f"GradClipper(clip_grad_norm={self.max_norm}, clip_norm_type={self.norm_type}, clip_grad_value={self.bounds})"


def build_grad_clipper(
    clip_grad_norm: float | None, clip_norm_type: float | str, clip_grad_value: Any, owner: str
) -> GradClipper | None:
    """A :class:`GradClipper`, or ``None`` when neither a norm nor a value limit is given.

    >>> build_grad_clipper(None, 2, None, "BasicBatchProcessor") is None
    True
    """
    if clip_grad_norm is None and clip_grad_value is None:
        GradClipper(None, clip_norm_type, None, owner)  # still check clip_norm_type
        return None
    return GradClipper(clip_grad_norm, clip_norm_type, clip_grad_value, owner)
