"""The best-checkpoint decision of :class:`~hat_ignite.callbacks.checkpoint.Checkpoint`.

Mixed into ``Checkpoint``: whether the monitored value is a new best, and, at the loop's end, the
error for a monitored key no result of the run ever had.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from hat_ignite.callbacks.checkpoint_monitor import metric_names, missing_key_hint, monitored_value
from hat_ignite.callbacks.late_metrics import LateMetricsWatch

__all__ = ["BestMetricMixin"]

logger = logging.getLogger("hat_ignite.callbacks.checkpoint")  # the lines read as Checkpoint's own


class BestMetricMixin:
    """The best value so far of ``monitor_metric_key``, as ``Checkpoint`` judges it."""

    mode: str | None
    monitor_metric_key: str | None
    best_refer_metric: Any
    best: float | None
    _lag: LateMetricsWatch | None
    _warned_missing: bool
    _missing_names: list[str]

    if TYPE_CHECKING:  # Checkpoint's

        @property
        def last_path(self) -> str: ...

    def _update_best(self, storage: Any, val_metrics: Any, engine_metrics: Any = None, quiet: bool = False) -> bool:
        """Whether the monitored value is a new best (then kept); ``quiet``: no warning when it is missing."""
        if self.mode is None:
            return False
        if self._lag is not None:
            self._lag.note_read(engine_metrics, storage)
        value = monitored_value(self.monitor_metric_key, self.best_refer_metric, storage, val_metrics,
                                engine_metrics)
        if value is None and quiet:
            return False
        if value is None:
            names = metric_names(storage, engine_metrics)
            if not self._warned_missing or (names and not self._missing_names):
                logger.warning(
                    "Checkpoint: no value for the monitored metric %r yet (not in storage, state.metrics, "
                    "best_refer_metric or val_metrics); best checkpoint not updated.%s", self.monitor_metric_key,
                    missing_key_hint(self.monitor_metric_key, names),
                )
                self._warned_missing = True
            self._missing_names = names or self._missing_names
            return False
        if math.isnan(value):
            return False
        better = self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        if better:
            self.best = value
        return better

    def _check_best_written(self) -> None:
        """At the loop's end: a monitored key that no result of the run ever had is an error.

        The results had other names (so validation ran), yet no ``best`` was written: the key is
        misspelt, and the next stage, which loads ``best``, could not start.
        """
        if self.mode is None or self.best is not None or not self._missing_names:
            return
        raise ValueError(
            f"Checkpoint(monitor_metric_key={self.monitor_metric_key!r}): no result of this run had that "
            f"key, so no best checkpoint was written.{missing_key_hint(self.monitor_metric_key, self._missing_names)} "
            f"Fix monitor_metric_key and train again; this run's checkpoints (and {self.last_path}) are kept."
        )
