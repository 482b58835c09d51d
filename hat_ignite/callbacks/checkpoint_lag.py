"""`LateMetricWatch`: say so when `Checkpoint` chose its best on a metric that was set after it read it.

HAT's ``on_epoch_end`` hooks run first at Ignite's ``EPOCH_COMPLETED``; Ignite handlers the user
added to the trainer's ``EPOCH_COMPLETED`` (an evaluator whose results are copied into
``trainer.state.metrics``, an Ignite metric attached to the trainer) run after them. A
``Checkpoint`` that reads its monitored key from ``state.metrics`` in ``on_epoch_end`` then reads
the previous epoch's value, and its ``best`` is one epoch late. That order cannot be changed from
here without reordering every handler, so the watch checks, after the epoch's last handler,
whether the monitored value changed after the read, and warns once, naming the fixes: run the
evaluation from HAT's ``Validation`` (Ignite handlers attach to ``validation.evaluator``), or list
the handler in ``callbacks`` before the ``Checkpoint``
(``dict(handler=run_evaluator, event="EPOCH_COMPLETED")``), which runs it among the HAT hooks in
list order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ignite.engine import Events

__all__ = ["LateMetricWatch"]

logger = logging.getLogger("hat_ignite.callbacks.checkpoint")

_UNREAD = object()
_MISSING = object()


def _in_storage(key: str, storage: Any) -> bool:
    if not isinstance(storage, Mapping):
        return False
    return key in storage or any(isinstance(v, Mapping) and key in v for v in storage.values())


class LateMetricWatch:
    """Watch one monitored key of a loop's ``state.metrics`` between the read and the epoch's end.

    Args:
        key: the monitored metric's name (``Checkpoint(monitor_metric_key=...)``).
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.warned = False
        self._read: Any = _UNREAD
        self._handle: Any = None

    def start(self, loop: Any) -> None:
        """Check after the ``EPOCH_COMPLETED`` handlers registered so far (called as the loop begins)."""
        self.stop()
        self._read = _UNREAD
        self._handle = loop.add_event_handler(Events.EPOCH_COMPLETED, self._check)

    def stop(self) -> None:
        """Remove the check (called as the loop ends)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def note_read(self, storage: Any, engine_metrics: Any) -> None:
        """Note the value the checkpoint is reading now, unless the storage gives it."""
        if _in_storage(self.key, storage) or not isinstance(engine_metrics, Mapping):
            self._read = _UNREAD
            return
        self._read = engine_metrics.get(self.key, _MISSING)

    def _check(self, engine: Any) -> None:
        read, self._read = self._read, _UNREAD
        if read is _UNREAD or self.warned:
            return
        now = engine.state.metrics.get(self.key, _MISSING)
        if now is read:
            return
        self.warned = True
        before = "no value" if read is _MISSING else f"{read!r}"
        logger.warning(
            "Checkpoint(monitor_metric_key=%r) read state.metrics[%r] in on_epoch_end (%s), and an Ignite "
            "EPOCH_COMPLETED handler of the trainer set it afterwards (%r): HAT hooks run first at "
            "EPOCH_COMPLETED, so the best checkpoint follows the previous epoch's value. Run the evaluation "
            "from HAT's Validation (attach Ignite handlers to validation.evaluator), or list the handler in "
            "callbacks before the Checkpoint as dict(handler=..., event='EPOCH_COMPLETED').",
            self.key, self.key, before, now,
        )
