"""`MultiBatchProcessor`: several batches forwarded and backwarded within one step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hat_ignite.engine.processors.base import BatchProcessorMixin

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["MultiBatchProcessor"]


class MultiBatchProcessor(BatchProcessorMixin):
    """Forward/backward several batches, then update once: one step, many batches.

    A **tuple** batch holds several batches (``(batch_task1, batch_task2, ...)``, e.g. one per
    task of a multitask model, or several chunks of a batch too big for memory); anything else
    (a dict, a list, a tensor) is one batch. A sub-batch that is a ``(batch, task_name)`` pair
    (``MultitaskLoader(return_task=True)``) is passed to the model as ``model(batch, task_name)``,
    and the batch transforms apply to its ``batch`` only. For each batch the processor fires ``BATCH_BEGIN``,
    ``FORWARD_BEGIN``, ``FORWARD_END``, ``BACKWARD_BEGIN`` and ``BACKWARD_END`` (training) and
    ``BATCH_END`` with ``batch_idx``; the gradients are zeroed before the first batch and the
    optimizer steps once after the last batch's ``BATCH_END`` (``OPTIMIZER_STEP_BEGIN`` first),
    as in HAT. Returns the list of each batch's outputs for a tuple batch, else the single
    batch's outputs.

    Args:
        need_grad_update: see :class:`BasicBatchProcessor`.
        batch_transforms: see :class:`BasicBatchProcessor` (applied to each batch).
        inverse_transforms: see :class:`BasicBatchProcessor`.
        loss_collector: see :class:`BasicBatchProcessor`.
        enable_amp: see :class:`BasicBatchProcessor`.
        enable_amp_dtype: see :class:`BasicBatchProcessor`.
        enable_apex: not supported; ``True`` raises an error naming the native AMP options.
        enable_channels_last: see :class:`BasicBatchProcessor`.
        channels_last_keys: see :class:`BasicBatchProcessor`.
        delay_sync: under DDP, backward all but the last batch of a step inside
            ``model.no_sync()`` so gradients are all-reduced once per step.
        empty_cache: call ``torch.cuda.empty_cache()`` after each batch and after the step.
        grad_scaler: see :class:`BasicBatchProcessor`.
        grad_accumulation_step: update every this many steps (an int, or its digits as a
            string); gradients are not synchronised on the steps in between.
        check_finite_loss: see :class:`BasicBatchProcessor`.
        nonfinite_policy: see :class:`BasicBatchProcessor`.
        check_finite_grad: see :class:`BasicBatchProcessor`.
        clip_grad_norm: see :class:`BasicBatchProcessor` (clips once per update, after the
            step's last batch).
        clip_norm_type: see :class:`BasicBatchProcessor`.
        clip_grad_value: see :class:`BasicBatchProcessor`.
    """

    splits_tuple_batches = True

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
        delay_sync: bool = False,
        empty_cache: bool = False,
        grad_scaler: Any = None,
        grad_accumulation_step: int | str = 1,
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
        self.delay_sync = delay_sync
        self.empty_cache = empty_cache

    def _prepare_batch(self, engine: LoopBase, batch: Any) -> Any:
        """As the base class, but a ``(batch, task)`` pair keeps its task name: the batch
        transforms see the batch alone, as in HAT."""
        if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], str):
            return (super()._prepare_batch(engine, batch[0]), batch[1])
        return super()._prepare_batch(engine, batch)

    def _transform_batch(self, batch: Any) -> Any:
        if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], str):  # (batch, task)
            return (super()._transform_batch(batch[0]), batch[1])
        return super()._transform_batch(batch)

    def _maybe_empty_cache(self, engine: LoopBase) -> None:
        if self.empty_cache and engine.torch_device.type == "cuda":
            torch.cuda.empty_cache()

    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        batches = batch if isinstance(batch, tuple) else (batch,)
        last = len(batches) - 1
        if self.need_grad_update:
            divisor, step_now, _ = self._begin_step(engine)  # zeroes before the first BATCH_BEGIN, as HAT
        else:
            divisor, step_now = 1, False
        outputs = []
        for idx, sub_batch in enumerate(batches):
            # Gradients are synchronised on the backward that ends the step's update; with
            # delay_sync on, also never before the step's last batch.
            sync = step_now and (idx == last or not self.delay_sync)
            outputs.append(self._run_batch(engine, sub_batch, idx, divisor, sync, False))
            self._maybe_empty_cache(engine)
        if self.need_grad_update and step_now:
            self._optimizer_step(engine)
        self._maybe_empty_cache(engine)
        return outputs if isinstance(batch, tuple) else outputs[0]
