"""`MetricAdapter`: a torchmetrics or Ignite metric with HAT's interface and argument order.

HAT metric update functions call ``metric.update(labels, preds)``; torchmetrics metrics take
``update(preds, target)`` and Ignite metrics ``update((y_pred, y))``. Wrapped in a
``MetricAdapter``, either kind takes HAT's call, reports under the name you give it through
``get()``, and can sit in a ``MetricUpdater`` or a loop's ``train_metrics`` / ``val_metrics``
next to the built-in metrics, so the shipped configs' update functions need no change:

>>> import torch
>>> from torchmetrics.classification import MulticlassF1Score
>>> from ignite.metrics import Accuracy as IgniteAccuracy
>>> f1_macro = MetricAdapter(MulticlassF1Score(num_classes=3, average="macro"), name="f1_macro")
>>> f1_micro = MetricAdapter(MulticlassF1Score(num_classes=3, average="micro"), name="f1_micro")
>>> acc = MetricAdapter(IgniteAccuracy(), name="ignite_accuracy")
>>> labels, logits = torch.tensor([0, 1, 2, 2]), torch.eye(3)[[0, 1, 1, 2]]
>>> for metric in (f1_macro, f1_micro, acc):
...     metric.update(labels, logits)          # HAT's order
>>> [(name, round(value, 4)) for m in (f1_macro, f1_micro, acc) for name, value in m.get_name_value()]
[('f1_macro', 0.7778), ('f1_micro', 0.75), ('ignite_accuracy', 0.75)]

In a config: ``dict(type="hat_ignite.metrics.MetricAdapter", name="f1",
metric=dict(type="torchmetrics.classification.MulticlassF1Score", num_classes=10))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric, to_python

__all__ = ["MetricAdapter", "foreign_metric_kind", "is_ignite_metric"]


def is_ignite_metric(metric: Any) -> bool:
    """Whether ``metric`` is an Ignite ``Metric`` (checked by class, without importing Ignite's metrics).

    >>> from ignite.metrics import Accuracy
    >>> is_ignite_metric(Accuracy()), is_ignite_metric(EvalMetric("m"))
    (True, False)
    """
    return any(c.__module__.startswith("ignite.metrics") and c.__name__ == "Metric" for c in type(metric).__mro__)


def foreign_metric_kind(metric: Any) -> str | None:
    """``"torchmetrics"`` or ``"Ignite"`` for a metric of that library, else ``None``.

    Found by the class's module name, so torchmetrics is not imported. A :class:`MetricAdapter`
    is none (it takes HAT's call).

    >>> from ignite.metrics import Precision
    >>> foreign_metric_kind(Precision()), foreign_metric_kind(MetricAdapter(Precision()))
    ('Ignite', None)
    """
    if isinstance(metric, EvalMetric):
        return None
    modules = [c.__module__ for c in type(metric).__mro__]
    if any(m == "torchmetrics" or m.startswith("torchmetrics.") for m in modules):
        return "torchmetrics"
    return "Ignite" if is_ignite_metric(metric) else None


class MetricAdapter(EvalMetric):
    """HAT's ``update(labels, preds)`` / ``get()`` / ``reset()`` over a torchmetrics or Ignite metric.

    ``update`` with two positional arguments passes them swapped: ``metric.update(preds,
    labels)`` to a torchmetrics metric, ``metric.update((preds, labels))`` to an Ignite metric;
    with one argument (``MeanMetric``, ``ignite.metrics.Average``) it is passed as it is.
    A torchmetrics metric is moved to the device of the first tensor it sees.

    Args:
        metric: the torchmetrics or Ignite metric, or its config (``type`` a dotted path).
        name: the name ``get()`` reports; ``None`` uses the metric's class name. A metric whose
            ``compute()`` returns a dict reports ``name/key`` for each entry.
    """

    def __init__(self, metric: Any, name: str | None = None) -> None:
        if isinstance(metric, Mapping) and "type" in metric:
            from hat_ignite.registry import build_from_cfg  # configs are optional: import on use

            metric = build_from_cfg(dict(metric), key_path="MetricAdapter.metric")
        for method in ("update", "compute", "reset"):
            if not callable(getattr(type(metric), method, None)):
                raise TypeError(
                    f"MetricAdapter needs a torchmetrics or Ignite metric (with update, compute and "
                    f"reset), got {type(metric).__name__}, which has no {method}()."
                )
        super().__init__(name or type(metric).__name__)
        self.metric = metric
        self.ignite = is_ignite_metric(metric)
        self.updates = 0

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Accumulate one batch given in HAT's order: ``update(labels, preds)``."""
        if len(args) == 2:
            labels, preds = args
            args = ((preds, labels),) if self.ignite else (preds, labels)
        elif self.ignite and len(args) > 2:
            args = (args,)
        if not self.ignite and args and isinstance(args[0], torch.Tensor):
            device = getattr(self.metric, "device", None)
            if device is not None and device != args[0].device:
                self.metric = self.metric.to(args[0].device)
        self.metric.update(*args, **kwargs)
        self.updates += 1

    def compute(self) -> Any:
        """The wrapped metric's value; ``nan`` before any update on a single process."""
        if self.updates == 0 and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return math.nan
        return self.metric.compute()

    def get(self) -> tuple[str | list[str], Any]:
        """The name(s) and value(s), as Python floats (one pair per entry of a dict value)."""
        value = self.compute()
        if isinstance(value, Mapping):
            return [f"{self.name}/{k}" for k in value], [to_python(v) for v in value.values()]
        return self.name, to_python(value)

    def reset(self) -> None:
        """Forget everything accumulated so far."""
        self.metric.reset()
        self.updates = 0

    def __repr__(self) -> str:
        return f"MetricAdapter({type(self.metric).__name__}, name={self.name!r})"
