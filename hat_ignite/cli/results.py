"""The metric values a stage ends with, as ``hat-train`` / ``hat-predict`` report them.

What a stage reports is what its callbacks computed, wherever the metrics live:

* training metrics: the final values of the loop's ``MetricUpdater`` callbacks (their own
  ``metrics=[...]``, legal in HAT, or the loop's ``train_metrics`` they update); without such a
  callback, the loop's ``train_metrics``;
* validation metrics: the results of the latest validation (the record a ``Validation`` callback
  leaves in ``storage["validation"]``: what its ``MetricUpdater`` logged); without one, the loop's
  ``val_metrics``.

Reading the loop's ``train_metrics`` / ``val_metrics`` alone would report ``nan`` for a config
whose updaters carry their own metrics: the loop's instances are never updated there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["updater_values", "validation_values", "stage_metrics"]

_DEFAULT_KEY = "monitor_obj"  # MetricUpdater's default storage_key


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_value(value: Any) -> bool:
    """A metric value: a number, or a list of numbers (a vector metric)."""
    return _is_number(value) or (isinstance(value, list) and bool(value) and all(_is_number(v) for v in value))


def updater_values(callbacks: Any) -> dict[str, Any] | None:
    """The final values of the ``MetricUpdater`` s among ``callbacks``, merged in list order.

    A name a previous updater already reported is given as ``<storage_key>/<name>``. ``None``
    when no callback has final values.

    >>> class Updater:
    ...     def __init__(self, values, key="monitor_obj"):
    ...         self.final_values, self.storage_key = values, key
    >>> updater_values([Updater({"accuracy": 0.5}), Updater({"accuracy": 0.25}, "task_b"), object()])
    {'accuracy': 0.5, 'task_b/accuracy': 0.25}
    >>> updater_values([Updater(None)]) is None
    True
    """
    merged: dict[str, Any] = {}
    found = False
    for cb in callbacks or []:
        values = getattr(cb, "final_values", None)
        if not isinstance(values, Mapping):
            continue
        found = True
        for name, value in values.items():
            key = name if name not in merged else f"{getattr(cb, 'storage_key', _DEFAULT_KEY)}/{name}"
            merged[key] = value
    return merged if found else None


def validation_values(storage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The metric values of the latest validation record in ``storage``, or ``None`` without one.

    Values stored under ``MetricUpdater``'s default key keep their names; those under another
    key are named ``<key>/<name>`` (as the ``TensorBoard`` callback tags them ``val/<key>/<name>``).

    >>> validation_values({"validation": {"epoch_id": 1, "global_step_id": 20,
    ...                    "results": {"monitor_obj": {"accuracy": 0.75}, "task_b": {"miou": [0.5, 0.25]}}}})
    {'accuracy': 0.75, 'task_b/miou': [0.5, 0.25]}
    >>> validation_values({}) is None
    True
    """
    from hat_ignite.callbacks.validation import STORAGE_KEY

    record = (storage or {}).get(STORAGE_KEY)
    if not isinstance(record, Mapping) or not isinstance(record.get("results"), Mapping):
        return None
    values: dict[str, Any] = {}
    for key, result in record["results"].items():
        if isinstance(result, Mapping):
            for name, value in result.items():
                if _is_value(value):
                    values[name if key == _DEFAULT_KEY else f"{key}/{name}"] = value
        elif _is_number(result):
            values[key] = result
    return values


def stage_metrics(loop: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(train values, validation values)`` of a finished loop (see the module docstring)."""
    from hat_ignite.metrics.base import metric_name_values

    callbacks = getattr(loop, "callbacks", None)
    train = updater_values(callbacks)
    if train is None:
        train = dict(metric_name_values(getattr(loop, "train_metrics", None)))
    val = validation_values(getattr(getattr(loop, "state", None), "storage", None))
    if val is None:
        val = dict(metric_name_values(getattr(loop, "val_metrics", None)))
    return train, val
