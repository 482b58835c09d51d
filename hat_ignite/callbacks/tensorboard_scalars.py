"""`StepScalars`: the scalars of one step, written to TensorBoard as one event, on the spot.

tensorboardX's ``add_scalar`` sends every scalar as an event of its own through the writer's
``multiprocessing.Queue`` (pickled by a feeder thread, piped, unpickled and written by a logger
thread): about 90 µs of CPU for one scalar, far more than the value. :class:`StepScalars`
collects the scalars a callback writes at a step and writes them as one ``Summary`` with a value
per tag, straight into the event file, on the calling thread: through the ``EventsWriter`` the
writer's logger thread writes with, under that writer's own lock, so records never interleave.
That takes 10–20 µs for a point's four scalars. TensorBoard (and ``hat-curves``) read each
value under its tag at that step, exactly as if each had been written alone. Tags are cleaned as
``add_scalar`` cleans them, by tensorboardX's own ``summary.scalar``, once per tag.

Why not tensorboardX's public ``file_writer.add_summary``: besides its cost (48–78 µs a point
against 15–25 µs, docs/benchmarks.md), its events wait in the writer's queue, and
``writer.flush()`` flushes the file without waiting for that queue. A point handed over just
before an epoch end's flush (the epoch's validation accuracy) could then sit unwritten until the
next flush and be lost by a kill, which the resume guarantee (every point on disk at a checkpoint
is kept, tests/test_resume_history.py) does not allow. Writing on the calling thread puts each
point in the file before the flush that follows it. The writer's ``EventsWriter`` is reached
through tensorboardX attributes that are not part of its documented API; a tensorboardX without
them gets the queued path (below).

Events other code adds through the writer (images from a ``tb_update_funcs`` function ...) still
go through the queue, so they can land in the file after scalars of later steps; the points of
each tag still come in step order. The file is flushed when the writer is (``writer.flush()``,
``writer.close()``) and, as tensorboardX's logger thread does for queued events, once
``flush_secs`` have passed since the last flush, so a running job's points reach the disk within
that time. A writer without that ``EventsWriter`` (another tensorboardX version,
``write_to_disk=False``) or one with a ``purge_step`` (whose purge marker must reach the file
before any new point) gets the events through ``file_writer.add_summary`` instead.

>>> import tempfile
>>> from tensorboardX import SummaryWriter
>>> from hat_ignite.visualize.event_file import event_files, read_scalars
>>> logdir = tempfile.mkdtemp()
>>> writer = SummaryWriter(logdir=logdir)
>>> scalars = StepScalars(writer)
>>> scalars.add("loss/cls", 0.5, step=9)
>>> scalars.add("lr group 0", 0.1, step=9)   # "lr_group_0", as add_scalar would name it
>>> scalars.flush()
>>> writer.close()
>>> read_scalars(event_files(logdir)[0])
{'loss/cls': [(9, 0.5)], 'lr_group_0': [(9, 0.10000000149011612)]}
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["StepScalars", "direct_events_writer"]

_DEFAULT_FLUSH_SECS = 120.0  # tensorboardX's default


def direct_events_writer(writer: Any) -> Any:
    """The ``EventsWriter`` that a tensorboardX ``SummaryWriter`` writes its file through, or ``None``.

    ``None`` when the writer has none we can write to alongside its logger thread: another layout
    (a tensorboardX version without it), no file (``write_to_disk=False``), a closed file, or a
    ``purge_step``.
    """
    if getattr(writer, "purge_step", None) is not None:
        return None
    file_writer = getattr(writer, "file_writer", None)
    event_file_writer = getattr(file_writer, "event_writer", None)
    if getattr(event_file_writer, "_closed", True):
        return None
    events = getattr(event_file_writer, "_ev_writer", None)
    try:
        from tensorboardX.event_file_writer import EventsWriter
    except ImportError:  # pragma: no cover - tensorboardX without the module
        return None
    if not isinstance(events, EventsWriter) or not hasattr(events, "_lock"):
        return None
    return events


class StepScalars:
    """Collects ``(tag, value)`` pairs per step; :meth:`flush` writes each step as one event.

    Args:
        writer: a tensorboardX ``SummaryWriter``.
        flush_secs: flush the event file once this many seconds passed since the last flush
            (pass the writer's own ``flush_secs``; ``None``: tensorboardX's default, 120).
    """

    def __init__(self, writer: Any, flush_secs: float | None = None) -> None:
        self.writer = writer
        self.flush_secs = _DEFAULT_FLUSH_SECS if flush_secs is None else float(flush_secs)
        self._last_file_flush = time.monotonic()
        self._pending: dict[int, list[tuple[str, float]]] = {}
        self._tags: dict[str, str] = {}

    @property
    def pending(self) -> bool:
        """Whether scalars wait for the next :meth:`flush`."""
        return bool(self._pending)

    def add(self, tag: str, value: float, step: int) -> None:
        """Add a scalar of ``step``; it is written by the next :meth:`flush`."""
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

    def flush(self) -> None:
        """Write the collected scalars, one event per step, in the order the steps came."""
        if not self._pending:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        pending, self._pending = self._pending, {}
        file_writer = self.writer.file_writer
        if file_writer is None:  # the SummaryWriter was closed: nothing to write to
            return
        # looked up at each flush, so a file closed or reopened since is noticed; a closed one gets
        # add_summary, which drops the events as tensorboardX does
        events = direct_events_writer(self.writer)
        for step, pairs in pending.items():
            summary = Summary(value=[Summary.Value(tag=self._clean(tag), simple_value=value) for tag, value in pairs])
            if events is None:
                file_writer.add_summary(summary, step)
            else:
                events.write_event(Event(summary=summary, step=int(step), wall_time=time.time()))
        if events is not None:
            now = time.monotonic()
            if now - self._last_file_flush >= self.flush_secs:
                events.flush()
                self._last_file_flush = now
