"""`MeanIoU`: mean intersection over union from a confusion matrix accumulated by torchmetrics."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from hat_ignite.metrics.base import EvalMetric, TorchmetricState
from hat_ignite.metrics.classification import _as_labels, _as_tensor

__all__ = ["MeanIoU", "MeanIOU"]


class MeanIoU(EvalMetric):
    """Mean IoU over classes, from the confusion matrix of every update since the last reset.

    For each class ``c``: ``IoU_c = TP / (TP + FP + FN)`` over all pixels seen. The mean skips
    classes that appear neither in the labels nor in the predictions (their IoU is undefined and
    reported as ``nan`` when ``verbose``).

    Args:
        num_classes: the number of classes (label values ``0 .. num_classes - 1``).
        name: the name reported for the mean.
        ignore_index: a label value whose pixels are not counted (``None``: count every pixel).
        class_names: names used for the per-class values (default: ``"class_<i>"``).
        verbose: also report each class's IoU, as ``"<name>_<class name>"``.

    Example:
        >>> miou = MeanIoU(num_classes=2, verbose=True, class_names=["bg", "fg"])
        >>> labels = torch.tensor([[0, 0, 1, 1]])
        >>> preds = torch.tensor([[0, 1, 1, 1]])     # class indices, or (N, C, ...) scores
        >>> miou.update(labels, preds)
        >>> names, values = miou.get()
        >>> names
        ['mean_iou', 'mean_iou_bg', 'mean_iou_fg']
        >>> [round(v, 4) for v in values]   # bg: 1/2, fg: 2/3
        [0.5833, 0.5, 0.6667]
    """

    def __init__(
        self,
        num_classes: int,
        name: str = "mean_iou",
        ignore_index: int | None = 255,
        class_names: Sequence[str] | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(name)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"MeanIoU: num_classes must be an integer >= 2, got {num_classes!r}.")
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(
                f"MeanIoU: class_names has {len(class_names)} names but num_classes={num_classes}; "
                f"give one name per class."
            )
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.class_names = list(class_names) if class_names is not None else [f"class_{i}" for i in range(num_classes)]
        self.verbose = verbose

        def factory() -> Any:
            from torchmetrics.classification import MulticlassConfusionMatrix

            return MulticlassConfusionMatrix(num_classes=num_classes, ignore_index=ignore_index)

        self._confusion = TorchmetricState(factory)

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` ``(N, ...)`` and ``preds`` ``(N, C, ...)`` scores or ``(N, ...)`` classes."""
        labels = _as_labels(labels, "MeanIoU")
        preds = _as_tensor(preds, "preds", "MeanIoU")
        if preds.dim() == labels.dim() + 1:
            if preds.shape[1] != self.num_classes:
                raise ValueError(
                    f"MeanIoU.update: preds have {preds.shape[1]} class scores (dim 1) but "
                    f"num_classes={self.num_classes}."
                )
            preds = preds.argmax(dim=1)
        if preds.shape != labels.shape:
            raise ValueError(
                f"MeanIoU.update: preds of shape {tuple(preds.shape)} do not match labels of shape "
                f"{tuple(labels.shape)}; pass update(labels, preds) with preds (N, C, ...) scores or "
                f"(N, ...) class indices."
            )
        self._confusion.update(preds.long().flatten(), labels.to(preds.device).flatten())

    def confusion_matrix(self) -> torch.Tensor | None:
        """The accumulated ``(num_classes, num_classes)`` matrix (rows: labels, columns: preds)."""
        return self._confusion.compute()

    def compute(self) -> Any:
        """The mean IoU, or ``[mean, IoU_0, IoU_1, ...]`` when ``verbose``."""
        cm = self.confusion_matrix()
        if cm is None:
            iou = torch.full((self.num_classes,), float("nan"))
        else:
            cm = cm.double().cpu()
            tp = cm.diagonal()
            union = cm.sum(0) + cm.sum(1) - tp
            iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
        present = ~torch.isnan(iou)
        mean = float(iou[present].mean()) if bool(present.any()) else float("nan")
        if not self.verbose:
            return mean
        return [mean, *(float(v) for v in iou)]

    def get(self) -> tuple[Any, Any]:
        if not self.verbose:
            return self.name, self.compute()
        return [self.name, *(f"{self.name}_{c}" for c in self.class_names)], self.compute()

    def reset(self) -> None:
        super().reset()
        self._confusion.reset()


#: HAT's spelling of :class:`MeanIoU`.
MeanIOU = MeanIoU
