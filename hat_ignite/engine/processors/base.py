"""What every batch processor shares: the interface and the one-batch step (helpers: batch_ops).

The order of one training batch, top to bottom in :meth:`BatchProcessorMixin._run_batch`::

    BATCH_BEGIN -> [zero the gradients: BasicBatchProcessor, when an accumulation group starts]
    -> device move -> batch transforms -> channels_last -> FORWARD_BEGIN -> autocast forward
    -> inverse transforms -> FORWARD_END -> collect losses -> finite check
    -> loss / accumulation group size -> BACKWARD_BEGIN -> (scaled) backward; forward and
       backward run under no_sync when this backward does not end a sync group (DDP decides in
       the forward whether the backward all-reduces)
    -> BACKWARD_END -> [optimizer step, when the processor steps per batch] -> BATCH_END

A MultiBatchProcessor zeroes the gradients before its first batch's ``BATCH_BEGIN`` and steps
after its last batch's ``BATCH_END``. Both places are HAT's: so ``on_batch_begin`` of a
BasicBatchProcessor step still sees the previous update's gradients.

The optimizer step (:meth:`BatchProcessorMixin._optimizer_step`), once per update::

    OPTIMIZER_STEP_BEGIN -> finite check -> [GradScaler.unscale_ + clip by value / norm]
    -> (scaler) step [-> read the finite flags of earlier updates: fused optimizers]

With a fused optimizer the finite check sets a flag on the device the optimizer skips itself on,
and the flag is read a step or more later (nonfinite_device.py); otherwise it reads the flag now.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hat_ignite.engine.dispatch import fire_hat_event
from hat_ignite.engine.events import HatEvents
from hat_ignite.engine.processors.batch_ops import (
    as_model_args,
    compose,
    compose_inverse,
    convert_channels_last,
    move_to_device,
    resolve_amp_dtype,
    total_loss,
)
from hat_ignite.engine.processors.batch_check import MODEL_ERRORS, batch_failure, batch_spec, passes_through
from hat_ignite.engine.processors.grad_clip import build_grad_clipper
from hat_ignite.engine.processors.nonfinite import NonFiniteGuard

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["BatchProcessorMixin", "move_to_device", "convert_channels_last", "resolve_amp_dtype"]

_NULL = contextlib.nullcontext()
_BATCH_BEGIN, _FORWARD_BEGIN, _FORWARD_END, _BACKWARD_BEGIN, _BACKWARD_END, _OPTIMIZER_STEP_BEGIN, _BATCH_END = (
    event.hat_index
    for event in (
        HatEvents.BATCH_BEGIN, HatEvents.FORWARD_BEGIN, HatEvents.FORWARD_END, HatEvents.BACKWARD_BEGIN,
        HatEvents.BACKWARD_END, HatEvents.OPTIMIZER_STEP_BEGIN, HatEvents.BATCH_END,
    )
)


class BatchProcessorMixin(ABC):
    """The batch processor interface: ``processor(engine, batch) -> model_outs``.

    A processor is the process function of a hat-ignite engine: it reads the model, optimizer and
    device from the engine, fires the per-batch HAT events, and returns the model outputs (which
    Ignite stores as ``engine.state.output``).
    """

    need_grad_update: bool
    grad_scaler: Any
    #: Whether a tuple batch is several batches, each given to the model on its own (MultiBatchProcessor).
    splits_tuple_batches = False

    @abstractmethod
    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        """Process one step's batch on ``engine``; return the model outputs."""

    def model_batches(self, batch: Any) -> list[Any]:
        """The batches one step of ``batch`` gives the model, each as the model receives it.

        A step of a :class:`MultiBatchProcessor` with a tuple batch gives one per item, any other
        step one. Each has the batch transforms and ``channels_last`` applied, as in a step, but
        stays where it is (no device move). Converters trace the model with them (see
        :func:`hat_ignite.quantization.capture.stage_examples`).

        >>> from hat_ignite.engine.processors import MultiBatchProcessor
        >>> proc = MultiBatchProcessor(need_grad_update=False, batch_transforms=[lambda b: b * 2])
        >>> [t.tolist() for t in proc.model_batches((torch.ones(1), torch.zeros(1)))]
        [[2.0], [0.0]]
        """
        batches = list(batch) if self.splits_tuple_batches and isinstance(batch, tuple) else [batch]
        return [self._transform_batch(one) for one in batches]

    def _transform_batch(self, batch: Any) -> Any:
        """Batch transforms and ``channels_last``, as a step applies them after the device move."""
        if self.transforms is not None:
            batch = self.transforms(batch)
        if self.enable_channels_last:
            batch = convert_channels_last(batch, self.channels_last_keys)
        return batch

    # -- shared setup ---------------------------------------------------------------------
    def _setup(
        self,
        need_grad_update: bool,
        batch_transforms: Any,
        inverse_transforms: Any,
        loss_collector: Callable | None,
        enable_amp: bool,
        enable_amp_dtype: torch.dtype | str,
        enable_apex: bool,
        enable_channels_last: bool,
        channels_last_keys: Sequence[str] | None,
        grad_scaler: Any,
        grad_accumulation_step: int | str,
        check_finite_loss: bool,
        *,
        nonfinite_policy: str = "raise",
        check_finite_grad: bool = True,
        clip_grad_norm: float | None = None,
        clip_norm_type: float | str = 2.0,
        clip_grad_value: float | tuple[float, float] | None = None,
    ) -> None:
        name = type(self).__name__
        if enable_apex:
            raise ValueError(
                f"{name}(enable_apex=True): Apex is not supported. Use native mixed precision "
                f"instead: enable_amp=True with enable_amp_dtype=torch.float16 (a GradScaler is "
                f"created for you) or enable_amp_dtype=torch.bfloat16 (no scaler needed)."
            )
        if need_grad_update and loss_collector is None:
            raise ValueError(
                f"{name}(need_grad_update=True) needs a loss_collector to find the losses in the "
                f"model outputs, e.g. collect_loss_by_index(0) or collect_loss_by_regex('^.*loss.*')."
            )
        if loss_collector is not None and not callable(loss_collector):
            raise TypeError(f"{name}: loss_collector must be callable, got {type(loss_collector).__name__}.")
        if isinstance(grad_accumulation_step, str) and grad_accumulation_step.strip().isdigit():
            grad_accumulation_step = int(grad_accumulation_step)
        if isinstance(grad_accumulation_step, bool) or not isinstance(grad_accumulation_step, int) or grad_accumulation_step < 1:
            raise ValueError(f"{name}: grad_accumulation_step must be an integer >= 1, got {grad_accumulation_step!r}.")
        self.need_grad_update = need_grad_update
        self.transforms = compose(batch_transforms)
        self.inverse_transforms = compose_inverse(inverse_transforms)
        self.loss_collector = loss_collector
        self.enable_amp_dtype = resolve_amp_dtype(enable_amp_dtype)
        self.enable_channels_last = enable_channels_last
        self.channels_last_keys = list(channels_last_keys) if channels_last_keys is not None else None
        self.grad_accumulation_step = grad_accumulation_step
        self.check_finite_loss = check_finite_loss
        self.nonfinite = NonFiniteGuard(nonfinite_policy, bool(check_finite_loss and check_finite_grad))
        # None (one attribute test per update) unless clipping is asked for; see grad_clip.py
        self.grad_clipper = build_grad_clipper(clip_grad_norm, clip_norm_type, clip_grad_value, name)
        self._first_batches: dict[int, tuple] = {}  # batch_idx -> (iteration, structure) of the first batch
        if grad_scaler is not None and not enable_amp and getattr(grad_scaler, "is_enabled", lambda: False)():
            enable_amp = True  # an enabled scaler means fp16 mixed precision, as in HAT
        self.enable_amp = enable_amp
        self.grad_scaler = grad_scaler
        self._wants_scaler = enable_amp and self.enable_amp_dtype == torch.float16 and grad_scaler is None

    # -- per step helpers -----------------------------------------------------------------
    def _amp_context(self, engine: LoopBase) -> Any:
        if not self.enable_amp:
            return _NULL
        return torch.autocast(engine.torch_device.type, dtype=self.enable_amp_dtype)

    def _ensure_scaler(self, engine: LoopBase) -> None:
        if self._wants_scaler:
            self.ensure_grad_scaler(engine.torch_device)

    def ensure_grad_scaler(self, device: torch.device | str = "cpu") -> Any:
        """Create the GradScaler now if this processor will use one (fp16 autocast, none given).

        The scaler is otherwise created at the first step; a resume calls this first so the
        saved scaler state has somewhere to go.

        Returns:
            The processor's grad scaler, or ``None`` when it runs without one (fp32, bf16).
        """
        if self._wants_scaler:
            device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
            self.grad_scaler = torch.amp.GradScaler(device_type)
            self._wants_scaler = False
        return self.grad_scaler

    def _accumulation(self, engine: LoopBase) -> tuple[int, bool]:
        """(size of this step's accumulation group, whether this step ends the group).

        Groups restart each epoch and are cut short by the end of the epoch or of the run, so an
        incomplete last group still updates and its loss is averaged over the steps it has.
        """
        k = self.grad_accumulation_step
        if k == 1:
            return 1, True
        state = engine.state
        step_id = state.step_id
        start = step_id - step_id % k
        end = start + k
        if state.epoch_length:
            end = min(end, state.epoch_length)
        if state.max_iters is not None:
            end = min(end, step_id + state.max_iters - state.iteration + 1)
        return end - start, step_id + 1 == end

    def _run_batch(
        self, engine: LoopBase, batch: Any, batch_idx: int, divisor: int, sync: bool, step_now: bool,
        zero_grad: bool = False,
    ) -> Any:
        """Forward (and backward) one (sub-)batch; see the module docstring for the order.

        ``zero_grad``: zero the gradients right after ``BATCH_BEGIN`` (a BasicBatchProcessor step
        that starts an accumulation group).
        """
        state = engine.state
        listening = engine.hat_handlers  # per-event handler lists: an empty one is not fired
        state.batch_idx = batch_idx
        state.hat_batch_count += 1
        state.sub_batch = batch
        state.losses = state.sub_model_outs = None
        if listening[_BATCH_BEGIN]:
            fire_hat_event(engine, HatEvents.BATCH_BEGIN)
        if zero_grad:
            engine.optimizer.zero_grad(set_to_none=True)
        phases = engine.phase_profiler  # None unless a profiler is attached
        if phases is not None:
            phases.begin("forward")
        if self.transforms is not None or self.enable_channels_last or engine.moves_batches:
            batch = self._prepare_batch(engine, batch)
            state.sub_batch = batch
        if listening[_FORWARD_BEGIN]:
            fire_hat_event(engine, HatEvents.FORWARD_BEGIN)
        model = engine.model
        if batch_idx not in self._first_batches:  # once per sub-batch index, for error messages
            self._first_batches[batch_idx] = (state.iteration, batch_spec(batch))
        need_grad = self.need_grad_update
        try:
            if need_grad and not self.enable_amp and (sync or getattr(model, "no_sync", None) is None):
                # the common training forward: no context to enter
                model_outs = model(*batch) if isinstance(batch, (list, tuple)) else model(batch)
            else:
                model_outs = self._forward_in_context(engine, model, batch, sync)
        except MODEL_ERRORS as exc:
            if passes_through(exc):
                raise
            raise batch_failure(engine, batch, batch_idx, self._first_batches.get(batch_idx), exc) from exc
        if self.inverse_transforms is not None:
            model_outs = self.inverse_transforms(model_outs, batch)
        state.sub_model_outs = model_outs
        if listening[_FORWARD_END]:
            fire_hat_event(engine, HatEvents.FORWARD_END)
        losses = self.loss_collector(model_outs) if self.loss_collector is not None else None
        state.losses = losses
        if phases is not None:
            phases.end()
        if need_grad:
            self._backward(engine, model, losses, model_outs, batch_idx, divisor, sync)
            if listening[_BACKWARD_END]:
                fire_hat_event(engine, HatEvents.BACKWARD_END)
            if step_now:
                self._optimizer_step(engine)
        if listening[_BATCH_END]:
            fire_hat_event(engine, HatEvents.BATCH_END)
        return model_outs

    def _prepare_batch(self, engine: LoopBase, batch: Any) -> Any:
        """Device move, batch transforms and channels_last, in that order."""
        if engine.moves_batches:
            batch = move_to_device(batch, engine.torch_device)
        if self.transforms is not None:
            batch = self.transforms(batch)
        if self.enable_channels_last:
            batch = convert_channels_last(batch, self.channels_last_keys)
        return batch

    def _forward_in_context(self, engine: LoopBase, model: Any, batch: Any, sync: bool) -> Any:
        """The forward under autocast, ``no_grad`` (evaluation) and ``no_sync`` as they apply."""
        # DDP decides in the forward whether the backward all-reduces: a backward that does not
        # end a sync group needs its forward inside no_sync() too.
        forward_no_sync = None if sync or not self.need_grad_update else getattr(model, "no_sync", None)
        with self._amp_context(engine), (_NULL if self.need_grad_update else torch.no_grad()), (
            forward_no_sync() if forward_no_sync is not None else _NULL
        ):
            return model(*as_model_args(batch))

    def _backward(
        self, engine: LoopBase, model: Any, losses: Any, model_outs: Any, batch_idx: int, divisor: int, sync: bool
    ) -> None:
        """Total loss -> finite check -> / accumulation group size -> (scaled) backward."""
        state = engine.state
        loss = total_loss(losses)
        if loss is None:
            raise ValueError(
                f"{type(self).__name__}: the loss_collector found no loss tensor in the model "
                f"outputs of step {state.iteration - 1} (got {losses!r}). Check that the model "
                f"returns its losses in training mode and that the collector's index or regex matches."
            )
        # The guard on the device (a fused optimizer, or policy "raise"): the loss is checked on the
        # device with the gradients (nothing is read). Otherwise a CPU scalar is read for free, so check before the backward; on an
        # accelerator the read waits for the device: check once the backward is queued, still
        # before BACKWARD_END and the update (docs/engine.md, "Non-finite losses and gradients").
        total, check_after_backward = loss, self.check_finite_loss
        if check_after_backward and self.nonfinite.on_device(engine.optimizer, self.grad_scaler):
            self.nonfinite.note_loss(loss)  # checked on the device with the gradients, before the update
            check_after_backward = False
        elif check_after_backward and loss.is_cpu:
            if engine.multi_process or not math.isfinite(loss.item()):
                self.nonfinite.check_loss(engine, total, losses, model_outs, batch_idx)
            check_after_backward = False
        if divisor != 1:
            loss = loss / divisor
        if self.grad_scaler is not None:
            loss = self.grad_scaler.scale(loss)
        if engine.hat_handlers[_BACKWARD_BEGIN]:
            fire_hat_event(engine, HatEvents.BACKWARD_BEGIN)
        phases = engine.phase_profiler
        if phases is not None:
            phases.begin("backward")
        no_sync = None if sync else getattr(model, "no_sync", None)
        if no_sync is None:
            loss.backward()
        else:
            with no_sync():
                loss.backward()
        if check_after_backward and (engine.multi_process or not math.isfinite(total.item())):
            self.nonfinite.check_loss(engine, total, losses, model_outs, batch_idx)
        if phases is not None:
            phases.end()

    def _begin_step(self, engine: LoopBase, zero_now: bool = True) -> tuple[int, bool, bool]:
        """Account for this step's accumulation group: ``(*_accumulation(), starts_group)``.

        With ``zero_now`` the gradients are zeroed here when the step starts a group; otherwise
        the caller zeroes them (a BasicBatchProcessor does, after ``BATCH_BEGIN``).
        """
        if self._wants_scaler:
            self.ensure_grad_scaler(engine.torch_device)
        if self.grad_accumulation_step == 1:  # every step is a whole group
            if zero_now:
                engine.optimizer.zero_grad(set_to_none=True)
            engine.state.grad_pending_steps = 0
            return 1, True, True
        divisor, step_now = self._accumulation(engine)
        position = engine.state.step_id % self.grad_accumulation_step
        if zero_now and position == 0:
            engine.optimizer.zero_grad(set_to_none=True)
        engine.state.grad_pending_steps = 0 if step_now else position + 1
        return divisor, step_now, position == 0

    def finish_epoch(self, engine: LoopBase) -> None:
        """Flush an accumulation group the epoch ended inside (loaders without a length).

        Its gradients were averaged over ``grad_accumulation_step`` steps; they are rescaled to
        the average over the steps the group really has, then applied.
        """
        if not self.need_grad_update:
            return
        pending = getattr(engine.state, "grad_pending_steps", 0)
        if pending:
            self._optimizer_step(engine, rescale=self.grad_accumulation_step / pending)
            engine.state.grad_pending_steps = 0
        self.settle_updates(engine)

    def settle_updates(self, engine: LoopBase) -> None:
        """Read the NaN/Inf flags of every update still in flight, waiting for the device.

        With a fused optimizer the flags of the last update are read a step later; this reads
        them now, so :class:`~hat_ignite.errors.NonFiniteLossError` (``nonfinite_policy="raise"``)
        is raised, naming the step, before anything records the parameters. A blocking read: the
        loop calls it only where it saves or stops (``loop.settle_updates()``), never per
        step. Nothing to read without a guard or with the blocking guard.
        """
        guard = getattr(self, "nonfinite", None)  # a user's processor with a __call__ of its own has none
        if guard is not None:
            guard.flush(engine)

    def _optimizer_step(self, engine: LoopBase, rescale: float | None = None) -> None:
        """``OPTIMIZER_STEP_BEGIN``, then the checked, clipped update (see the module docstring).

        ``rescale`` multiplies the gradients first, after the event (whose hooks may put the
        gradients in place, as HAT's ``GradScale`` does): the flush of an incomplete group.
        """
        if engine.hat_handlers[_OPTIMIZER_STEP_BEGIN]:
            fire_hat_event(engine, HatEvents.OPTIMIZER_STEP_BEGIN)
        if rescale is not None:
            with torch.no_grad():
                for group in engine.optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.mul_(rescale)
        scaler = self.grad_scaler
        guard = self.nonfinite
        flags = None
        if not self.check_finite_loss:
            pass  # no guard: nothing checks, drops or counts this update
        elif guard.on_device(engine.optimizer, scaler):
            flags = guard.check_on_device(engine)  # a fused optimizer skips itself when a flag is set
        elif not guard.allow_update(engine, scaler):
            return  # nonfinite_policy="skip": this update is dropped (counted and logged)
        phases = engine.phase_profiler
        if phases is not None:
            phases.begin("optimizer")
        if self.grad_clipper is not None:  # after unscale_, once per update
            engine.state.grad_norm = self.grad_clipper(engine.optimizer, scaler)
        if flags is not None:
            flags.step(engine.optimizer, skip=guard.skips_on_device)
        elif scaler is not None:
            scaler.step(engine.optimizer)
            scaler.update()
        else:
            engine.optimizer.step()
        if phases is not None:
            phases.end()
        if flags is not None:
            guard.after_step(engine)  # raises (or counts) once an earlier update's flags arrive
