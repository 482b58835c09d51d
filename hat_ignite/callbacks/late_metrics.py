"""`LateMetricsWatch`: say so when a HAT hook read ``state.metrics`` values set after it read them.

HAT's ``on_epoch_end`` hooks run first at Ignite's ``EPOCH_COMPLETED``; handlers the user added to
the trainer's ``EPOCH_COMPLETED`` (an evaluator copying its results into
``trainer.state.metrics``, an Ignite metric attached to the trainer, which completes there) run
after them. A hook reading ``state.metrics`` in ``on_epoch_end`` then reads the previous epoch's
values: ``Checkpoint`` chooses its best one epoch late, ``TensorBoard(update_by="epoch")`` writes
them one epoch late. That order cannot be changed from here without reordering every handler, so
the watch checks, after the epoch's last handler, whether a value read changed after the read,
and warns once, naming the fixes: run the evaluation from HAT's ``Validation`` (Ignite handlers
attach to ``validation.evaluator``), or list the handler in ``callbacks`` before the reading
callback (``dict(handler=run_evaluator, event="EPOCH_COMPLETED")``), which runs it among the HAT
hooks in list order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ignite.engine import Events

__all__ = ["LateMetricsWatch"]

_MISSING = object()


def _in_storage(key: str, storage: Any) -> bool:
    if not isinstance(storage, Mapping):
        return False
    return key in storage or any(isinstance(v, Mapping) and key in v for v in storage.values())


class LateMetricsWatch:
    """Watch a loop's ``state.metrics`` between a hook's read and the end of the epoch's handlers.

    Args:
        reader: the reading callback as the warning names it (``"TensorBoard"``).
        consequence: what the late values do, for the warning.
        key: watch only this key (``Checkpoint``'s monitored metric), and not at a read where the
            loop's ``storage`` gives it; ``None``: every value in ``state.metrics``.
        logger: where the warning goes (the reading callback's logger).
    """

    def __init__(self, reader: str, consequence: str, key: str | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.reader, self.consequence, self.key = reader, consequence, key
        self.logger = logger or logging.getLogger(__name__)
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

    def note_read(self, engine_metrics: Any, storage: Any = None) -> None:
        """Note the values read now (the objects themselves: a handler setting one makes a new one)."""
        if not isinstance(engine_metrics, Mapping) or (self.key is not None and _in_storage(self.key, storage)):
            self._read = None
        elif self.key is not None:
            self._read = {self.key: engine_metrics.get(self.key, _MISSING)}
        else:
            self._read = dict(engine_metrics)

    def _check(self, engine: Any) -> None:
        read, self._read = self._read, None
        if read is None or self.warned:
            return
        now = engine.state.metrics
        keys = [self.key] if self.key is not None else sorted(now)
        late = [k for k in keys if now.get(k, _MISSING) is not read.get(k, _MISSING)]
        if not late:
            return
        self.warned = True
        before = ", ".join("no value" if read.get(k, _MISSING) is _MISSING else repr(read[k]) for k in late)
        name = self.reader.split("(", 1)[0]
        self.logger.warning(
            "%s read state.metrics[%s] in on_epoch_end (%s), and an Ignite EPOCH_COMPLETED handler of the trainer "
            "set it afterwards (%s): HAT hooks run first at EPOCH_COMPLETED, so %s. Run the evaluation from HAT's "
            "Validation (attach Ignite handlers to validation.evaluator), or list the handler in callbacks before "
            "the %s as dict(handler=..., event='EPOCH_COMPLETED').",
            self.reader, ", ".join(map(repr, late)), before, ", ".join(repr(now.get(k)) for k in late),
            self.consequence, name,
        )
