"""HAT-style metrics whose math is torchmetrics'.

Every metric has ``update(...)``, ``get() -> (names, values)`` and ``reset()``. Classification
and segmentation metrics take HAT's argument order ``update(labels, preds)``;
:class:`MetricAdapter` gives a torchmetrics or Ignite metric that interface. torchmetrics is
imported when a metric is first updated, not when this package is imported.

>>> import torch
>>> from hat_ignite.metrics import Accuracy, LossShow
>>> metrics = [Accuracy(), LossShow()]
>>> metrics[0].update(torch.tensor([1, 0]), torch.tensor([[0.2, 0.8], [0.3, 0.7]]))
>>> metrics[1].update(torch.tensor(0.25))
>>> metric_name_values(metrics)
[('accuracy', 0.5), ('loss', 0.25)]
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.metrics.average_precision": ["MeanAveragePrecision"],
    "hat_ignite.metrics.base": ["EvalMetric", "iter_metrics", "metric_name_values", "reset_metrics"],
    "hat_ignite.metrics.classification": ["Accuracy", "TopKAccuracy"],
    "hat_ignite.metrics.interop": ["MetricAdapter"],
    "hat_ignite.metrics.loss": ["LossShow"],
    "hat_ignite.metrics.segmentation": ["MeanIOU", "MeanIoU"],
}

__all__ = [
    "EvalMetric",
    "Accuracy",
    "TopKAccuracy",
    "LossShow",
    "MeanIoU",
    "MeanIOU",
    "MeanAveragePrecision",
    "MetricAdapter",
    "iter_metrics",
    "metric_name_values",
    "reset_metrics",
]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.metrics.average_precision import MeanAveragePrecision
    from hat_ignite.metrics.base import EvalMetric, iter_metrics, metric_name_values, reset_metrics
    from hat_ignite.metrics.classification import Accuracy, TopKAccuracy
    from hat_ignite.metrics.interop import MetricAdapter
    from hat_ignite.metrics.loss import LossShow
    from hat_ignite.metrics.segmentation import MeanIOU, MeanIoU
