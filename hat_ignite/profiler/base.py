"""What every hat-ignite profiler shares: sections, handler wrapping, and building from configs.

A profiler sees a run as nested *sections*: the data wait, each event handler (named by event
and handler, HAT callbacks as ``Class.on_hook``), the process function, and, inside it, the
phases the batch processor reports (``forward``, ``backward``, ``optimizer``) and the handlers
of the HAT events it fires. :class:`ProfilerBase` turns a run into ``begin(name)`` /
``end()`` calls; a subclass decides what a section is (:class:`~hat_ignite.profiler.SimpleProfiler`
times it, :class:`~hat_ignite.profiler.TorchProfiler` labels it in a torch.profiler trace).

It costs nothing when no profiler is given: the engine's ``phase_profiler`` stays ``None`` and
no handler is wrapped. With one, every handler is wrapped when the run starts (the way Ignite's
``HandlersTimeProfiler`` does it) and unwrapped when it ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from ignite.engine import Events

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["ProfilerBase", "build_profiler", "DATA_WAIT", "STEP_OTHER"]

#: Section names used by the engine side; processors add ``forward``/``backward``/``optimizer``.
DATA_WAIT = "data wait"
STEP_OTHER = "step (rest of the process function)"

_NAMES = {"simple": "SimpleProfiler", "simpleprofiler": "SimpleProfiler", "torch": "TorchProfiler",
          "torchprofiler": "TorchProfiler"}


def _handler_name(handler: Callable) -> str:
    target = getattr(handler, "__wrapped__", handler)
    return getattr(target, "__qualname__", None) or type(target).__qualname__


def _event_name(event: Any) -> str:
    return getattr(event, "name", None) or str(event)


class ProfilerBase:
    """Base of the profilers a loop takes as ``profiler=``.

    Subclasses implement :meth:`begin` and :meth:`end` (sections nest: every ``begin`` is closed
    by one ``end``) and may override :meth:`run_started` / :meth:`run_finished`.
    """

    def begin(self, name: str) -> None:
        """Open the section ``name`` inside the open one."""
        raise NotImplementedError

    def end(self) -> None:
        """Close the innermost open section."""
        raise NotImplementedError

    def run_started(self, engine: LoopBase) -> None:
        """Called first when the run starts, before any other handler."""

    def run_finished(self, engine: LoopBase) -> None:
        """Called last when the run completes, after ``on_loop_end``."""

    # -- attaching -------------------------------------------------------------------------------
    def attach(self, engine: LoopBase) -> None:
        """Profile the runs of ``engine``: phases, data wait and every handler from the next run on."""
        engine.phase_profiler = self
        engine.add_event_handler(Events.STARTED, self._started)
        started = engine._event_handlers[Events.STARTED]
        started.insert(0, started.pop())  # first: time every other STARTED handler too
        engine.add_event_handler(Events.COMPLETED, self._completed)
        if not hasattr(self, "_inside"):  # the first engine: a nested loop may share this profiler
            self._inside = 0  # profiled handlers / process functions running now
            self._data_t0: float | None = None

    def _own(self, func: Callable) -> bool:
        return getattr(func, "__self__", None) is self

    def _started(self, engine: LoopBase) -> None:
        self._restore(engine)  # a previous run of this engine raised and left its wrappers
        if not self._inside:  # not a loop nested in a profiled handler (Validation sharing it)
            self.run_started(engine)
        handlers = engine._event_handlers
        completed = handlers[Events.COMPLETED]
        mine = [h for h in completed if self._own(h[0])]
        completed[:] = [h for h in completed if not self._own(h[0])] + mine  # ours runs last
        for event in list(handlers):
            entries = handlers[event]
            for i, (func, *rest) in enumerate(entries):
                if not self._own(func) and not hasattr(func, "_profiled"):
                    entries[i] = (self._timed(func, f"{_event_name(event)}: {_handler_name(func)}"), *rest)
        process = engine._process_function

        def timed_process(eng: Any, batch: Any) -> Any:
            self.begin(STEP_OTHER)
            self._inside += 1
            try:
                return process(eng, batch)
            finally:
                self._inside -= 1
                self.end()

        timed_process._profiled = process  # type: ignore[attr-defined]
        engine._process_function = timed_process
        for event, func in ((Events.GET_BATCH_STARTED, self._data_begin), (Events.GET_BATCH_COMPLETED, self._data_end),
                            (Events.DATALOADER_STOP_ITERATION, self._data_end)):
            engine.add_event_handler(event, func)
            if event is not Events.GET_BATCH_STARTED:
                entries = handlers[event]
                entries.insert(0, entries.pop())

    def _completed(self, engine: LoopBase) -> None:
        self._restore(engine)
        if not self._inside:
            self.run_finished(engine)

    def _restore(self, engine: LoopBase) -> bool:
        """Put back the handlers and the process function the run started with; whether any was wrapped."""
        found = False
        for entries in engine._event_handlers.values():
            for i, (func, *rest) in enumerate(entries):
                if getattr(func, "_profiled_by", None) is self:
                    entries[i] = (func._profiled, *rest)
                    found = True
        original = getattr(engine._process_function, "_profiled", None)
        if original is not None:
            engine._process_function = original
        for event, func in ((Events.GET_BATCH_STARTED, self._data_begin), (Events.GET_BATCH_COMPLETED, self._data_end),
                            (Events.DATALOADER_STOP_ITERATION, self._data_end)):
            if engine.has_event_handler(func, event):
                engine.remove_event_handler(func, event)
        self._data_t0 = None
        return found

    def _data_begin(self) -> None:
        self._data_t0 = time.perf_counter()
        self.begin(DATA_WAIT)

    def _data_end(self) -> None:
        if self._data_t0 is not None:
            self._data_t0 = None
            self.end()

    def _timed(self, func: Callable, name: str) -> Callable:
        begin, end = self.begin, self.end

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin(name)
            self._inside += 1
            try:
                return func(*args, **kwargs)
            finally:
                self._inside -= 1
                end()

        timed._profiled = func  # type: ignore[attr-defined]
        timed._profiled_by = self  # type: ignore[attr-defined]
        timed.__qualname__ = _handler_name(func)
        parent = getattr(func, "_parent", None)
        timed._parent = parent if parent is not None else (lambda: func)  # type: ignore[attr-defined]
        return timed


def build_profiler(profiler: Any) -> ProfilerBase | Any:
    """Turn a loop's ``profiler`` argument into a profiler object.

    Args:
        profiler: ``None``; a name (``"simple"``/``"SimpleProfiler"``, ``"torch"``/
            ``"TorchProfiler"``); a config dict with a ``type`` key; or a profiler instance
            (returned as is).

    >>> type(build_profiler("simple")).__name__, build_profiler(None)
    ('SimpleProfiler', None)
    """
    if profiler is None or isinstance(profiler, ProfilerBase):
        return profiler
    if isinstance(profiler, str):
        name = _NAMES.get(profiler.lower())
        if name is None:
            raise ValueError(
                f"profiler={profiler!r} is not a profiler name; use 'simple' (SimpleProfiler), 'torch' "
                f"(TorchProfiler), a config dict such as {{'type': 'SimpleProfiler'}}, or an instance."
            )
        profiler = {"type": name}
    if isinstance(profiler, dict) and "type" in profiler:
        from hat_ignite.registry import build_from_cfg

        return build_from_cfg(profiler, key_path="profiler")
    return profiler
