"""`GradScale`: scale the gradients of chosen parameters (per task), then optionally clip, as HAT does.

In multitask training, turning one task's influence on a shared backbone down is often easier
with a gradient factor than with loss weights. Each ``(name, scale[, task_name])`` entry applies
to every parameter whose name (as ``model.named_parameters()`` gives it) *contains* ``name``, as
in HAT: ``("backbone", 0.1)`` scales ``backbone.conv.weight``, and ``("bias", 0.5)`` every bias.
Several matching entries multiply, one after the other.

How, as HAT's callback works:

* ``on_backward_end``: each gradient the backward just produced is multiplied by the scales of
  the entries that match it and apply to this (sub-)batch, then moved aside into an accumulator
  (``accumulator += grad``) and the parameter's ``.grad`` is zeroed. So exactly that backward's
  share is scaled, whatever was accumulated before it (``grad_accumulation_step > 1``, or a
  :class:`~hat_ignite.engine.MultiBatchProcessor` step with one batch per task).
* ``on_optimizer_step_begin``: the accumulated gradients are put back as ``.grad``; with
  ``clip_grad_norm``, ``grad_scaler.unscale_(optimizer)`` runs (a no-op without fp16 AMP) and the
  model's gradients are clipped to that total norm, once per update. The batch processor's own
  checks and clipping come after (see :mod:`hat_ignite.engine.processors.base`).

Between a backward and the optimizer update the parameters' ``.grad`` are therefore zeros; a
callback that reads gradients in ``on_backward_end`` must be placed before this one.

Tasks: an entry with a task name applies only to the (sub-)batches of that task, i.e. HAT's
``task in batch``: a ``(batch, task)`` pair of that task (what ``MultitaskLoader(return_task=True)``
yields), a dict batch holding the task name as a key (``{task_name: batch}``) or whose
``"task_name"`` value equals it; an entry without one (or ``None``) applies to every batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Sequence

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin

__all__ = ["GradScale"]

logger = logging.getLogger(__name__)


def _applies(task: str | None, batch: Any) -> bool:
    if not task:
        return True
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], str):  # a (batch, task) pair
        return batch[1] == task
    return isinstance(batch, Mapping) and (task in batch or batch.get("task_name") == task)


class GradScale(CallbackMixin):
    """Scale the gradients of parameters matched by name, per task, then optionally clip (module docs).

    Args:
        module_and_scale: entries ``(name, scale)`` or ``(name, scale, task_name)``; ``name`` is
            matched as a substring of the parameter names.
        clip_grad_norm: max total gradient norm, applied once per update after scaling;
            ``None``: no clipping.
        clip_norm_type: the norm's order for clipping (``2``; ``"inf"`` for the max norm).

    Example:
        >>> GradScale(module_and_scale=[("backbone", 0.1, "real3d_fov120"), ("bias", 0.5)], clip_grad_norm=35)
        GradScale(module_and_scale=[('backbone', 0.1, 'real3d_fov120'), ('bias', 0.5, None)], clip_grad_norm=35.0, clip_norm_type=2.0)
    """

    def __init__(
        self, module_and_scale: Sequence[Sequence[Any]], clip_grad_norm: float | None = None, clip_norm_type: float | str = 2
    ) -> None:
        if isinstance(module_and_scale, (str, Mapping)) or not isinstance(module_and_scale, (list, tuple)):
            raise TypeError(f"GradScale: module_and_scale must be a list of (module_name, scale[, task_name]), got {module_and_scale!r}.")
        entries: list[tuple[str, float, str | None]] = []
        for entry in module_and_scale:
            if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
                raise ValueError(f"GradScale: each entry must be (module_name, scale) or (module_name, scale, task_name), got {entry!r}.")
            name, scale, task = entry[0], entry[1], (entry[2] if len(entry) == 3 else None)
            if not isinstance(name, str) or (task is not None and not isinstance(task, str)):
                raise TypeError(f"GradScale: module and task names must be strings, got {entry!r}.")
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
                raise ValueError(f"GradScale: the scale of {name!r} must be a finite number, got {scale!r}.")
            entries.append((name, float(scale), task))
        if clip_grad_norm is not None and (
            isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, (int, float)) or not clip_grad_norm > 0
        ):
            raise ValueError(f"GradScale: clip_grad_norm must be a positive number or None, got {clip_grad_norm!r}.")
        if isinstance(clip_norm_type, str) and clip_norm_type.lower() == "inf":
            clip_norm_type = math.inf
        if isinstance(clip_norm_type, bool) or not isinstance(clip_norm_type, (int, float)) or not clip_norm_type > 0:
            raise ValueError(f"GradScale: clip_norm_type must be a positive number or 'inf', got {clip_norm_type!r}.")
        self.module_and_scale = entries
        self.clip_grad_norm = None if clip_grad_norm is None else float(clip_grad_norm)
        self.clip_norm_type = float(clip_norm_type)
        #: parameter name -> the gradient accumulated (and scaled) since the last update
        self._grad_cache: dict[str, torch.Tensor] = {}

    def on_loop_begin(self, model: nn.Module | None = None, **kwargs: Any) -> None:
        """Empty the accumulator; check each entry against the model's parameter names when given."""
        self._grad_cache = {}
        if model is None:  # called as HAT's tests call it, with no keywords
            logger.info("GradScale: %s", self.module_and_scale)
            return
        names = [n for n, _ in model.named_parameters()]
        for name, scale, task in self.module_and_scale:
            if not any(name in n for n in names):
                logger.warning(
                    "GradScale: the entry (%r, %s, %r) matches no parameter name of %s, so it scales "
                    "nothing; parameter names look like %r.", name, scale, task, type(model).__name__, names[:3],
                )
        logger.info("GradScale: %s", self.module_and_scale)
        self._grad_cache = {}

    @torch.no_grad()
    def on_backward_end(self, model: nn.Module, batch: Any, **kwargs: Any) -> None:
        """Scale this backward's gradients, entry by entry, and move them into the accumulator."""
        active = [(name, scale) for name, scale, task in self.module_and_scale if _applies(task, batch)]
        cache = self._grad_cache
        for pname, param in model.named_parameters():
            grad = param.grad
            if grad is None:
                continue
            for name, scale in active:
                if name in pname:
                    grad.mul_(scale)
            held = cache.get(pname)
            if held is None:
                cache[pname] = grad.clone()
            else:
                held.add_(grad)
            # zeroed, not cleared: DDP's reducer (and its bucket views) expects every gradient it
            # all-reduced to stay defined for the next backward
            grad.zero_()

    @torch.no_grad()
    def on_optimizer_step_begin(self, model: nn.Module, optimizer: Any, grad_scaler: Any = None, **kwargs: Any) -> None:
        """Put the accumulated gradients back, then clip them if asked (after ``unscale_``)."""
        cache = self._grad_cache
        for pname, param in model.named_parameters():
            held = cache.get(pname)
            if held is not None:
                param.grad = held
        self._grad_cache = {}
        if self.clip_grad_norm is not None:
            if grad_scaler is not None:
                grad_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=self.clip_grad_norm, norm_type=self.clip_norm_type)

    def __repr__(self) -> str:
        return (
            f"GradScale(module_and_scale={self.module_and_scale}, clip_grad_norm={self.clip_grad_norm}, "
            f"clip_norm_type={self.clip_norm_type})"
        )
