"""What every batch processor shares: the interface, batch helpers and the one-batch step.

The order of one training batch, top to bottom in :meth:`BatchProcessorMixin._run_batch`::

    BATCH_BEGIN -> device move -> batch transforms -> channels_last -> autocast forward
    -> inverse transforms -> collect losses -> finite check -> loss / accumulation group size
    -> (scaled) backward; forward and backward run under no_sync when this backward does not
       end a sync group (DDP decides in the forward whether the backward all-reduces)
    -> BACKWARD_END -> [optimizer step, when the processor steps per batch] -> BATCH_END

The optimizer step (:meth:`BatchProcessorMixin._optimizer_step`), once per update::

    finite-gradient check -> [GradScaler.unscale_ + clip by value / norm] -> (scaler) step
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from hat_ignite.engine.events import HatEvents
from hat_ignite.engine.processors.batch_check import MODEL_ERRORS, batch_failure, batch_spec, passes_through
from hat_ignite.engine.processors.grad_clip import build_grad_clipper
from hat_ignite.engine.processors.nonfinite import NonFiniteGuard, in_distributed_run

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["BatchProcessorMixin", "move_to_device", "convert_channels_last", "resolve_amp_dtype"]

_NULL = contextlib.nullcontext()


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
        return type(batch)(out) if not isinstance(batch, dict) or type(batch) is not dict else out
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
    return dtype  # type: ignore[return-value]


def _as_model_args(batch: Any) -> tuple:
    return tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)


def _compose(transforms: Any) -> Callable | None:
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


def _total_loss(losses: Any) -> torch.Tensor | None:
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


class BatchProcessorMixin(ABC):
    """The batch processor interface: ``processor(engine, batch) -> model_outs``.

    A processor is the process function of a hat-ignite engine: it reads the model, optimizer and
    device from the engine, fires the per-batch HAT events, and returns the model outputs (which
    Ignite stores as ``engine.state.output``).
    """

    need_grad_update: bool
    grad_scaler: Any

    @abstractmethod
    def __call__(self, engine: LoopBase, batch: Any) -> Any:
        """Process one step's batch on ``engine``; return the model outputs."""

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
        self.transforms = _compose(batch_transforms)
        self.inverse_transforms = _compose_inverse(inverse_transforms)
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
        self, engine: LoopBase, batch: Any, batch_idx: int, divisor: int, sync: bool, step_now: bool
    ) -> Any:
        """Forward (and backward) one (sub-)batch; see the module docstring for the order."""
        state = engine.state
        state.batch_idx = batch_idx
        state.hat_batch_count += 1
        state.sub_batch = batch
        state.losses = state.sub_model_outs = None
        engine.fire_event(HatEvents.BATCH_BEGIN)
        phases = engine.phase_profiler  # None unless a profiler is attached
        if phases is not None:
            phases.begin("forward")
        if engine.torch_device.type != "cpu":
            batch = move_to_device(batch, engine.torch_device)
        if self.transforms is not None:
            batch = self.transforms(batch)
        if self.enable_channels_last:
            batch = convert_channels_last(batch, self.channels_last_keys)
        state.sub_batch = batch
        model = engine.model
        if batch_idx not in self._first_batches:  # once per sub-batch index, for error messages
            self._first_batches[batch_idx] = (state.iteration, batch_spec(batch))
        # DDP decides in the forward whether the backward all-reduces: a backward that does not
        # end a sync group needs its forward inside no_sync() too.
        forward_no_sync = None if sync or not self.need_grad_update else getattr(model, "no_sync", None)
        try:
            with self._amp_context(engine), (_NULL if self.need_grad_update else torch.no_grad()), (
                forward_no_sync() if forward_no_sync is not None else _NULL
            ):
                model_outs = model(*_as_model_args(batch))
        except MODEL_ERRORS as exc:
            if passes_through(exc):
                raise
            raise batch_failure(engine, batch, batch_idx, self._first_batches.get(batch_idx), exc) from exc
        if self.inverse_transforms is not None:
            model_outs = self.inverse_transforms(model_outs, batch)
        losses = self.loss_collector(model_outs) if self.loss_collector is not None else None
        state.losses = losses
        state.sub_model_outs = model_outs
        if phases is not None:
            phases.end()
        if self.need_grad_update:
            loss = _total_loss(losses)
            if loss is None:
                raise ValueError(
                    f"{type(self).__name__}: the loss_collector found no loss tensor in the model "
                    f"outputs of step {state.iteration - 1} (got {losses!r}). Check that the model "
                    f"returns its losses in training mode and that the collector's index or regex matches."
                )
            # A CPU scalar is read for free, so check before the backward. On an accelerator the
            # read waits for the device: check once the backward is queued, still before
            # BACKWARD_END and the update (see docs/engine.md, "Non-finite losses").
            total, check_after_backward = loss, self.check_finite_loss
            if check_after_backward and loss.is_cpu:
                if not math.isfinite(loss.item()) or in_distributed_run():
                    self.nonfinite.check_loss(engine, total, losses, model_outs, batch_idx)
                check_after_backward = False
            if divisor != 1:
                loss = loss / divisor
            if self.grad_scaler is not None:
                loss = self.grad_scaler.scale(loss)
            if phases is not None:
                phases.begin("backward")
            no_sync = None if sync else getattr(model, "no_sync", None)
            with no_sync() if no_sync is not None else _NULL:
                loss.backward()
            if check_after_backward and (not math.isfinite(total.item()) or in_distributed_run()):
                self.nonfinite.check_loss(engine, total, losses, model_outs, batch_idx)
            if phases is not None:
                phases.end()
            engine.fire_event(HatEvents.BACKWARD_END)
            if step_now:
                self._optimizer_step(engine)
        engine.fire_event(HatEvents.BATCH_END)
        return model_outs

    def _begin_step(self, engine: LoopBase) -> tuple[int, bool]:
        """Zero the gradients when an accumulation group starts; return ``_accumulation()``."""
        self._ensure_scaler(engine)
        divisor, step_now = self._accumulation(engine)
        if engine.state.step_id % self.grad_accumulation_step == 0:
            engine.optimizer.zero_grad(set_to_none=True)
        engine.state.grad_pending_steps = 0 if step_now else engine.state.step_id % self.grad_accumulation_step + 1
        return divisor, step_now

    def finish_epoch(self, engine: LoopBase) -> None:
        """Flush an accumulation group the epoch ended inside (loaders without a length).

        Its gradients were averaged over ``grad_accumulation_step`` steps; they are rescaled to
        the average over the steps the group really has, then applied.
        """
        pending = getattr(engine.state, "grad_pending_steps", 0)
        if not (self.need_grad_update and pending):
            return
        scale = self.grad_accumulation_step / pending
        with torch.no_grad():
            for group in engine.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(scale)
        self._optimizer_step(engine)
        engine.state.grad_pending_steps = 0

    def _optimizer_step(self, engine: LoopBase) -> None:
        if not self.nonfinite.allow_update(engine, self.grad_scaler):
            return  # nonfinite_policy="skip": this update is dropped (counted and logged)
        phases = engine.phase_profiler
        if phases is not None:
            phases.begin("optimizer")
        scaler = self.grad_scaler
        if self.grad_clipper is not None:  # after unscale_, once per update
            engine.state.grad_norm = self.grad_clipper(engine.optimizer, scaler)
        if scaler is not None:
            scaler.step(engine.optimizer)
            scaler.update()
        else:
            engine.optimizer.step()
        if phases is not None:
            phases.end()


def _compose_inverse(transforms: Any) -> Callable | None:
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
