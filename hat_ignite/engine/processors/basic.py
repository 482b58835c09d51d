"""`BasicBatchProcessor`: one batch per step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hat_ignite.engine.processors.base import BatchProcessorMixin

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["BasicBatchProcessor"]


class BasicBatchProcessor(BatchProcessorMixin):
    """Forward, backward and update one batch per step.

    A list/tuple batch is unpacked into the model call (``model(*batch)``); any other batch (a
    dict, a tensor) is passed whole. Suitable for training (``need_grad_update=True``) and for
    validation/prediction (``False``: no gradients, no update).

    Args:
        need_grad_update: whether to backward and update (training) or not (evaluation).
        batch_transforms: a callable or list of callables applied to the batch (after the device
            move, before the forward).
        inverse_transforms: a callable (or list) ``f(model_outs, batch) -> model_outs`` applied
            to the outputs.
        loss_collector: picks the loss tensors out of the model outputs (required for training),
            e.g. :func:`collect_loss_by_index` or :func:`collect_loss_by_regex`.
        enable_amp: run the forward under ``torch.autocast``.
        enable_amp_dtype: ``torch.float16`` (a ``GradScaler`` is created unless one is given)
            or ``torch.bfloat16`` (no scaler; works on the CPU too).
        enable_apex: not supported; ``True`` raises an error naming the native AMP options.
        enable_channels_last: convert 4-D batch tensors to ``torch.channels_last``.
        channels_last_keys: convert only these dict keys; ``None`` converts every 4-D tensor.
        grad_scaler: a ``torch.amp.GradScaler`` to use for fp16 training.
        grad_accumulation_step: update the parameters every this many steps, averaging the
            losses of the group; the last, incomplete group of an epoch is applied too.
        check_finite_loss: raise :class:`~hat_ignite.errors.NonFiniteLossError` before the
            update when the loss is NaN/Inf (reads the loss value each training step).
        nonfinite_policy: what a NaN/Inf loss or gradient does: ``"raise"`` (stop before the
            update, naming epoch, step and loss keys or parameters) or ``"skip"`` (drop that
            step's update, count it in ``engine.state.nonfinite_skipped``, log it, go on).
        check_finite_grad: also check the gradients before each optimizer step (not while an
            enabled ``GradScaler`` handles fp16 overflow, which is normal, not an error);
            ``check_finite_loss=False`` turns this check off too.
        clip_grad_norm: clip the total gradient norm to this value right before each optimizer
            step (after the last accumulated backward, after ``GradScaler.unscale_``); ``None``: off.
        clip_norm_type: order of that norm (``2.0``; ``"inf"`` for the largest entry).
        clip_grad_value: clamp every gradient entry to ``[-v, v]``, or to ``[lower, upper]`` for a
            pair, before the norm clipping; ``None``: off.
    """

    def __init__(
        self,
        need_grad_update: bool,
        batch_transforms: Sequence[Callable] | Callable | None = None,
        inverse_transforms: Sequence[Callable] | Callable | None = None,
        loss_collector: Callable | None = None,
        enable_amp: bool = False,
        enable_amp_dtype: torch.dtype | str = torch.float16,
        enable_apex: bool = False,
        enable_channels_last: bool = False,
        channels_last_keys: Sequence[str] | None = None,
        grad_scaler: Any = None,
        grad_accumulation_step: int = 1,
        check_finite_loss: bool = True,
        nonfinite_policy: str = "raise",
        check_finite_grad: bool = True,
        clip_grad_norm: float | None = None,
        clip_norm_type: float | str = 2.0,
        clip_grad_value: float | tuple[float, float] | None = None,
    ) -> None:
        self._setup(
            need_grad_update, batch_transforms, inverse_transforms, loss_collector, enable_amp,
            enable_amp_dtype, enable_apex, enable_channels_last, channels_last_keys, grad_scaler,
            grad_accumulation_step, check_finite_loss,
            nonfinite_policy=nonfinite_policy, check_finite_grad=check_finite_grad,
            clip_grad_norm=clip_grad_norm, clip_norm_type=clip_norm_type, clip_grad_value=clip_grad_value,
        )

    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        # As in HAT, the gradients are zeroed after BATCH_BEGIN (inside _run_batch), so
        # on_batch_begin still sees the previous update's gradients.
        if not self.need_grad_update:
            return self._run_batch(engine, batch, 0, 1, True, False)
        if self.grad_accumulation_step == 1 and not self._wants_scaler:
            # _begin_step's common case written out: one call less in every training step
            engine.state.grad_pending_steps = 0
            return self._run_batch(engine, batch, 0, 1, True, True, True)
        divisor, step_now, starts_group = self._begin_step(engine, zero_now=False)
        return self._run_batch(engine, batch, 0, divisor, step_now, step_now, starts_group)
