"""`StepScalars`: a run's scalars in an event file of their own, one event per step, on the spot.

tensorboardX's ``add_scalar`` sends every scalar as an event of its own through the
``SummaryWriter``'s ``multiprocessing.Queue`` (pickled by a feeder thread, piped, unpickled and
written by a logger thread): about 90 µs of CPU for one scalar, far more than the value.
:class:`StepScalars` collects the scalars a callback writes at a step and writes them as one
``Summary`` with a value per tag, on the calling thread, through tensorboardX's public
synchronous ``EventsWriter`` (``write_event``, ``flush``, ``close``), into an event file that
only it writes. TensorBoard (and ``hat-curves``) read each value under its tag at that step,
exactly as if each had been written alone. Tags are cleaned as ``add_scalar`` cleans them, by
tensorboardX's own ``summary.scalar``, once per tag.

When the points reach the disk: :meth:`StepScalars.write` puts the collected events into the
file's buffer and flushes the file once ``flush_secs`` have passed since the last flush (as
tensorboardX's logger thread does), so a running job's points reach the disk within that time;
:meth:`StepScalars.flush` (the ``TensorBoard`` callback's epoch end) writes and flushes at once,
so every point handed over before it, the epoch's validation included, is on disk when it
returns and survives a kill; :meth:`StepScalars.close` (the loop's end) flushes and closes. A
process that exits without closing it (an exception out of ``fit()``) flushes it on exit.

Why a file of its own: tensorboardX's public way into the ``SummaryWriter``'s file,
``file_writer.add_summary``, costs more per point and queues the events, and ``writer.flush()``
does not wait for that queue, so a point handed over just before a flush could still be lost by a
kill (docs/benchmarks.md, "Public APIs"). The file is named as tensorboardX names its files
(``events.out.tfevents.<second>.<host>``) with ``.<nanoseconds>`` and the caller's suffix after
it, so that the files of a directory sort in the order they were made.

>>> import tempfile
>>> from hat_ignite.visualize.event_file import event_files, read_scalars
>>> logdir = tempfile.mkdtemp()
>>> scalars = StepScalars(logdir)
>>> scalars.add("loss/cls", 0.5, step=9)
>>> scalars.add("lr group 0", 0.1, step=9)   # "lr_group_0", as add_scalar would name it
>>> scalars.flush()   # written and on disk, the file still open
>>> read_scalars(event_files(logdir)[0])
{'loss/cls': [(9, 0.5)], 'lr_group_0': [(9, 0.10000000149011612)]}
>>> scalars.close()
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Any

__all__ = ["StepScalars", "summary_writer"]

logger = logging.getLogger(__name__)

_DEFAULT_FLUSH_SECS = 120.0  # tensorboardX's default
_SCALARS_ONLY = ("purge_step",)  # SummaryWriter arguments that apply to the scalars file alone


class StepScalars:
    """Collects ``(tag, value)`` pairs per step and writes each step as one event, into a new event file.

    Args:
        save_dir: the directory of the event file (created if missing).
        flush_secs: :meth:`write` flushes the file once this many seconds passed since the last
            flush (``None``: tensorboardX's default, 120).
        filename_suffix: added to the file's name, after its ``.<nanoseconds>``.
        purge_step: write a purge marker at this step first (what tensorboardX's ``purge_step``
            writes): readers drop the points at this step and later read from earlier files.
    """

    def __init__(
        self, save_dir: str, flush_secs: float | None = None, filename_suffix: str = "", purge_step: int | None = None,
    ) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        os.makedirs(save_dir, exist_ok=True)
        self.flush_secs = _DEFAULT_FLUSH_SECS if flush_secs is None else float(flush_secs)
        self._events: Any = EventsWriter(os.path.join(save_dir, "events"), f".{time.time_ns()}{filename_suffix}")
        self._last_file_flush = time.monotonic()
        self._pending: dict[int, list[tuple[str, float]]] = {}
        self._tags: dict[str, str] = {}
        atexit.register(self._close_at_exit)  # the points of a run that dies with an exception
        if purge_step is not None:
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            self._events.write_event(Event(step=int(purge_step), wall_time=time.time(),
                                           session_log=SessionLog(status=SessionLog.START)))

    @property
    def pending(self) -> bool:
        """Whether scalars wait for the next :meth:`write`."""
        return bool(self._pending)

    @property
    def closed(self) -> bool:
        """Whether the file is closed (what is added from then on is dropped)."""
        return self._events is None

    def add(self, tag: str, value: float, step: int) -> None:
        """Add a scalar of ``step``; it is written by the next :meth:`write` or :meth:`flush`."""
        pairs = self._pending.get(step)
        if pairs is None:
            pairs = self._pending[step] = []
        pairs.append((tag, value))

    def _clean(self, tag: str) -> str:
        clean = self._tags.get(tag)
        if clean is None:
            from tensorboardX.summary import scalar

            clean = self._tags[tag] = scalar(tag, 0.0).value[0].tag
        return clean

    def write(self) -> None:
        """Write the collected scalars, one event per step in the order the steps came; flush the
        file when ``flush_secs`` have passed since the last flush."""
        if not self._pending:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        pending, self._pending = self._pending, {}
        events = self._events
        if events is None:  # closed: nothing to write to
            return
        for step, pairs in pending.items():
            summary = Summary(value=[Summary.Value(tag=self._clean(tag), simple_value=value) for tag, value in pairs])
            events.write_event(Event(summary=summary, step=int(step), wall_time=time.time()))
        if time.monotonic() - self._last_file_flush >= self.flush_secs:
            self._flush_file()

    def flush(self) -> None:
        """Write the collected scalars and flush the file: every point added so far is on disk."""
        self.write()
        if self._events is not None:
            self._flush_file()

    def _flush_file(self) -> None:
        self._events.flush()
        self._last_file_flush = time.monotonic()

    def close(self) -> None:
        """Write the collected scalars, flush and close the file; a second call does nothing.

        Raises:
            OSError: the file cannot take its last points (a full disk); it is closed all the same
                (nothing is retried at exit).
        """
        if self._events is None:
            return
        atexit.unregister(self._close_at_exit)
        try:
            self.write()
        finally:
            events, self._events = self._events, None
            events.close()

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except (OSError, ValueError) as exc:  # the run failed already; its report said so
            logger.debug("closing the TensorBoard scalars file at exit failed: %s", exc)


def summary_writer(save_dir: str, writer_kwargs: dict[str, Any], name_end: str = "") -> Any:
    """A tensorboardX ``SummaryWriter`` on ``save_dir`` with the callback's ``writer_kwargs``.

    Its file is named after the time it is made (``filename_suffix`` ``.<nanoseconds>`` unless
    one is given), so it sorts after the run's scalars file and a resumed run's purge marker. A
    ``purge_step`` is left to the scalars file (a second marker would drop the run's own points).
    ``name_end`` is added to the file's name last (a stage's files end with it).
    """
    from tensorboardX import SummaryWriter

    kwargs = {k: v for k, v in writer_kwargs.items() if k not in _SCALARS_ONLY}
    # tensorboardX names a file by the second and the host only: two writers made in the same
    # second would share a name. The suffix keeps them apart (and in the order they were made).
    kwargs["filename_suffix"] = kwargs.get("filename_suffix", f".{time.time_ns()}") + name_end
    return SummaryWriter(logdir=save_dir, **kwargs)
