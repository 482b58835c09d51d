"""`LateMetricsWatch`: say so when a HAT hook wrote ``state.metrics`` values set after it read them.

HAT's ``on_epoch_end`` hooks run first at Ignite's ``EPOCH_COMPLETED``; handlers the user added to
the trainer's ``EPOCH_COMPLETED`` (an evaluator copying its results into
``trainer.state.metrics``, an Ignite metric attached to the trainer, which completes there) run
after them. ``TensorBoard`` writes ``state.metrics`` in ``on_epoch_end``, so it writes such a
value one epoch late. The order cannot be changed from here without reordering every handler, so
the watch checks after the epoch's handlers whether any value changed after the read, and warns
once, naming the fixes (:mod:`hat_ignite.callbacks.checkpoint_lag` does the same for
``Checkpoint``'s monitored key).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ignite.engine import Events

__all__ = ["LateMetricsWatch"]

logger = logging.getLogger(__name__)

_MISSING = object()


class LateMetricsWatch:
    """Watch a loop's ``state.metrics`` between a hook's read and the end of the epoch's handlers.

    Args:
        reader: the callback that reads, for the message (``"TensorBoard"``).
    """

    def __init__(self, reader: str) -> None:
        self.reader = reader
        self.warned = False
        self._read: dict[str, Any] | None = None
        self._handle: Any = None

    def start(self, loop: Any) -> None:
        """Check after the ``EPOCH_COMPLETED`` handlers registered so far (called as the loop begins)."""
        self.stop()
        if callable(getattr(loop, "add_event_handler", None)):
            self._handle = loop.add_event_handler(Events.EPOCH_COMPLETED, self._check)

    def stop(self) -> None:
        """Remove the check (called as the loop ends)."""
        self._read = None
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def note_read(self, metrics: Any) -> None:
        """Note the values read now (the objects themselves: a handler setting one makes a new one)."""
        self._read = dict(metrics) if isinstance(metrics, Mapping) else {}

    def _check(self, engine: Any) -> None:
        read, self._read = self._read, None
        if read is None or self.warned:
            return
        late = sorted(k for k, v in engine.state.metrics.items() if read.get(k, _MISSING) is not v)
        if not late:
            return
        self.warned = True
        logger.warning(
            "%s wrote state.metrics in on_epoch_end, and an Ignite EPOCH_COMPLETED handler of the trainer set "
            "%s afterwards: HAT hooks run first at EPOCH_COMPLETED, so %s writes those values one epoch late. "
            "Run the evaluation from HAT's Validation (attach Ignite handlers to validation.evaluator), or list "
            "the handler in callbacks before the %s as dict(handler=..., event='EPOCH_COMPLETED').",
            self.reader, ", ".join(map(repr, late)), self.reader, self.reader,
        )
