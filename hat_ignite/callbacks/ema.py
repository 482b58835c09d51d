"""`ExponentialMovingAverage`: an exponential moving average of the model's weights (HAT's EMA).

The rule, as HAT (and YOLOv5's ``ModelEMA``) writes it: after the ``t``-th optimizer update
(``t = 1, 2, ...``) every parameter ``e`` of the EMA copy moves towards the model's ``p`` by

.. math::

    d_t = \\text{decay} \\cdot (1 - e^{-t / \\text{decay\\_base}}), \\qquad
    e \\leftarrow d_t \\, e + (1 - d_t) \\, p

so early in training (``d_t`` near 0) the average follows the model closely and it settles
into a slow average (``d_t -> decay``) after a few ``decay_base`` updates. The arithmetic is
HAT's, operation for operation (``e *= d_t``, then ``e += (1 - d_t) * p``, in the tensors'
dtype), so the average equals HAT's bit for bit, not just to rounding (a ``lerp`` form of the
same rule drifts from it by a few float32 ulps within tens of updates). Floating-point buffers
(BatchNorm running statistics) are averaged the same way by default, as HAT does, and integer
buffers (counters) copied from the model; ``handle_buffers="copy"`` copies every buffer instead.

When: once per real optimizer update. The callback counts the optimizer's own ``step()`` calls
(``Optimizer.register_step_post_hook``), so with ``grad_accumulation_step > 1`` the steps that
only accumulate gradients do not move the average, nor does an update a ``GradScaler`` skipped
on fp16 overflow or a batch processor dropped (``nonfinite_policy="skip"``). The average is
updated on ``on_step_end`` (and on ``on_epoch_end`` for the update that closes an incomplete
accumulation group), so a callback placed after this one in the list sees the new average.

Where: at ``on_loop_begin`` the callback deep-copies the (unwrapped) model, puts the copy in
eval mode without gradients and sets ``loop.ema_model`` to it. HAT's hooks then receive it as
``ema_model``: :class:`~hat_ignite.callbacks.validation.Validation` validates it instead of the
train model whenever it exists (as in HAT), :class:`~hat_ignite.callbacks.checkpoint.Checkpoint`
saves its weights as ``"ema_state_dict"`` (and uses them for the ``best`` file), and
:attr:`ExponentialMovingAverage.ema_model` gives it to export code after ``fit()``.

Checkpoints: the weights travel in the checkpoint's ``"ema_state_dict"``; the callback's own
:meth:`~ExponentialMovingAverage.state_dict` holds the update count ``t`` (saved under
``"callbacks"``). A resumed run loads the count with the other callback states and, at loop
begin, takes the weights from ``loop.checkpoint["ema_state_dict"]``, so the average continues
exactly where it stopped.

Why not Ignite's ``EMAHandler``: its ``momentum`` is the weight of the live model (HAT's
``1 - d_t``) with a linear, stateful warm-up; HAT's ramp would need the momentum rewritten
before every update, the handler updates on every iteration event rather than on optimizer
updates (wrong under gradient accumulation), and it does not unwrap ``DataParallel``. What is
left of it — a ``torch._foreach`` update over matching tensors — is the few lines below.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.checkpoint.payload import unwrap_model
from hat_ignite.errors import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["ExponentialMovingAverage"]

logger = logging.getLogger(__name__)

_BUFFER_MODES = ("copy", "ema")


def _mismatch(kind: str, ema_names: set[str], model_names: set[str]) -> ValueError:
    missing = sorted(model_names - ema_names)[:5]
    extra = sorted(ema_names - model_names)[:5]
    return ValueError(
        f"ExponentialMovingAverage: the model's {kind} no longer match the EMA copy made at loop "
        f"begin (only in the model: {missing}; only in the EMA copy: {extra}). Something changed the "
        f"model's structure during training; change loop.ema_model the same way (FuseBN does), or "
        f"make the structural change before the loop starts."
    )


class ExponentialMovingAverage(CallbackMixin):
    """Keep an exponential moving average of the model (rule, timing and storage: module docs).

    Args:
        decay: the decay the ramp approaches (HAT's default ``0.9999``); in ``[0, 1)``.
        decay_base: the ramp's time constant in optimizer updates (default ``2000``); after
            ``decay_base`` updates the decay is ``63 %`` of ``decay``.
        handle_buffers: ``"ema"`` (HAT's: floating-point buffers are averaged like the
            parameters, integer ones copied) or ``"copy"`` (buffers follow the model).

    Place it before the callbacks that use ``ema_model`` at step end (step-interval
    ``Validation`` or ``Checkpoint``).

    Example:
        >>> ema = ExponentialMovingAverage(decay=0.9999, decay_base=2000)
        >>> round(ema.decay_at(2000), 6)  # 0.9999 * (1 - 1/e)
        0.632057
        >>> ema.state_dict()
        {'updates': 0}
    """

    def __init__(self, decay: float = 0.9999, decay_base: float = 2000, handle_buffers: str = "ema") -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise ValueError(f"ExponentialMovingAverage: decay must be a number in [0, 1), got {decay!r}.")
        if isinstance(decay_base, bool) or not isinstance(decay_base, (int, float)) or not decay_base > 0:
            raise ValueError(f"ExponentialMovingAverage: decay_base must be a positive number of updates, got {decay_base!r}.")
        if handle_buffers not in _BUFFER_MODES:
            raise ValueError(f"ExponentialMovingAverage: handle_buffers must be 'copy' or 'ema', got {handle_buffers!r}.")
        self.decay = float(decay)
        self.decay_base = float(decay_base)
        self.handle_buffers = handle_buffers
        #: Optimizer updates averaged so far (``t`` of the rule); saved in checkpoints.
        self.updates = 0
        self._ema: nn.Module | None = None
        self._hook: Any = None
        #: no optimizer to watch (HAT-style calls): average on every step end, as HAT does
        self._every_step = False
        self._stepped = False
        self._loaded_checkpoint: int | None = None

    # -- the rule ---------------------------------------------------------------------------
    def decay_at(self, updates: int) -> float:
        """The decay ``d_t`` used for the ``updates``-th update."""
        return self.decay * (1.0 - math.exp(-updates / self.decay_base))

    @property
    def ema_model(self) -> nn.Module | None:
        """The averaged model (``None`` before the first ``on_loop_begin``); for export or eval."""
        return self._ema

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Average ``model`` (a DDP/DataParallel wrapper is looked through) into the EMA copy now."""
        if self._ema is None:
            raise RuntimeError(
                "ExponentialMovingAverage.update() was called before on_loop_begin made the EMA copy; "
                "attach the callback to a Trainer (or call on_loop_begin) first."
            )
        source = unwrap_model(model)
        self.updates += 1
        d = self.decay_at(self.updates)
        mine = dict(self._ema.named_parameters())
        theirs = dict(source.named_parameters())
        if mine.keys() != theirs.keys():
            raise _mismatch("parameters", set(mine), set(theirs))
        my_buffers = dict(self._ema.named_buffers())
        their_buffers = dict(source.named_buffers())
        if my_buffers.keys() != their_buffers.keys():
            raise _mismatch("buffers", set(my_buffers), set(their_buffers))
        averaged: list[tuple[torch.Tensor, torch.Tensor]]
        averaged = [(mine[n], theirs[n]) for n in mine if mine[n].is_floating_point()]
        for name, buf in my_buffers.items():
            if self.handle_buffers == "ema" and buf.is_floating_point():
                averaged.append((buf, their_buffers[name]))
            else:
                buf.copy_(their_buffers[name])
        if averaged:
            ema_tensors = [e for e, _ in averaged]
            # HAT's two operations: e *= d, then e += (1 - d) * p (one rounding each, as HAT's)
            torch._foreach_mul_(ema_tensors, d)
            torch._foreach_add_(ema_tensors, torch._foreach_mul([p.detach() for _, p in averaged], 1.0 - d))

    # -- hooks ------------------------------------------------------------------------------
    def _mark_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True

    def on_loop_begin(self, loop: LoopBase, model: nn.Module, optimizer: Any = None, **kwargs: Any) -> None:
        """Make the EMA copy, set ``loop.ema_model``, and watch the optimizer's updates.

        Called as HAT's own loop calls it (``loop`` and ``model``, no ``optimizer``), the
        loop's ``optimizer`` attribute is watched; with no optimizer at all the average moves
        on every ``on_step_end`` that passes the model, as HAT's does.
        """
        if self._ema is None or getattr(loop, "ema_model", None) is not self._ema:
            ema = copy.deepcopy(unwrap_model(model))
            ema.eval()
            ema.requires_grad_(False)
            self._ema = ema
        self._load_from_checkpoint(getattr(loop, "checkpoint", None))
        loop.ema_model = self._ema
        self._remove_hook()
        if optimizer is None:
            optimizer = getattr(loop, "optimizer", None)
        self._stepped = False
        self._every_step = optimizer is None
        if optimizer is None:
            logger.warning("ExponentialMovingAverage: no optimizer to watch; the average moves on every step end.")
            return
        self._hook = optimizer.register_step_post_hook(self._mark_step)

    def _load_from_checkpoint(self, checkpoint: Any) -> None:
        if not isinstance(checkpoint, Mapping) or checkpoint.get("ema_state_dict") is None:
            return
        if self._loaded_checkpoint == id(checkpoint):
            return  # a later fit() of the same loop continues its own average
        assert self._ema is not None
        try:
            self._ema.load_state_dict(checkpoint["ema_state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(
                f"ExponentialMovingAverage: the checkpoint's ema_state_dict does not fit "
                f"{type(self._ema).__name__} ({exc}). Resume with the model that wrote the checkpoint."
            ) from exc
        self._loaded_checkpoint = id(checkpoint)
        logger.info("ExponentialMovingAverage: EMA weights restored from the checkpoint (%d updates).", self.updates)

    def on_step_end(self, global_step_id: int | None = None, model: nn.Module | None = None, **kwargs: Any) -> None:
        """Average the model in when the optimizer updated it during this step.

        HAT calls this hook with the step id first (``on_step_end(0, model=...)``); without a
        ``model``, or before any ``on_loop_begin``, there is nothing to average (as in HAT).
        """
        if model is None or self._ema is None:
            return
        if self._stepped or self._every_step:
            self._stepped = False
            self.update(model)

    def on_epoch_end(self, model: nn.Module, **kwargs: Any) -> None:
        if self._stepped:  # the update that closed an incomplete accumulation group
            self._stepped = False
            self.update(model)

    def on_loop_end(self, **kwargs: Any) -> None:
        self._remove_hook()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"updates": t}``: the weights themselves are the checkpoint's ``ema_state_dict``."""
        return {"updates": int(self.updates)}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the update count saved by :meth:`state_dict`."""
        updates = state_dict["updates"]
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise ValueError(f"ExponentialMovingAverage: a saved update count must be an integer >= 0, got {updates!r}.")
        self.updates = updates

    def __repr__(self) -> str:
        return (
            f"ExponentialMovingAverage(decay={self.decay}, decay_base={self.decay_base}, "
            f"handle_buffers={self.handle_buffers!r}, updates={self.updates})"
        )
