"""`GradScale`: scale the gradients of chosen sub-modules (per task), optionally clip, after backward.

In multitask training, turning one task's influence on a shared backbone down is often easier
with a gradient factor than with loss weights. For each ``(module_name, scale[, task_name])``
entry, ``on_backward_end`` multiplies by ``scale`` the gradient that the backward just computed
for the parameters of ``module_name`` (a dotted sub-module path; nested entries multiply).

Exactly that backward's share is scaled: when gradients were already accumulated before it
(``grad_accumulation_step > 1``, or a :class:`~hat_ignite.engine.MultiBatchProcessor` step
with several batches), the earlier part is kept aside at ``on_batch_begin`` and left as it was,
so a task's scale never touches another task's gradient. A ``GradScaler``'s loss scale does not
matter (scaling is linear).

Tasks: an entry with a task name applies only to the (sub-)batches of that task, i.e. dict
batches holding the task name as a key (HAT's multitask loaders yield ``{task_name: batch}``)
or whose ``"task_name"`` value equals it; an entry without one (or ``None``) applies to every
batch.

Clipping: with ``clip_grad_norm``, after scaling, the gradients of all of the model's
parameters are clipped to that total norm (``torch.nn.utils.clip_grad_norm_`` with
``clip_norm_type``), as HAT does, after every backward. Under an enabled fp16 ``GradScaler`` the
gradients are still multiplied by the loss scale at that point, so the limit is multiplied by
it too (the same as unscale, clip, rescale). With several backwards per update this clips each
partial sum; to clip the whole update once, use the batch processor's ``clip_grad_norm``
instead (:mod:`hat_ignite.engine.processors.grad_clip`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Sequence

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.checkpoint_payload import unwrap_model
from hat_ignite.callbacks.module_schedule import get_submodule

__all__ = ["GradScale"]


def _applies(task: str | None, batch: Any) -> bool:
    if task is None:
        return True
    return isinstance(batch, Mapping) and (task in batch or batch.get("task_name") == task)


class GradScale(CallbackMixin):
    """Scale named sub-modules' gradients after each backward, then optionally clip (module docs).

    Args:
        module_and_scale: entries ``(module_name, scale)`` or ``(module_name, scale, task_name)``.
        clip_grad_norm: max total gradient norm after scaling; ``None``: no clipping.
        clip_norm_type: the norm's order for clipping (``2``; ``"inf"`` for the max norm).

    Example:
        >>> GradScale(module_and_scale=[("backbone", 0.1, "real3d_fov120"), ("head", 1.0)], clip_grad_norm=35)
        GradScale(module_and_scale=[('backbone', 0.1, 'real3d_fov120'), ('head', 1.0, None)], clip_grad_norm=35.0, clip_norm_type=2.0)
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
        self._before: dict[int, torch.Tensor] = {}  # id(param) -> gradient accumulated before this backward

    def _params(self, model: nn.Module, name: str) -> list[nn.Parameter]:
        return list(get_submodule(unwrap_model(model), name, "GradScale").parameters())

    def on_loop_begin(self, model: nn.Module, **kwargs: Any) -> None:
        for name, _, _ in self.module_and_scale:
            get_submodule(unwrap_model(model), name, "GradScale")
        self._before = {}

    def on_batch_begin(self, loop: Any, batch: Any, **kwargs: Any) -> None:
        self._before = {}
        for name, scale, task in self.module_and_scale:
            if scale != 1.0 and _applies(task, batch):
                for p in self._params(loop.model, name):
                    if p.grad is not None and id(p) not in self._before:
                        self._before[id(p)] = p.grad.detach().clone()

    @torch.no_grad()
    def on_backward_end(self, model: nn.Module, batch: Any, optimizer: Any, grad_scaler: Any = None, **kwargs: Any) -> None:
        """Scale this backward's gradients of each matching entry, then clip if asked."""
        for name, scale, task in self.module_and_scale:
            if scale == 1.0 or not _applies(task, batch):
                continue
            for p in self._params(model, name):
                if p.grad is None:
                    continue
                before = self._before.get(id(p))
                if before is None:
                    p.grad.mul_(scale)
                else:  # keep what earlier backwards accumulated: before + scale * (grad - before)
                    p.grad.sub_(before).mul_(scale).add_(before)
        self._before = {}
        if self.clip_grad_norm is not None:
            limit = self.clip_grad_norm
            if grad_scaler is not None and grad_scaler.is_enabled():
                limit *= float(grad_scaler.get_scale())
            params = [p for p in unwrap_model(model).parameters() if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, limit, norm_type=self.clip_norm_type)

    def __repr__(self) -> str:
        return (
            f"GradScale(module_and_scale={self.module_and_scale}, clip_grad_norm={self.clip_grad_norm}, "
            f"clip_norm_type={self.clip_norm_type})"
        )
