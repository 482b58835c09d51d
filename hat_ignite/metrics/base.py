"""`EvalMetric`: HAT's metric interface, and helpers to read any metric's values.

A HAT metric accumulates with ``update(...)``, reports with ``get() -> (names, values)`` and
starts over with ``reset()``. The built-in metrics compute what torchmetrics computes and,
under ``torch.distributed``, ``get()`` returns the value over every rank. ``LossShow`` and top-1
``Accuracy`` keep running sums in small tensors (:mod:`hat_ignite.metrics.running`), so an update
costs a few tensor ops and no host-device sync; the others keep their state in torchmetrics
objects (created on the first update, on the device of the first input), and torchmetrics is
imported only when the first of those is updated.

Subclasses that only need a mean can do as HAT metrics do: add to ``self.sum_metric`` and
``self.num_inst`` in ``update`` and inherit :meth:`EvalMetric.compute`:

>>> class MeanAbs(EvalMetric):
...     def update(self, values):
...         self.sum_metric += float(values.abs().sum())
...         self.num_inst += values.numel()
>>> m = MeanAbs("mean_abs")
>>> m.update(torch.tensor([1.0, -3.0]))
>>> m.get()
('mean_abs', 2.0)
>>> metric_name_values([m])
[('mean_abs', 2.0)]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = ["EvalMetric", "TorchmetricState", "iter_metrics", "metric_name_values", "reset_metrics", "to_python"]


def _world_size() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def to_python(value: Any) -> Any:
    """Turn a metric value into plain Python: a float, or a list of floats.

    >>> import numpy as np
    >>> to_python(torch.tensor(0.5)), to_python(torch.tensor([1, 2])), to_python(np.float32(3))
    (0.5, [1.0, 2.0], 3.0)
    """
    if isinstance(value, torch.Tensor):
        if not value.dim():  # one read (a sync on an accelerator) instead of three tensor ops
            return float(value.item())
        value = value.detach().float().cpu()
        return float(value) if value.numel() == 1 else [float(v) for v in value.flatten()]
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy scalars and arrays
        return to_python(value.tolist())
    return value


class TorchmetricState:
    """A torchmetrics metric built on first use, on the device of the first input.

    Args:
        factory: a function that imports torchmetrics and returns a new metric.

    >>> def make():
    ...     from torchmetrics.aggregation import MeanMetric
    ...     return MeanMetric()
    >>> state = TorchmetricState(make)
    >>> state.compute() is None   # nothing seen yet
    True
    >>> state.update(torch.tensor([1.0, 2.0]))
    >>> float(state.compute())
    1.5
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory = factory
        self.metric: Any = None
        self.updates = 0

    def update(self, *tensors: torch.Tensor) -> None:
        """Update the metric, first moving it to the device of ``tensors[0]`` if needed."""
        device = tensors[0].device
        if self.metric is None:
            self.metric = self.factory().to(device)
        elif self.metric.device != device:
            self.metric = self.metric.to(device)
        self.metric.update(*tensors)
        self.updates += 1

    def compute(self) -> torch.Tensor | None:
        """The metric's value, or ``None`` when nothing was seen (on a single process)."""
        if self.metric is None or (self.updates == 0 and _world_size() == 1):
            return None
        return self.metric.compute()

    def reset(self) -> None:
        """Forget everything seen so far."""
        if self.metric is not None:
            self.metric.reset()
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        """What was seen so far: the update count and the torchmetrics metric's state tensors."""
        metric = self.metric
        states = None if metric is None else {name: getattr(metric, name) for name in metric._defaults}
        return {"updates": self.updates, "states": states}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (the metric is built, on the CPU, when needed)."""
        self.reset()
        states = state.get("states")
        if states:
            if self.metric is None:
                self.metric = self.factory()
            device = self.metric.device
            for name, value in states.items():
                if isinstance(value, torch.Tensor):
                    value = value.to(device)
                elif isinstance(value, list):
                    value = [v.to(device) if isinstance(v, torch.Tensor) else v for v in value]
                setattr(self.metric, name, value)
            self.metric._update_count = int(state.get("updates") or 0)
            self.metric._computed = None
        self.updates = int(state.get("updates") or 0)


class EvalMetric:
    """Base class of HAT metrics: ``update(...)``, ``get() -> (names, values)``, ``reset()``.

    The default state is HAT's pair of accumulators ``sum_metric`` and ``num_inst``;
    :meth:`compute` returns their ratio (summed over every rank under ``torch.distributed``), or
    ``nan`` before any update. Metrics with other state override :meth:`compute` and
    :meth:`reset`.

    Args:
        name: the name :meth:`get` reports (a list of names for a metric with several values).
    """

    def __init__(self, name: str | Sequence[str] = "metric") -> None:
        if not name or not isinstance(name, (str, list, tuple)):
            raise ValueError(
                f"{type(self).__name__}: name must be a non-empty string (or a list of names for a "
                f"metric with several values), got {name!r}."
            )
        self.name = name if isinstance(name, str) else list(name)
        self.sum_metric: Any = 0.0
        self.num_inst: Any = 0

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Accumulate one batch; every metric defines its own arguments."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement update(...) to accumulate a batch (for a mean, "
            f"add to self.sum_metric and self.num_inst)."
        )

    def compute(self) -> Any:
        """``sum_metric / num_inst`` over every rank; ``nan`` when nothing was accumulated."""
        total, count = self.sum_metric, self.num_inst
        if _world_size() > 1:
            import ignite.distributed as idist

            reduced = idist.all_reduce(torch.tensor([float(total), float(count)], dtype=torch.float64))
            # Ignite's stub: a tensor in gives a tensor
            total, count = float(reduced[0]), float(reduced[1])  # type: ignore[index]
        count = float(count)
        return float(total) / count if count else math.nan

    def get(self) -> tuple[str | list[str], float | list[float]]:
        """The metric's name(s) and value(s), as Python floats."""
        return self.name, to_python(self.compute())

    def get_name_value(self) -> list[tuple[str, Any]]:
        """The values as ``(name, value)`` pairs.

        >>> m = EvalMetric("count")
        >>> m.get_name_value()
        [('count', nan)]
        """
        names, values = self.get()
        if isinstance(names, str):
            return [(names, values)]
        if not isinstance(values, (list, tuple)) or len(values) != len(names):
            raise ValueError(
                f"{type(self).__name__}.get() returned {len(names)} names but values {values!r}; "
                f"return one value per name."
            )
        return list(zip(names, values))

    def reset(self) -> None:
        """Forget everything accumulated so far."""
        self.sum_metric = 0.0
        self.num_inst = 0

    def state_dict(self) -> dict[str, Any]:
        """What was accumulated since the last reset (a training checkpoint keeps it).

        HAT's ``sum_metric`` and ``num_inst``, and the state of each :class:`TorchmetricState`
        attribute; metrics with other state extend it. Loadable with
        ``torch.load(weights_only=True)``.

        >>> m = EvalMetric("mean")
        >>> m.sum_metric, m.num_inst = 3.0, 2
        >>> other = EvalMetric("mean")
        >>> other.load_state_dict(m.state_dict())
        >>> other.get()
        ('mean', 1.5)
        """
        parts = {name: value.state_dict() for name, value in vars(self).items() if isinstance(value, TorchmetricState)}
        return {"sum_metric": self.sum_metric, "num_inst": self.num_inst, "parts": parts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue accumulating from a :meth:`state_dict`."""
        self.sum_metric = state.get("sum_metric", 0.0)
        self.num_inst = state.get("num_inst", 0)
        for name, part in (state.get("parts") or {}).items():
            target = getattr(self, name, None)
            if not isinstance(target, TorchmetricState):
                raise ValueError(f"{type(self).__name__}: the saved metric state has {name!r}, which this metric lacks.")
            target.load_state_dict(part)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def iter_metrics(metrics: Any) -> Iterator[Any]:
    """Yield each metric object in ``metrics`` (one metric, a list/tuple, a dict, or ``None``).

    >>> [type(m).__name__ for m in iter_metrics({"a": EvalMetric("a"), "b": [EvalMetric("b")]})]
    ['EvalMetric', 'EvalMetric']
    """
    if metrics is None:
        return
    if isinstance(metrics, Mapping):
        for m in metrics.values():
            yield from iter_metrics(m)
    elif isinstance(metrics, (list, tuple)):
        for m in metrics:
            yield from iter_metrics(m)
    else:
        yield metrics


def _pairs_of(metric: Any) -> tuple[list[tuple[str, Any]], bool]:
    """The metric's ``(name, value)`` pairs, and whether the names are its own (not made up here).

    Methods are looked up on the class: an Ignite ``Metric`` answers any attribute name on the
    instance (``metric.get`` is a callable that builds a ``MetricsLambda``).
    """
    if isinstance(metric, EvalMetric):
        return metric.get_name_value(), True
    cls = type(metric)
    if callable(getattr(cls, "get", None)):  # a HAT-style metric that is not an EvalMetric
        names, values = metric.get()
        if isinstance(names, str):
            return [(names, to_python(values))], True
        return list(zip(names, to_python(values))), True
    if callable(getattr(cls, "compute", None)):  # a torchmetrics or Ignite metric
        value = metric.compute()
        if isinstance(value, Mapping):
            return [(str(k), to_python(v)) for k, v in value.items()], False
        return [(cls.__name__, to_python(value))], False
    raise TypeError(
        f"{cls.__name__} is not a metric: it has neither get() (HAT) nor compute() "
        f"(torchmetrics, Ignite). Use a hat_ignite.metrics metric or subclass EvalMetric."
    )


def metric_name_values(metrics: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` pairs of every metric in ``metrics``, values as Python numbers.

    Accepts HAT metrics (``get()``) and torchmetrics/Ignite metrics (``compute()``) in one metric,
    a list, or a dict. A torchmetrics/Ignite metric is named by its class; a class name already
    taken gets ``_2``, ``_3`` ... so two metrics of one class both show (to choose the names,
    wrap them in :class:`~hat_ignite.metrics.MetricAdapter`):

    >>> from torchmetrics.aggregation import MaxMetric
    >>> low, high = MaxMetric(), MaxMetric()
    >>> low.update(torch.tensor(1.0)); high.update(torch.tensor(5.0))
    >>> metric_name_values([low, high])
    [('MaxMetric', 1.0), ('MaxMetric_2', 5.0)]
    """
    pairs: list[tuple[str, Any]] = []
    taken: set[str] = set()
    for metric in iter_metrics(metrics):
        found, own_names = _pairs_of(metric)
        for name, value in found:
            if not own_names and name in taken:
                base, n = name, 2
                while f"{base}_{n}" in taken:
                    n += 1
                name = f"{base}_{n}"
            taken.add(name)
            pairs.append((name, value))
    return pairs


def reset_metrics(metrics: Any) -> None:
    """Call ``reset()`` on every metric in ``metrics``."""
    for metric in iter_metrics(metrics):
        reset = getattr(metric, "reset", None) if callable(getattr(type(metric), "reset", None)) else None
        if reset is None:
            raise TypeError(f"{type(metric).__name__} has no reset() method, so it cannot be used as a metric.")
        reset()
