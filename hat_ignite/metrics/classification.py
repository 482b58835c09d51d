"""Classification accuracy: `Accuracy` (top-1) and `TopKAccuracy`, with torchmetrics' math.

Both take HAT's argument order, ``update(labels, preds)``: ``labels`` holds class indices of
shape ``(N, ...)``; ``preds`` holds scores (logits or probabilities) of shape ``(N, C, ...)``.
:class:`Accuracy` also accepts predicted class indices of the same shape as ``labels``.

Top-1 accuracy is counted per update with a few tensor ops and no host-device sync (the counts
stay on the inputs' device until :meth:`get` reads them, see :mod:`hat_ignite.metrics.running`);
its value is the one torchmetrics' micro-averaged ``MulticlassAccuracy`` gives. Class scores on
the CPU cost no tensor op at all per update: the batches are kept and scored together every few
dozen updates (and before a value is read), so they must not be changed in place in between (a
change is detected and raises). Top-k accuracy for ``k > 1`` updates a torchmetrics
``MulticlassAccuracy``.

The inputs are checked in full on the first update after construction or :meth:`reset` and
whenever the shapes, dtypes or devices of ``labels`` and ``preds`` change; further updates with
the same signature skip the checks that read values (integral float labels, the number of
distinct labels, class-index ``preds`` below ``num_classes``), which would cost a host-device
sync at every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric, TorchmetricState, to_python
from hat_ignite.metrics.running import RunningCounts

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
    """Shared state: running hit counts for top-1, a torchmetrics ``MulticlassAccuracy`` for top-k."""

    def __init__(self, name: str, top_k: int, num_classes: int | None, ignore_index: int | None) -> None:
        super().__init__(name)
        owner = type(self).__name__
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"{owner}: top_k must be an integer >= 1, got {top_k!r}.")
        if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"{owner}: num_classes must be an integer >= 2 or None (inferred), got {num_classes!r}.")
        if num_classes is not None and top_k > num_classes:
            raise ValueError(f"{owner}: top_k={top_k} is larger than num_classes={num_classes}.")
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise ValueError(f"{owner}: ignore_index must be None or an integer label value (e.g. -1 or 255), got {ignore_index!r}.")
        self.top_k = top_k
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        # top-1 scores and class indices are counted from the first update on every process, so
        # that under torch.distributed every rank takes part in get()'s reductions
        self._scores: RunningCounts | TorchmetricState | None = RunningCounts(ignore_index) if top_k == 1 else None
        self._scores_classes: int | None = None
        self._hits = RunningCounts()
        # (labels.shape, preds.shape, labels.dtype, preds.dtype, labels.device, preds.device) of the
        # last checked update, and the conversions that update needed
        self._signature: tuple | None = None
        self._labels_long = self._to_float = self._move = False
        # for checked CPU scores that need no conversion: (labels.shape, preds.shape, labels.dtype,
        # preds.dtype, labels.numel(), preds.numel()), which update() compares and keeps them by
        self._keep_as_is: tuple | None = None

    def _score_state(self, num_classes: int) -> RunningCounts | TorchmetricState:
        if self._scores_classes is None:
            self._scores_classes = num_classes
        elif num_classes != self._scores_classes:
            raise ValueError(
                f"{type(self).__name__}.update: preds have {num_classes} classes (dim 1), but earlier "
                f"updates had {self._scores_classes}. Every update must score the same classes."
            )
        if self._scores is None:
            top_k, ignore_index = self.top_k, self.ignore_index

            def factory() -> Any:
                from torchmetrics.classification import MulticlassAccuracy

                return MulticlassAccuracy(
                    num_classes=num_classes, top_k=top_k, average="micro",
                    multidim_average="global", ignore_index=ignore_index,
                )

            self._scores = TorchmetricState(factory)
        return self._scores

    def _check_scores(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
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
        self._score_state(num_classes)
        if self.top_k == 1:  # the check torchmetrics' MulticlassAccuracy makes of every target
            allowed = num_classes if self.ignore_index is None else num_classes + 1
            found = torch.unique(labels)
            if len(found) > allowed:
                raise RuntimeError(
                    f"{owner}.update: labels hold {len(found)} distinct values, more than the {num_classes} "
                    f"classes of preds{' and ignore_index' if self.ignore_index is not None else ''} allow: "
                    f"{found.tolist()}. Labels must be class indices 0 .. {num_classes - 1}."
                )

    def _update_scores(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        """Check ``(N, C, ...)`` scores against ``labels`` and count them (labels already converted)."""
        self._check_scores(labels, preds)
        if self.top_k == 1:
            self._count_scores(labels.to(preds.device), preds.float())
        else:
            self._scores.update(preds.float(), labels.to(preds.device))  # type: ignore[union-attr]

    def _count_scores(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        """Top-1 hits of float ``preds`` scores against ``labels`` on the same device.

        On the CPU the batch is kept and scored with others at once (see
        :meth:`~hat_ignite.metrics.running.RunningCounts.update_scores`).
        """
        self._scores.update_scores(labels, preds.detach())  # type: ignore[union-attr]

    def _count_indices(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        """Hits of int64 class-index ``preds`` against ``labels`` on the same device."""
        hits = preds == labels
        if self.ignore_index is None:
            self._hits.update(hits, labels.numel())
        else:
            keep = labels != self.ignore_index
            self._hits.update(hits & keep, keep)

    def _update_checked(self, labels: Any, preds: Any) -> None:
        """Check the inputs in full, count them and remember their signature."""
        raise NotImplementedError(f"{type(self).__name__} must define _update_checked(labels, preds).")

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` ``(N, ...)`` class indices, ``preds`` ``(N, C, ...)`` scores.

        :class:`Accuracy` also takes class-index ``preds`` of the shape of ``labels``.
        """
        if self.top_k == 1 and labels.__class__ is torch.Tensor and preds.__class__ is torch.Tensor:
            kept = self._keep_as_is
            if (
                kept is not None and labels.is_cpu and preds.is_cpu and labels.dtype is kept[2]
                and preds.dtype is kept[3] and labels.shape == kept[0] and preds.shape == kept[1]
            ):  # checked CPU scores that need no conversion: keep them for the fold
                if self._scores.keep_scores(labels, preds.detach(), kept[4], kept[5]):  # type: ignore[union-attr]
                    return
            signature = (labels.shape, preds.shape, labels.dtype, preds.dtype, labels.device, preds.device)
            if signature == self._signature:  # checked before: only count
                if self._labels_long:
                    labels = labels.long()
                if len(signature[1]) == len(signature[0]):
                    preds = preds.long()
                    self._count_indices(labels, preds.to(labels.device) if self._move else preds)
                else:
                    self._count_scores(labels.to(preds.device) if self._move else labels,
                                       preds.float() if self._to_float else preds)
                return
        self._update_checked(labels, preds)

    def _remember(self, labels: Any, preds: Any, converted: torch.Tensor) -> None:
        """Note the signature of checked tensor inputs, so that later updates skip the checks."""
        if self.top_k != 1 or labels.__class__ is not torch.Tensor or preds.__class__ is not torch.Tensor:
            return
        self._signature = (labels.shape, preds.shape, labels.dtype, preds.dtype, labels.device, preds.device)
        self._labels_long = converted.dtype != labels.dtype
        self._to_float = preds.dtype != torch.float32
        self._move = labels.device != preds.device
        as_is = (
            labels.is_cpu and preds.is_cpu and preds.dim() == labels.dim() + 1
            and not (self._labels_long or self._to_float)
        )
        self._keep_as_is = (
            (labels.shape, preds.shape, labels.dtype, preds.dtype, labels.numel(), preds.numel()) if as_is else None
        )

    def compute(self) -> float:
        scores = self._scores
        values = [  # both read on every rank: under torch.distributed each takes part in collectives
            None if scores is None else scores.value() if isinstance(scores, RunningCounts) else scores.compute(),
            self._hits.value(nan_if_none_counted=True),
        ]
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
        if self._scores is not None:
            self._scores.reset()
        self._hits.reset()
        self._signature = self._keep_as_is = None

    def state_dict(self) -> dict[str, Any]:
        """The counts so far (see :meth:`EvalMetric.state_dict`)."""
        scores = self._scores.state_dict() if self._scores is not None else None
        return {**super().state_dict(), "hits": self._hits.state_dict(), "scores": scores,
                "scores_classes": self._scores_classes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reset()
        super().load_state_dict({k: v for k, v in state.items() if k != "parts"})
        self._hits.load_state_dict(state.get("hits") or {})
        classes: Any = state.get("scores_classes")
        scores = state.get("scores")
        if scores is not None:
            target = self._scores if self._scores is not None else self._score_state(int(classes))
            target.load_state_dict(scores)
        self._scores_classes = classes


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

    def _update_checked(self, labels: Any, preds: Any) -> None:
        owner = type(self).__name__
        checked_labels = _as_labels(labels, owner)
        checked_preds = _as_tensor(preds, "preds", owner)
        if checked_preds.shape != checked_labels.shape:
            self._update_scores(checked_labels, checked_preds)
            self._remember(labels, preds, checked_labels)
            return
        if checked_preds.is_floating_point() and not torch.equal(checked_preds, checked_preds.round()):
            raise ValueError(
                f"{owner}.update: preds have the shape of labels {tuple(checked_labels.shape)} but hold "
                f"non-integral values; pass class scores of shape (N, C, ...) or class indices."
            )
        class_preds = checked_preds.long().to(checked_labels.device)
        if self.num_classes is not None and class_preds.numel() and int(class_preds.max()) >= self.num_classes:
            raise ValueError(f"{owner}.update: a predicted class {int(class_preds.max())} is >= num_classes={self.num_classes}.")
        self._count_indices(checked_labels, class_preds)
        self._remember(labels, preds, checked_labels)


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

    def _update_checked(self, labels: Any, preds: Any) -> None:
        owner = type(self).__name__
        checked_labels = _as_labels(labels, owner)
        self._update_scores(checked_labels, _as_tensor(preds, "preds", owner))
        self._remember(labels, preds, checked_labels)
