"""Where `Checkpoint` finds the value of its monitored metric, to decide which checkpoint is best."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Sequence

import torch

__all__ = ["monitored_value", "metric_names", "missing_key_hint"]


def _as_float(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{what} is a tensor of shape {tuple(value.shape)}; the monitored metric must be one number."
            )
        return float(value.item())
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return _as_float(value[0], what)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} is {value!r}; the monitored metric must be one number.") from None


def monitored_value(
    key: str | None, best_refer_metric: Sequence[Any] | None, storage: Any, val_metrics: Any,
    engine_metrics: Any = None,
) -> float | None:
    """The monitored metric's current value, or ``None`` when no metric has one yet.

    Looked up in this order: ``storage[key]`` or a dict in storage holding ``key`` (what
    ``MetricUpdater`` and ``Validation`` put there), ``engine_metrics[key]`` (Ignite metrics'
    ``engine.state.metrics``), then the ``get()`` of ``best_refer_metric`` or of the validation
    metrics: the value named ``key``, or the only value when ``key`` is ``None``.

    Args:
        key: the metric's name (``Checkpoint(monitor_metric_key=...)``).
        best_refer_metric: metrics to read instead of ``val_metrics`` (storage is then not read).
        storage: the hooks' ``storage``.
        val_metrics: the hooks' ``val_metrics``.
        engine_metrics: ``engine.state.metrics``.

    Raises:
        TypeError: the value is not one number.
        ValueError: ``best_refer_metric`` has no value named ``key``, or a metric has several
            values and no ``key`` says which.

    Example:
        >>> monitored_value("accuracy", None, {"monitor_obj": {"accuracy": 0.93}}, None)
        0.93
        >>> monitored_value("accuracy", None, {}, None) is None
        True
    """
    if best_refer_metric is None and key is not None and isinstance(storage, Mapping):
        if key in storage:
            return _as_float(storage[key], f"storage[{key!r}]")
        for name, values in storage.items():  # e.g. storage["monitor_obj"] = {"accuracy": 0.93}
            if isinstance(values, Mapping) and key in values:
                return _as_float(values[key], f"storage[{name!r}][{key!r}]")
        if isinstance(engine_metrics, Mapping) and key in engine_metrics:  # put there by Ignite metrics
            return _as_float(engine_metrics[key], f"engine.state.metrics[{key!r}]")
    metrics = best_refer_metric
    if metrics is None:
        if val_metrics is None:
            return None
        metrics = list(val_metrics.values()) if isinstance(val_metrics, Mapping) else val_metrics
        metrics = metrics if isinstance(metrics, (list, tuple)) else [metrics]
    for metric in metrics:
        if not callable(getattr(type(metric), "get", None)):  # Ignite metrics answer any attribute
            continue
        names, values = metric.get()
        names = list(names) if isinstance(names, (list, tuple)) else [names]
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if key is None:
            if len(values) != 1:
                raise ValueError(
                    f"Checkpoint: {type(metric).__name__}.get() returned {len(values)} values "
                    f"{names}; set monitor_metric_key to the one to monitor."
                )
            return _as_float(values[0], f"{type(metric).__name__} value")
        if key in names:
            return _as_float(values[names.index(key)], f"{type(metric).__name__} value {key!r}")
    if best_refer_metric is not None:
        raise ValueError(
            f"Checkpoint(monitor_metric_key={key!r}): best_refer_metric has no value named "
            f"{key!r}. Use one of the names its get() returns."
        )
    return None


def metric_names(storage: Any, engine_metrics: Any = None) -> list[str]:
    """The names of the results the run has produced so far (sorted, without duplicates).

    The values ``MetricUpdater`` and ``Validation`` put into the storage (a dict per updater)
    and Ignite metrics' ``engine.state.metrics``; not the loop's metric objects, which answer
    with their names before any result exists.

    >>> metric_names({"monitor_obj": {"accuracy": 0.9}, "epoch_time": 1.5}, {"loss": 0.3})
    ['accuracy', 'loss']
    """
    names: set[str] = set()
    if isinstance(storage, Mapping):
        for value in storage.values():
            if isinstance(value, Mapping):
                names.update(str(k) for k in value)
    if isinstance(engine_metrics, Mapping):
        names.update(str(k) for k in engine_metrics)
    return sorted(names)


def missing_key_hint(key: str | None, names: Sequence[str]) -> str:
    """``" Did you mean 'accuracy'?"`` (else the names there are), for a key no metric has.

    >>> missing_key_hint("acuracy", ["accuracy", "lr"])
    " Did you mean 'accuracy'?"
    >>> missing_key_hint("miou", ["accuracy", "lr"])
    " The results have 'accuracy', 'lr'."
    >>> missing_key_hint("acuracy", [])
    ''
    """
    if not names:
        return ""
    close = difflib.get_close_matches(str(key), list(names), n=1, cutoff=0.6)
    if close:
        return f" Did you mean {close[0]!r}?"
    return f" The results have {', '.join(map(repr, names))}."
