"""`TorchProfiler`: a torch.profiler trace of a window of steps, with the loop's phases labelled."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import torch

from hat_ignite.profiler.base import ProfilerBase

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["TorchProfiler"]

logger = logging.getLogger(__name__)


class TorchProfiler(ProfilerBase):
    """Record ``torch.profiler`` traces of chosen steps, viewable in TensorBoard or Chrome.

    The profiler skips ``skip_first`` steps, then cycles ``wait`` idle steps, ``warmup`` steps
    recorded and thrown away, and ``active`` steps recorded, ``repeat`` times (torch's
    ``torch.profiler.schedule``). After each active window it writes
    ``<out_dir>/<worker_name>.<step>.<ms>.pt.trace.json``: open the folder with TensorBoard's
    profiler plugin (``tensorboard --logdir <out_dir>``), or load the file in
    ``chrome://tracing`` or https://ui.perfetto.dev. The loop's phases (``data wait``,
    ``forward``, ``backward``, ``optimizer``) and every event handler appear in the trace as
    named ranges, next to torch's operators (and CUDA kernels on a CUDA loop).

    Args:
        wait: steps to skip at the start of each cycle.
        warmup: steps recorded but discarded (the profiler's own start-up cost) each cycle.
        active: steps recorded and written each cycle.
        repeat: number of cycles (``0``: until the run ends).
        skip_first: steps to skip before the first cycle.
        out_dir: folder for the trace files (created when needed).
        worker_name: file name prefix; default ``<host>_<pid>``.
        record_shapes: record operator input shapes.
        profile_memory: record tensor memory allocation.
        with_stack: record Python source locations of operators.

    Attributes:
        trace_files: paths of the trace files written so far.
    """

    def __init__(
        self,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        skip_first: int = 0,
        out_dir: str = "torch_profiler",
        worker_name: str | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
    ) -> None:
        for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                                 ("repeat", repeat, 0), ("skip_first", skip_first, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"TorchProfiler({name}={value!r}): give an integer >= {low}.")
        self.wait, self.warmup, self.active, self.repeat, self.skip_first = wait, warmup, active, repeat, skip_first
        self.out_dir = out_dir
        self.worker_name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.trace_files: list[str] = []
        self._prof: Any = None
        self._ranges: list[Any] = []
        self._steps = 0

    def begin(self, name: str) -> None:
        rf = torch.autograd.profiler.record_function(name)
        rf.__enter__()
        self._ranges.append(rf)

    def end(self) -> None:
        self._ranges.pop().__exit__(None, None, None)

    def _write(self, prof: Any) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"{self.worker_name}.{self._steps}.{int(time.time() * 1000)}.pt.trace.json")
        prof.export_chrome_trace(path)
        self.trace_files.append(path)
        logger.info("torch.profiler trace written: %s", path)

    def _step(self) -> None:
        self._steps += 1
        if self._prof is not None:
            self._prof.step()

    def attach(self, engine: LoopBase) -> None:
        super().attach(engine)
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_COMPLETED, self._step)

    def run_started(self, engine: LoopBase) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        self._ranges = []
        self._steps = 0
        activities = [ProfilerActivity.CPU]
        if engine.torch_device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat,
                              skip_first=self.skip_first),
            on_trace_ready=self._write,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._prof.start()

    def run_finished(self, engine: LoopBase) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()
