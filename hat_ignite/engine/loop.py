"""`LoopBase`: a HAT loop that *is* an Ignite :class:`~ignite.engine.Engine`.

The batch processor runs in the engine's process function; HAT's thirteen hooks are Ignite custom
events (:class:`~hat_ignite.engine.events.HatEvents`, registered and fired by
:class:`~hat_ignite.engine.event_registry.HatEventsMixin`) fired from Ignite's own events by the
small bridge functions of :mod:`hat_ignite.engine.bridge`. There is no second loop: ``fit()``
prepares the state and calls ``run()``.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, cast

import torch
from ignite.engine import Engine, Events
from ignite.metrics import Metric

from hat_ignite.engine.bridge import (
    check_log_interval,
    close_epoch,
    empty_loader_error,
    loader_length,
    log_progress,
    on_completed,
    on_epoch_started,
    on_started,
    run_step,
)
from hat_ignite.engine.dispatch import attach_hat_callback, hat_hook_methods
from hat_ignite.engine.event_registry import HatEventsMixin, quiet_ignite_messages
from hat_ignite.engine.events import HatEvents
from hat_ignite.engine.ignite_entries import attach_entry, bare_handler_error, is_handler_entry
from hat_ignite.engine.outputs import note_model_outputs, state_output_function
from hat_ignite.engine.loop_args import as_metric_list, build_if_config, resolve_device
from hat_ignite.engine.loop_run import LoopRunMixin
from hat_ignite.engine.resumable import ResumableLoopMixin
from hat_ignite.engine.state import HatState

__all__ = ["LoopBase", "build_if_config", "check_log_interval", "resolve_device"]

logger = logging.getLogger(__name__)

_STOP_BY = ("epoch", "step")


class LoopBase(LoopRunMixin, ResumableLoopMixin, HatEventsMixin, Engine):
    """The data flow from ``data_loader`` through the batch processor, with HAT's callbacks.

    A ``LoopBase`` is an Ignite ``Engine``: attach any Ignite handler with ``on()`` /
    ``add_event_handler()``, on Ignite's events or on :class:`HatEvents`. It runs on the CPU
    (``device=None``) or on one GPU (``device`` an int id).

    Args:
        model: a ``torch.nn.Module`` or a model config.
        data_loader: an iterable of batches (a ``DataLoader``) or its config.
        optimizer: an optimizer, an optimizer config (it gets the model's parameters), or
            ``None`` for loops that do not update parameters.
        batch_processor: the process function, e.g. a ``BasicBatchProcessor``, or its config.
        device: ``None`` for the CPU or an int CUDA device id (the model and every batch are
            moved there).
        model_convert_pipeline: a callable ``model -> model`` (or a list of them, or configs)
            applied to the model before it is moved to ``device``.
        resume_optimizer: whether a resumed checkpoint also restores the optimizer and grad
            scaler states.
        resume_epoch_or_step: whether a resumed checkpoint also restores the epoch/step (down to
            the position inside the epoch), the callback states and the random generators.
            Converters of ``model_convert_pipeline`` with a ``resume(loop)`` method (such as
            ``LoadCheckpoint``) do the restoring when the loop is built, as HAT does (so
            ``loop.checkpoint``, the optimizer state and ``start_epoch`` / ``start_step`` can be
            read before ``fit()``), and again when ``fit()`` starts if these two flags changed
            since; see :mod:`hat_ignite.engine.resumable`.
        resume_dataloader: what a resume inside an epoch does with the epoch's data. ``None``
            (default) or ``True``: continue exactly where the checkpoint was written (the done
            batches are skipped, the generators restored). ``False``: as HAT without
            ``resume_dataloader``, the data loader starts a fresh pass for the rest of that epoch
            (the step count and the epoch boundaries stay where they were).
        stop_by: ``"epoch"`` (stop after ``num_epochs`` epochs) or ``"step"`` (stop after
            ``num_steps`` steps, crossing epoch boundaries as needed).
        num_epochs: epochs to run when ``stop_by="epoch"``; ``0`` runs only the loop begin/end
            hooks.
        start_epoch: 0-based epoch to start from.
        num_steps: steps to run when ``stop_by="step"``; ``0`` runs only the loop begin/end
            hooks.
        start_step: 0-based global step to start from.
        callbacks: HAT callbacks (or their configs): hat-ignite ``CallbackMixin`` subclasses,
            callbacks written for HAT (any object with HAT ``on_*`` hooks and no ``attach``), any
            object with ``attach(engine)``, or an Ignite handler or metric listed with its event or
            name (``dict(handler=TerminateOnNan(), event="ITERATION_COMPLETED")``,
            ``dict(handler=RunningAverage(...), name="loss")``: see
            :mod:`~hat_ignite.engine.ignite_entries`); attached in list order.
        train_metrics: metrics on the training data, passed to every hook as a list, as in HAT
            (one metric ``m`` as ``[m]``, ``None`` as ``[None]``).
        val_metrics: metrics on the validation data, passed to every hook as a list (likewise).
        profiler: ``None``, ``"simple"`` (a :class:`~hat_ignite.profiler.SimpleProfiler`), a
            profiler config or instance (e.g. a :class:`~hat_ignite.profiler.TorchProfiler`); it is
            attached to the loop and passed to every hook.
        log_interval: log epoch/step and the loss after the steps whose ``step_id`` (inside the
            epoch) is a multiple of ``log_interval``, as HAT picks them (``step_id % log_interval
            == 0``): a float works as in HAT (HAT configs pass ``calibration_step / 10``); ``0`` or
            less: never.
        compiler: compile the model (after ``model_convert_pipeline`` and the move to ``device``):
            a :class:`~hat_ignite.engine.compile.Torch2Compile` or its config
            (``dict(type="Torch2Compile", backend="inductor", mode=...)``), a dict of
            ``torch.compile`` settings, ``True`` for the defaults, or any callable
            ``model -> model``. ``None`` (default): eager.
        state_output: what Ignite handlers find in ``engine.state.output`` after each step:
            ``"model_outs"`` (default), what the model returned; ``"loss"``, the step's summed
            loss as a detached 0-dim tensor (what Ignite's trainers leave there, so recipes such
            as ``f"{engine.state.output:.2f}"`` or ``RunningAverage(output_transform=lambda x: x)``
            work as written; reading it is the handler's host-device sync); or a callable
            ``model_outs -> value``. HAT hooks get ``model_outs`` either way.

    ``batch_processor`` and ``data_loader`` may be ``None`` in an *export stage*: a loop with no
    step to run (``num_epochs=0`` / ``num_steps=0``) that only converts the model and fires the
    loop begin/end hooks (``SaveTraced``, ``Checkpoint`` ...). With steps to run, ``None`` is an
    error.
    """

    if TYPE_CHECKING:  # defined by the trainers, the only loops that set ``train_mode_model``

        def restore_train_mode(self) -> None: ...

        def note_train_modes(self) -> None: ...

    def __init__(
        self,
        model: torch.nn.Module | dict,
        data_loader: Iterable | dict,
        optimizer: torch.optim.Optimizer | dict | None,
        batch_processor: Callable | dict,
        device: int | None,
        model_convert_pipeline: Callable | Sequence[Callable] | dict | None = None,
        resume_optimizer: bool = False,
        resume_epoch_or_step: bool = False,
        resume_dataloader: bool | None = None,
        stop_by: str | None = "epoch",
        num_epochs: int | None = None,
        start_epoch: int | None = 0,
        num_steps: int | None = None,
        start_step: int | None = 0,
        callbacks: Sequence[Any] | None = None,
        train_metrics: Any = None,
        val_metrics: Any = None,
        profiler: Any = None,
        log_interval: float = 0,
        compiler: Any = None,
        state_output: str | Callable[[Any], Any] = "model_outs",
    ) -> None:
        batch_processor = build_if_config(batch_processor, "batch_processor")
        if batch_processor is not None and not callable(batch_processor):
            raise TypeError(
                f"batch_processor must be callable as processor(engine, batch), got "
                f"{type(batch_processor).__name__}. Use a BasicBatchProcessor or MultiBatchProcessor."
            )
        # the batch processor, wrapped in the HAT step (see bridge.py); Ignite types the process
        # function's engine as a plain Engine, where it is this LoopBase
        super().__init__(run_step)  # type: ignore[arg-type]
        self.state = HatState()
        self._init_hat_events()
        self.logger = quiet_ignite_messages(logging.getLogger(f"hat_ignite.engine.{type(self).__name__}"))

        stop_by = (stop_by or "epoch").lower()
        if stop_by not in _STOP_BY:
            raise ValueError(f"stop_by must be 'epoch' or 'step', got {stop_by!r}.")
        for name, value in (("num_epochs", num_epochs), ("num_steps", num_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
        if stop_by == "epoch" and num_epochs is None:
            raise ValueError("stop_by='epoch' needs num_epochs (a non-negative integer).")
        if stop_by == "step" and num_steps is None:
            raise ValueError("stop_by='step' needs num_steps (a non-negative integer).")
        for name, value in (("start_epoch", start_epoch), ("start_step", start_step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
        check_log_interval(log_interval, type(self).__name__)
        if resume_dataloader is not None and not isinstance(resume_dataloader, bool):
            raise TypeError(f"resume_dataloader must be None, True or False, got {resume_dataloader!r}.")

        self.device = device
        self.torch_device = resolve_device(device)
        model = build_if_config(model, "model")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or a model config, got {type(model).__name__}.")
        pipeline = build_if_config(model_convert_pipeline, "model_convert_pipeline")
        self.data_loader = build_if_config(data_loader, "data_loader")
        converters = [] if pipeline is None else pipeline if isinstance(pipeline, (list, tuple)) else [pipeline]
        if converters:
            # converters without example inputs trace with this engine's first batch as the batch
            # processor gives it to the model, so HAT's converter configs (which need none) work as written
            from hat_ignite.quantization.examples import apply_converters, callbacks_trace_inputs, stage_examples

            with stage_examples(self.data_loader, batch_processor, callbacks_trace_inputs(callbacks)):
                model = cast(torch.nn.Module, apply_converters(converters, model))  # returns the converted model
        self.model: torch.nn.Module = model.to(self.torch_device) if self.torch_device.type != "cpu" else model
        if compiler is not None and compiler is not False:
            from hat_ignite.engine.compile import apply_compiler, build_compiler  # only runs that compile

            self.model = apply_compiler(build_compiler(compiler), self.model)
        #: The ``compiler`` argument (applied to the model above).
        self.compiler = compiler
        if optimizer is not None and isinstance(optimizer, dict):
            from hat_ignite.optimizers import build_optimizer

            optimizer = build_optimizer(optimizer, self.model, key_path="optimizer")
        self.optimizer = optimizer
        self.batch_processor = batch_processor
        #: What the process function (:func:`~hat_ignite.engine.bridge.run_step`) calls each step:
        #: the batch processor, or a wrapper of it (the Calibrator's turns the observers on).
        self.step_processor: Callable = batch_processor
        #: A clock (e.g. ``time.perf_counter``) the process function reads right before the batch
        #: processor, storing the time as ``state.step_start_time``; ``None`` (the default) reads
        #: none. ``StatsMonitor`` sets it to split a step into data wait and compute without a
        #: ``STEP_BEGIN`` hook.
        self.step_clock: Callable[[], float] | None = None
        #: ``state_output`` as a function of the model outputs, applied by the process function
        #: after ``STEP_END``; ``None``: ``state.output`` is the model outputs.
        self.output_function = state_output_function(self, state_output)
        self.model_convert_pipeline = pipeline
        self.resume_optimizer = resume_optimizer
        self.resume_epoch_or_step = resume_epoch_or_step
        #: Whether a mid-epoch resume continues the epoch's data where it stopped (``None``, the
        #: default, and ``True``) or starts the loader afresh (``False``, HAT's default).
        self.resume_dataloader = resume_dataloader
        self.stop_by = stop_by
        self.num_epochs = num_epochs
        self.start_epoch = start_epoch or 0
        self.num_steps = num_steps
        self.start_step = start_step or 0
        self.train_metrics = as_metric_list(build_if_config(train_metrics, "train_metrics"))
        self.val_metrics = as_metric_list(build_if_config(val_metrics, "val_metrics"))
        if profiler is not None:
            from hat_ignite.profiler import build_profiler  # only runs that profile import it

            profiler = build_profiler(profiler)
        self.profiler = profiler
        #: Times the batch processor's phases when a profiler is attached; ``None`` (free) otherwise.
        self.phase_profiler: Any = None
        self.log_interval = log_interval
        self.ema_model: torch.nn.Module | None = None
        self.checkpoint: Any = None
        #: The keywords of the HAT event being fired, by hook (see ``hook_kwargs``); ``None``
        #: between firings.
        self.firing_kwargs: dict[str, dict[str, Any]] | None = None
        #: Whether this run trains in several processes (set when the run starts); the per-step
        #: finiteness checks then all-reduce their flags.
        self.multi_process = False
        self._init_resumable()
        #: The model the per-step mode check keeps in training mode (set by trainers when the
        #: loop begins); ``None``: no check.
        self.train_mode_model: torch.nn.Module | None = None
        self._train_modes: dict[torch.nn.Module, bool] = {}
        if batch_processor is None or self.data_loader is None:
            self._check_export_only(batch_processor)

        for event, bridge in (
            (Events.STARTED, on_started),
            (Events.EPOCH_STARTED, on_epoch_started),
            (Events.EPOCH_COMPLETED, close_epoch),
            (Events.COMPLETED, on_completed),
        ):
            self.add_event_handler(event, bridge)
        if log_interval > 0:
            self.add_event_handler(HatEvents.STEP_END, log_progress)

        self.callbacks: list[Any] = []
        self._callback_handles: list[Any] = []
        self.attach_callbacks(callbacks or [])
        if callable(getattr(profiler, "attach", None)):
            profiler.attach(self)  # after the callbacks: it wraps every handler when the run starts
        self._resume_from_pipeline()  # last: it restores into the optimizer, processor and callbacks

    @property
    def torch_device(self) -> torch.device:
        """The :class:`torch.device` the model and the batches are on."""
        return self._torch_device

    @torch_device.setter
    def torch_device(self, device: torch.device) -> None:
        self._torch_device = device
        #: Whether batches are moved to the device (a flag the per-step path reads, not the device).
        self.moves_batches = device.type != "cpu"

    # -- callbacks -------------------------------------------------------------------------
    def attach_callbacks(self, callbacks: Sequence[Any], key: str = "callbacks") -> list[Any]:
        """Build (if configs) and attach ``callbacks`` in order; return the built objects."""
        built = []
        for i, cb in enumerate(callbacks):
            if is_handler_entry(cb):  # dict(handler=..., event=...): an Ignite handler or metric
                cb, handles = attach_entry(self, cb, f"{key}[{i}]")
                self._callback_handles.extend(handles)
                built.append(cb)
                continue
            cb = build_if_config(cb, f"{key}[{i}]")
            attach = getattr(cb, "attach", None)
            if isinstance(cb, Metric):  # its attach needs a name
                raise bare_handler_error(cb, f"{key}[{i}]")
            if callable(attach):
                handles = attach(self)
            elif hat_hook_methods(cb) or any(n.startswith("on_") for n in dir(type(cb))):
                handles = attach_hat_callback(self, cb)  # a callback written for HAT, as it is
            else:
                raise bare_handler_error(cb, f"{key}[{i}]")
            if isinstance(handles, list):
                self._callback_handles.extend(handles)
            built.append(cb)
        self.callbacks.extend(built)
        return built

    def set_model_mode(self) -> None:
        """Put the model in the mode the loop needs; called right before ``on_loop_begin``."""

    def _check_export_only(self, batch_processor: Any) -> None:
        """``batch_processor=None`` / ``data_loader=None`` only suit a loop with no step to run."""
        if self._nothing_to_run():
            return
        names = [n for n, v in (("batch_processor", batch_processor), ("data_loader", self.data_loader)) if v is None]
        missing, verb = " and ".join(names), "are" if len(names) > 1 else "is"
        key = "num_epochs" if self.stop_by == "epoch" else "num_steps"
        raise ValueError(
            f"{type(self).__name__}: {missing} {verb} None, but {key}={getattr(self, key)} asks for steps "
            f"to run. A loop without them can only be an export stage: set {key}=0 to run just the "
            f"model_convert_pipeline and the loop begin/end hooks (SaveTraced, Checkpoint ...), or give "
            f"the {missing}."
        )

    def fit(self) -> HatState:
        """Run the loop until ``num_epochs`` epochs or ``num_steps`` steps are done.

        Resumers (objects given to :meth:`schedule_resume`, and ``model_convert_pipeline``
        converters with ``resume(loop)`` unless they ran when the loop was built with the same
        resume flags) run first and may move ``start_epoch`` / ``start_step``.
        A run stopped by Ignite's ``interrupt()`` goes on where it stopped, and a state restored
        with :meth:`load_state_dict` (or Ignite's ``Checkpoint.load_objects``) goes on at its
        iteration, as Ignite's ``run()`` does; any other call starts at ``start_epoch`` /
        ``start_step``, as in HAT.

        Returns:
            The engine's state after the run.
        """
        restored = self.state.iteration if self._state_restored else None
        self._state_restored = False
        paused = self._internal_run_generator
        if paused is not None and inspect.getgeneratorstate(paused) == inspect.GEN_CLOSED:
            self._internal_run_generator = None  # the last run ended with an exception: nothing is paused
        if self._internal_run_generator is not None:
            if restored is None:  # interrupt() paused the last run: go on with it
                self.run(self.state.dataloader)
                return self.state
            self._drop_paused_run()
        self._run_resumers()
        length = loader_length(self.data_loader)
        start_epoch, start_step = self.start_epoch, self.start_step
        if restored is not None:
            if length and self.state.epoch_length and self.state.epoch_length != length:
                raise ValueError(
                    f"{type(self).__name__}.fit(): the restored state has epoch_length="
                    f"{self.state.epoch_length}, but the data_loader has {length} batches. Restore a "
                    f"state saved with this data_loader, or load it with epoch_length={length}."
                )
            start_epoch, start_step = 0, restored
        if self._nothing_to_run(start_epoch, start_step):
            self.state.epoch = start_epoch if not start_step or not length else start_step // length
            self.state.iteration = start_step or start_epoch * (length or 0)
            self._make_data(length, self.state.iteration)
            on_started(self)
            on_completed(self)
            return self.state
        if length == 0:
            raise empty_loader_error(self)
        limit = {"max_epochs": self.num_epochs} if self.stop_by == "epoch" else {"max_iters": self.num_steps}
        self.state.max_epochs = self.state.max_iters = None
        if start_epoch or start_step:
            if not length:
                raise ValueError(
                    "start_epoch/start_step need a data_loader with a length (len(data_loader)), "
                    f"but {type(self.data_loader).__name__} has none."
                )
            iteration = start_step or start_epoch * length
            if start_step and start_epoch and start_epoch != start_step // length:
                raise ValueError(
                    f"start_epoch={start_epoch} and start_step={start_step} disagree: with "
                    f"{length} steps per epoch, step {start_step} is in epoch "
                    f"{start_step // length}. Give one of them, or both consistent."
                )
            self._position(iteration, length, limit)
            self._run_positioned(length, iteration)
        elif self.stop_by == "step" and length:
            self._position(0, length, limit)
            self._run_positioned(length, 0)
        else:
            try:
                self.run(self._make_data(length, 0), **limit)
            except ZeroDivisionError:
                # Ignite divides max_iters by the first epoch's length, which an iterable without
                # len() that yields nothing makes 0: say what is wrong instead.
                if self.state.epoch_length == 0:
                    raise empty_loader_error(self) from None
                raise
        return self.state
