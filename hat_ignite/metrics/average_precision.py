"""Mean average precision of a classifier: `MeanAveragePrecision`, computed by torchmetrics.

torchmetrics' detection mAP needs a COCO back end (pycocotools or faster-coco-eval) that is not a
dependency of this project; its classification average precision needs nothing more, so that is
what this metric offers: the area under each class's precision-recall curve (one class against the
rest), averaged over the classes that occur.
"""

from __future__ import annotations

from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric, TorchmetricState, to_python
from hat_ignite.metrics.classification import _as_labels, _as_tensor

__all__ = ["MeanAveragePrecision"]


class MeanAveragePrecision(EvalMetric):
    """Macro-averaged average precision over classes, from class scores.

    Scores outside ``[0, 1]`` are taken as logits and turned into probabilities with a softmax
    first (torchmetrics' convention), which can change the ranking within a class.

    Args:
        num_classes: the number of classes (``preds`` carry one score per class).
        name: the name reported by :meth:`get`.
        ignore_index: a label value that is not counted.

    Example:
        >>> mean_ap = MeanAveragePrecision(num_classes=3)
        >>> labels = torch.tensor([0, 1, 2, 2])
        >>> scores = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5], [0.58, 0.4, 0.02]])
        >>> mean_ap.update(labels, scores)
        >>> name, value = mean_ap.get()
        >>> name, round(value, 4)   # classes 0 and 1: AP 1; class 2: its positives rank 1st and 4th, AP (1/1 + 2/4) / 2
        ('mean_ap', 0.9167)
    """

    def __init__(self, num_classes: int, name: str = "mean_ap", ignore_index: int | None = None) -> None:
        super().__init__(name)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"MeanAveragePrecision: num_classes must be an integer >= 2, got {num_classes!r}.")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self._state = TorchmetricState(self._factory)

    def _factory(self) -> Any:
        from torchmetrics.classification import MulticlassAveragePrecision

        return MulticlassAveragePrecision(
            num_classes=self.num_classes, average="macro", thresholds=None, ignore_index=self.ignore_index
        )

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` ``(N,)`` class indices and ``preds`` ``(N, num_classes)`` scores."""
        owner = type(self).__name__
        labels = _as_labels(labels, owner)
        preds = _as_tensor(preds, "preds", owner)
        if preds.ndim < 2 or preds.shape[1] != self.num_classes:
            raise ValueError(
                f"{owner}.update: preds must hold one score per class, shape (N, {self.num_classes}), got "
                f"{tuple(preds.shape)}. Pass update(labels, preds) in HAT's order (labels first)."
            )
        self._state.update(preds.float(), labels.to(preds.device))

    def compute(self) -> Any:
        """The macro average precision over every rank; ``nan`` before any update."""
        value = self._state.compute()
        return float("nan") if value is None else to_python(value)

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._state.reset()
