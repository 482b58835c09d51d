"""`StatsMonitor`: how fast training runs and where the time goes.

A step's time is split in two: *data* is the wait between the end of the previous step (or the
start of the epoch) and the start of this one's batch processor, mostly the data loader fetching
the batch (and the step-begin hooks); *compute* is the time from there to step end (forward,
backward, update and the step hooks that run before this callback's ``on_step_end``). The start
is read by the engine itself (``loop.step_clock``, which this callback sets), so the callback
needs no ``on_step_begin`` hook. Attach it after the other callbacks so
their step-end work counts as compute rather than as the next step's data wait. On CUDA,
kernels run asynchronously, so the split between the two is approximate while their sum over
an interval is not.

Storage layout: ``storage["stats"]`` is a dict of the latest figures, replaced by a new dict at
every log, keeping the keys of the other kind of log:

* step logs (every ``log_freq`` global steps): ``epoch_id``, ``step_id``, ``global_step_id``,
  ``data_time``, ``compute_time``, ``step_time`` (mean seconds per step over the steps since
  the previous step log), ``samples_per_sec`` (``None`` when the batch size is unknown),
  ``lr`` (first param group; ``None`` without an optimizer), ``eta_seconds`` (``None`` when the
  run's length is unknown), ``peak_memory_mib`` and, with ``log_profiler=True``,
  ``profiler_top`` (the three sections of the loop's profiler with the most time so far, as
  ``(name, seconds)`` pairs);
* epoch ends: ``epoch_id``, ``global_step_id``, ``epoch_time`` (seconds), ``epoch_steps``,
  ``epoch_data_time``, ``epoch_compute_time`` (mean seconds per step), ``epoch_samples_per_sec``,
  ``lr``, ``eta_seconds`` and ``peak_memory_mib``.

``peak_memory_mib`` is ``torch.cuda.max_memory_allocated`` on a CUDA loop, else the process's
peak resident set size (``resource.getrusage``; ``None`` where that module does not exist).
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

import ignite.distributed as idist
import torch

from hat_ignite.callbacks.base import CallbackMixin

__all__ = ["StatsMonitor", "STORAGE_KEY", "infer_batch_size", "peak_memory_mib"]

logger = logging.getLogger(__name__)

#: ``storage`` key of the figures.
STORAGE_KEY = "stats"


def infer_batch_size(batch: Any) -> int | None:
    """The size of the first dimension of the first tensor in ``batch`` (``None`` if none).

    >>> infer_batch_size({"img": torch.zeros(8, 3), "label": torch.zeros(8)})
    8
    >>> infer_batch_size([torch.tensor(1.0), torch.zeros(4, 2)]), infer_batch_size("text")
    (4, None)
    """
    if batch.__class__ is tuple or batch.__class__ is list:  # the common (inputs, labels, ...)
        first = batch[0] if batch else None
        if first.__class__ is torch.Tensor and first.dim():
            return first.shape[0]
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        items: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        size = infer_batch_size(item)
        if size is not None:
            return size
    return None


def peak_memory_mib(torch_device: torch.device | None = None) -> float | None:
    """Peak memory in MiB: CUDA's max allocated on a CUDA device, else the process's peak RSS.

    >>> peak_memory_mib(torch.device("cpu")) > 0
    True
    """
    if torch_device is not None and torch_device.type == "cuda":
        return torch.cuda.max_memory_allocated(torch_device) / 2**20
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB elsewhere


def _lr(optimizer: Any) -> float | None:
    groups = getattr(optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


def _eta_text(eta: float | None) -> str:
    return "unknown" if eta is None else str(datetime.timedelta(seconds=int(round(eta))))


class _Totals:
    """Sums over a span of steps."""

    __slots__ = ("steps", "data", "compute", "samples", "counted")

    def __init__(self) -> None:
        self.steps = 0
        self.data = 0.0
        self.compute = 0.0
        self.samples = 0
        self.counted = True  # every step's batch size was known

    def add(self, data: float, compute: float, samples: int | None) -> None:
        self.steps += 1
        self.data += data
        self.compute += compute
        if samples is None:
            self.counted = False
        else:
            self.samples += samples

    def merge(self, other: _Totals) -> None:
        self.steps += other.steps
        self.data += other.data
        self.compute += other.compute
        self.samples += other.samples
        self.counted = self.counted and other.counted

    def per_step(self, seconds: float) -> float | None:
        return seconds / self.steps if self.steps else None

    def samples_per_sec(self) -> float | None:
        elapsed = self.data + self.compute
        return self.samples / elapsed if self.counted and self.steps and elapsed > 0 else None


class StatsMonitor(CallbackMixin):
    """Log and store training speed, time split, learning rate, ETA and peak memory.

    Args:
        log_freq: log every ``log_freq`` global steps (``< 1``: only at epoch ends).
        batch_size: samples per step; ``None`` infers it from the first dimension of the first
            tensor of each batch (give it for a ``MultiBatchProcessor``, whose step holds
            several batches).
        log_profiler: also log, at each step log, the three sections of the loop's
            :class:`~hat_ignite.profiler.SimpleProfiler` that took the most time so far (HAT's
            "most time cost op"). A loop without a profiler gets a ``SimpleProfiler(log=False)``
            from this callback (which times every handler from then on); with a profiler that
            keeps no running totals (``TorchProfiler``) a warning says nothing can be logged.

    Example:
        >>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(3, 1)
        ...     def forward(self, x):
        ...         return (self.fc(x) ** 2).mean()
        >>> model = Net()
        >>> trainer = Trainer(
        ...     model=model, data_loader=[torch.randn(5, 3) for _ in range(4)],
        ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        ...     batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=lambda out: [out]),
        ...     device=None, num_epochs=1, callbacks=[StatsMonitor(log_freq=2)])
        >>> stats = trainer.fit().storage["stats"]
        >>> stats["global_step_id"], stats["epoch_steps"], stats["lr"], stats["eta_seconds"]
        (4, 4, 0.01, 0.0)
    """

    def __init__(self, log_freq: int = 200, batch_size: int | None = None, log_profiler: bool = False) -> None:
        if isinstance(log_freq, bool) or not isinstance(log_freq, int):
            raise TypeError(f"StatsMonitor: log_freq must be an int (< 1: log at epoch ends only), got {log_freq!r}.")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"StatsMonitor: batch_size must be None (inferred) or a positive int, got {batch_size!r}.")
        self.log_freq = log_freq
        self.batch_size = batch_size
        self.log_profiler = bool(log_profiler)
        self._clock = time.perf_counter
        self._run = _Totals()
        self._epoch = _Totals()
        self._interval = _Totals()
        self._pending = _Totals()  # steps not yet added to the three above (see _fold)
        self._epoch_start = 0.0
        self._prev_step_end = 0.0
        self._planned_steps: int | None = None  # the run's length told by loop begin (for a loop without state)

    # -- figures ---------------------------------------------------------------------------
    def _eta(self, loop: Any, steps_done: int) -> float | None:
        """Seconds left: from the loop's state, or (called without ``loop``) from the run's length
        that loop begin was told and the ``steps_done`` its caller counts."""
        state = getattr(loop, "state", None)
        if state is None:
            total, done = self._planned_steps, steps_done
        else:
            total, done = state.max_iters, state.iteration
            if total is None and state.max_epochs is not None and state.epoch_length:
                total = state.max_epochs * state.epoch_length
        mean_step = self._run.per_step(self._run.data + self._run.compute)
        if total is None or mean_step is None:
            return None
        return max(total - done, 0) * mean_step

    def _fold(self) -> None:
        """Add the steps since the last fold to the run, epoch and interval sums.

        A step adds to one set of sums only; the three are brought up to date when read.
        """
        pending = self._pending
        if pending.steps:
            for totals in (self._run, self._epoch, self._interval):
                totals.merge(pending)
            self._pending = _Totals()

    def _store(self, storage: dict[str, Any] | None, figures: dict[str, Any]) -> None:
        if storage is None:  # called without storage (HAT-style): the figures are only logged
            return
        old = storage.get(STORAGE_KEY)
        storage[STORAGE_KEY] = {**(old if isinstance(old, dict) else {}), **figures}

    def attach(self, engine: Any) -> Any:
        """Attach the hooks; with ``log_profiler`` give a loop without a profiler a SimpleProfiler."""
        handles = super().attach(engine)
        if self.log_profiler and getattr(engine, "profiler", "absent") is None:
            from hat_ignite.profiler import SimpleProfiler

            engine.profiler = SimpleProfiler(log=False)
            engine.profiler.attach(engine)
        return handles

    # -- hooks -----------------------------------------------------------------------------
    def on_loop_begin(
        self, loop: Any = None, profiler: Any = None, num_epochs: int | None = None, num_steps: int | None = None,
        data_loader: Any = None, **kwargs: Any,
    ) -> None:
        if loop is not None:
            loop.step_clock = self._clock  # the engine reads each step's start (see the module doc)
        self._planned_steps = _planned_steps(num_epochs, num_steps, data_loader)
        if self.log_profiler and not callable(getattr(profiler, "top_sections", None)):
            logger.warning(
                "StatsMonitor(log_profiler=True): the loop's profiler (%s) keeps no running section times, so "
                "the most costly sections cannot be logged. Use profiler='simple' (a SimpleProfiler).",
                type(profiler).__name__,
            )
        self._run = _Totals()
        self._interval = _Totals()
        self._pending = _Totals()

    def on_epoch_begin(self, **kwargs: Any) -> None:
        self._fold()
        self._epoch = _Totals()
        self._epoch_start = self._prev_step_end = self._clock()

    def on_step_end(
        self, loop: Any = None, epoch_id: int = 0, step_id: int = 0, global_step_id: int = 0,
        storage: dict[str, Any] | None = None, batch: Any = None, optimizer: Any = None, **kwargs: Any,
    ) -> None:
        """Time the step; every ``log_freq`` steps log the figures and store them in ``storage``.

        Called without ``loop`` (HAT's hooks), the step's data time is not told apart, the ETA
        comes from loop begin's ``num_epochs`` / ``num_steps`` and ``data_loader``, and, without
        ``batch``, the samples per second from ``data_loader.batch_size``.
        """
        now = self._clock()
        try:
            begin = loop.state.step_start_time
        except AttributeError:  # attached after the loop began: the engine reads starts from now on
            if loop is not None:
                loop.step_clock = self._clock
            begin = self._prev_step_end
        samples = self.batch_size if self.batch_size is not None else infer_batch_size(batch)
        if samples is None and batch is None:  # HAT's loop passes no batch here: its loader's batch size
            samples = _loader_batch_size(kwargs.get("data_loader"))
        self._pending.add(begin - self._prev_step_end, now - begin, samples)
        self._prev_step_end = now
        if self.log_freq < 1 or (global_step_id + 1) % self.log_freq:
            return
        self._fold()
        span = self._interval
        self._interval = _Totals()
        figures: dict[str, Any] = {
            "epoch_id": epoch_id, "step_id": step_id, "global_step_id": global_step_id,
            "data_time": span.per_step(span.data), "compute_time": span.per_step(span.compute),
            "step_time": span.per_step(span.data + span.compute), "samples_per_sec": span.samples_per_sec(),
            "lr": _lr(optimizer), "eta_seconds": self._eta(loop, global_step_id + 1),
            "peak_memory_mib": peak_memory_mib(getattr(loop, "torch_device", None)),
        }
        top_sections = getattr(getattr(loop, "profiler", None), "top_sections", None) if self.log_profiler else None
        if callable(top_sections):
            figures["profiler_top"] = top_sections(3)
        self._store(storage, figures)
        if idist.get_rank() == 0:
            speed = figures["samples_per_sec"]
            logger.info(
                "Epoch[%d] Step[%d] GlobalStep[%d] %s samples/sec, step %.4fs (data %.4fs, compute %.4fs), "
                "lr=%s, eta %s, peak memory %s MiB",
                epoch_id, step_id, global_step_id, "?" if speed is None else f"{speed:.1f}",
                figures["step_time"], figures["data_time"], figures["compute_time"], _fmt_lr(figures["lr"]),
                _eta_text(figures["eta_seconds"]), _fmt_mib(figures["peak_memory_mib"]),
            )
            if "profiler_top" in figures:
                logger.info("Epoch[%d] Step[%d] most time so far: %s", epoch_id, step_id,
                            "; ".join(f"{name} ({seconds:.3f}s)" for name, seconds in figures["profiler_top"]))

    def on_epoch_end(
        self, loop: Any = None, epoch_id: int = 0, global_step_id: int = 0, storage: dict[str, Any] | None = None,
        optimizer: Any = None, **kwargs: Any,
    ) -> None:
        self._fold()
        epoch = self._epoch
        figures: dict[str, Any] = {
            "epoch_id": epoch_id, "global_step_id": global_step_id, "epoch_time": self._clock() - self._epoch_start,
            "epoch_steps": epoch.steps, "epoch_data_time": epoch.per_step(epoch.data),
            "epoch_compute_time": epoch.per_step(epoch.compute), "epoch_samples_per_sec": epoch.samples_per_sec(),
            "lr": _lr(optimizer), "eta_seconds": self._eta(loop, global_step_id),
            "peak_memory_mib": peak_memory_mib(getattr(loop, "torch_device", None)),
        }
        self._store(storage, figures)
        if idist.get_rank() == 0:
            speed = figures["epoch_samples_per_sec"]
            logger.info(
                "Epoch[%d] done in %.3fs: %d steps, %s samples/sec, data %s s/step, compute %s s/step, "
                "eta %s, peak memory %s MiB",
                epoch_id, figures["epoch_time"], epoch.steps, "?" if speed is None else f"{speed:.1f}",
                _fmt_s(figures["epoch_data_time"]), _fmt_s(figures["epoch_compute_time"]),
                _eta_text(figures["eta_seconds"]), _fmt_mib(figures["peak_memory_mib"]),
            )

    def __repr__(self) -> str:
        return f"StatsMonitor(log_freq={self.log_freq}, batch_size={self.batch_size}, log_profiler={self.log_profiler})"


def _planned_steps(num_epochs: int | None, num_steps: int | None, data_loader: Any) -> int | None:
    """The run's steps from loop begin's keywords: ``num_steps``, else ``num_epochs`` times the loader's length."""
    if num_steps:
        return int(num_steps)
    try:
        return int(num_epochs) * len(data_loader) if num_epochs else None
    except TypeError:  # a loader without a length
        return None


def _loader_batch_size(data_loader: Any) -> int | None:
    size = getattr(data_loader, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _fmt_s(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.4f}"


def _fmt_lr(lr: float | None) -> str:
    """An lr as the LR updaters log it: 6 significant digits (``0.018``, not ``0.018000000000000002``)."""
    return "?" if lr is None else f"{lr:.6g}"


def _fmt_mib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib:.0f}"
