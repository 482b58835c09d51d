"""Classification accuracy: `Accuracy` (top-1) and `TopKAccuracy`, computed by torchmetrics.

Both take HAT's argument order, ``update(labels, preds)``: ``labels`` holds class indices of
shape ``(N, ...)``; ``preds`` holds scores (logits or probabilities) of shape ``(N, C, ...)``.
:class:`Accuracy` also accepts predicted class indices of the same shape as ``labels``.
"""

from __future__ import annotations

from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric, TorchmetricState, to_python

__all__ = ["Accuracy", "TopKAccuracy"]


def _as_tensor(value: Any, what: str, owner: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{owner}.update: {what} must be a tensor (or array-like), got {type(value).__name__}.") from exc


def _as_labels(labels: Any, owner: str) -> torch.Tensor:
    labels = _as_tensor(labels, "labels", owner)
    if labels.is_floating_point():
        if not torch.equal(labels, labels.round()):
            raise ValueError(
                f"{owner}.update: labels must be class indices, got non-integral floats. Pass "
                f"update(labels, preds) in HAT's order (labels first), with integer labels."
            )
        labels = labels.long()
    return labels


class _MulticlassAccuracy(EvalMetric):
    """Shared state: a torchmetrics ``MulticlassAccuracy`` (micro average), built on first use."""

    def __init__(self, name: str, top_k: int, num_classes: int | None, ignore_index: int | None) -> None:
        super().__init__(name)
        owner = type(self).__name__
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"{owner}: top_k must be an integer >= 1, got {top_k!r}.")
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"{owner}: num_classes must be an integer >= 2 or None (inferred), got {num_classes!r}.")
        if num_classes is not None and top_k > num_classes:
            raise ValueError(f"{owner}: top_k={top_k} is larger than num_classes={num_classes}.")
        self.top_k = top_k
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self._scores: TorchmetricState | None = None
        self._scores_classes: int | None = None
        self._hits: TorchmetricState | None = None

    def _score_state(self, num_classes: int) -> TorchmetricState:
        if self._scores is None:
            top_k, ignore_index = self.top_k, self.ignore_index

            def factory() -> Any:
                from torchmetrics.classification import MulticlassAccuracy

                return MulticlassAccuracy(
                    num_classes=num_classes, top_k=top_k, average="micro",
                    multidim_average="global", ignore_index=ignore_index,
                )

            self._scores = TorchmetricState(factory)
            self._scores_classes = num_classes
        elif num_classes != self._scores_classes:
            raise ValueError(
                f"{type(self).__name__}.update: preds have {num_classes} classes (dim 1), but earlier "
                f"updates had {self._scores_classes}. Every update must score the same classes."
            )
        return self._scores

    def _update_scores(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        owner = type(self).__name__
        if preds.dim() != labels.dim() + 1 or preds.shape[0] != labels.shape[0] or preds.shape[2:] != labels.shape[1:]:
            raise ValueError(
                f"{owner}.update: preds of shape {tuple(preds.shape)} do not match labels of shape "
                f"{tuple(labels.shape)}; expected preds (N, C, ...) scores for labels (N, ...). Pass "
                f"update(labels, preds) in HAT's order (labels first)."
            )
        num_classes = preds.shape[1]
        if self.num_classes is not None and num_classes != self.num_classes:
            raise ValueError(f"{owner}.update: preds have {num_classes} classes (dim 1), but num_classes={self.num_classes}.")
        if self.top_k > num_classes:
            raise ValueError(f"{owner}.update: top_k={self.top_k} is larger than the {num_classes} classes in preds.")
        if num_classes < 2:
            raise ValueError(f"{owner}.update: preds have a single class column; accuracy needs scores for >= 2 classes.")
        self._score_state(num_classes).update(preds.float(), labels.to(preds.device))

    def compute(self) -> float:
        values = [s.compute() for s in (self._scores, self._hits) if s is not None]
        values = [v for v in values if v is not None]
        if not values:
            return float("nan")
        if len(values) > 1:
            raise ValueError(
                f"{type(self).__name__}: updates mixed class scores and class indices; reset() "
                f"between the two kinds or use one kind of preds."
            )
        return to_python(values[0])

    def reset(self) -> None:
        super().reset()
        for state in (self._scores, self._hits):
            if state is not None:
                state.reset()


class Accuracy(_MulticlassAccuracy):
    """Top-1 accuracy: the fraction of samples (or pixels) whose predicted class is the label.

    Args:
        name: the name reported by :meth:`get`.
        num_classes: the number of classes; inferred from ``preds.shape[1]`` when ``preds`` are
            scores. With class-index ``preds`` it only serves as a check.
        ignore_index: a label value that is not counted (e.g. ``-1`` or ``255``).

    Example:
        >>> acc = Accuracy()
        >>> labels = torch.tensor([0, 1, 2, 1])
        >>> logits = torch.tensor([[2.0, 0.1, 0.3], [0.1, 3.0, 0.0], [1.0, 0.0, 0.5], [0.0, 1.0, 0.2]])
        >>> acc.update(labels, logits)   # HAT order: labels, then preds
        >>> acc.get()
        ('accuracy', 0.75)
        >>> acc.reset()
        >>> acc.update(torch.tensor([1, 1]), torch.tensor([0, 1]))   # class indices work too
        >>> acc.get()
        ('accuracy', 0.5)
    """

    def __init__(self, name: str = "accuracy", num_classes: int | None = None, ignore_index: int | None = None) -> None:
        super().__init__(name, 1, num_classes, ignore_index)

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` ``(N, ...)`` and ``preds`` ``(N, C, ...)`` scores or ``(N, ...)`` classes."""
        owner = type(self).__name__
        labels = _as_labels(labels, owner)
        preds = _as_tensor(preds, "preds", owner)
        if preds.shape != labels.shape:
            self._update_scores(labels, preds)
            return
        if preds.is_floating_point() and not torch.equal(preds, preds.round()):
            raise ValueError(
                f"{owner}.update: preds have the shape of labels {tuple(labels.shape)} but hold "
                f"non-integral values; pass class scores of shape (N, C, ...) or class indices."
            )
        preds = preds.long().to(labels.device)
        if self.num_classes is not None and preds.numel() and int(preds.max()) >= self.num_classes:
            raise ValueError(f"{owner}.update: a predicted class {int(preds.max())} is >= num_classes={self.num_classes}.")
        keep = labels != self.ignore_index if self.ignore_index is not None else None
        hits = (preds == labels).float()
        if keep is not None:
            hits = hits[keep]
        if self._hits is None:

            def factory() -> Any:
                from torchmetrics.aggregation import MeanMetric

                return MeanMetric(nan_strategy="error")

            self._hits = TorchmetricState(factory)
        if hits.numel():
            self._hits.update(hits)


class TopKAccuracy(_MulticlassAccuracy):
    """Top-k accuracy: the fraction of samples whose label is among the ``top_k`` highest scores.

    Args:
        top_k: how many of the highest-scored classes count as a hit.
        name: the name reported by :meth:`get`.
        num_classes: the number of classes; inferred from ``preds.shape[1]`` when ``None``.
        ignore_index: a label value that is not counted.

    Example:
        >>> top2 = TopKAccuracy(top_k=2)
        >>> labels = torch.tensor([2, 0])
        >>> scores = torch.tensor([[0.5, 0.1, 0.4], [0.1, 0.5, 0.4]])
        >>> top2.update(labels, scores)   # class 2 is 2nd for sample 0; class 0 is last for sample 1
        >>> top2.get()
        ('top_k_accuracy', 0.5)
    """

    def __init__(
        self, top_k: int, name: str = "top_k_accuracy", num_classes: int | None = None, ignore_index: int | None = None
    ) -> None:
        super().__init__(name, top_k, num_classes, ignore_index)

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` ``(N, ...)`` class indices and ``preds`` ``(N, C, ...)`` scores."""
        owner = type(self).__name__
        self._update_scores(_as_labels(labels, owner), _as_tensor(preds, "preds", owner))
