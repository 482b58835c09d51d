"""`LossShow`: the running mean of a loss (or of several named losses)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric, TorchmetricState, to_python

__all__ = ["LossShow"]


def _mean_metric() -> Any:
    from torchmetrics.aggregation import MeanMetric

    return MeanMetric(nan_strategy="disable")


def _observation(loss: Any, where: str) -> torch.Tensor | None:
    """One number per update: a tensor's mean, or the sum of a list's tensors' means."""
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        return loss.detach().float().mean()
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    if isinstance(loss, (list, tuple)):
        parts = [p for p in (_observation(v, where) for v in loss) if p is not None]
        if not parts:
            return None
        total = parts[0]
        for p in parts[1:]:
            total = total + p.to(total.device)
        return total
    raise TypeError(
        f"LossShow.update: {where} must be a tensor, a number, a list of them or a dict of them, got "
        f"{type(loss).__name__}."
    )


class LossShow(EvalMetric):
    """The mean of a loss over the updates since the last reset.

    Each update adds one observation: a tensor counts with its mean, a list/tuple of tensors
    with the sum of their means (the total loss). A dict of losses is tracked per key, each key
    reported under its own name. Non-finite observations are kept, so a NaN loss shows as NaN.

    Args:
        name: the name reported for a single loss (ignored for dicts, which use their keys).

    Example:
        >>> show = LossShow()
        >>> show.update(torch.tensor(1.0))
        >>> show.update([torch.tensor(2.0), torch.tensor([1.0, 3.0])])   # total 2 + 2 = 4
        >>> show.get()
        ('loss', 2.5)
        >>> per_task = LossShow()
        >>> per_task.update({"cls_loss": torch.tensor(1.0), "reg_loss": torch.tensor(0.5)})
        >>> per_task.update({"cls_loss": torch.tensor(3.0), "reg_loss": torch.tensor(0.5)})
        >>> per_task.get()
        (['cls_loss', 'reg_loss'], [2.0, 0.5])
    """

    def __init__(self, name: str = "loss") -> None:
        super().__init__(name)
        self._series: dict[str, TorchmetricState] = {}
        self._keyed: bool | None = None

    def update(self, loss: Any) -> None:
        """Add one observation of ``loss`` (a tensor, a list of tensors, or a dict of them)."""
        keyed = isinstance(loss, Mapping)
        if self._keyed is not None and keyed != self._keyed:
            raise ValueError(
                "LossShow.update: got a dict of losses after single losses (or the reverse); "
                "use one kind per LossShow, or reset() in between."
            )
        items = [(str(k), v) for k, v in loss.items()] if keyed else [(self.name, loss)]
        for key, value in items:
            obs = _observation(value, f"loss[{key!r}]" if keyed else "loss")
            if obs is None:
                continue
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = TorchmetricState(_mean_metric)
            series.update(obs)
        self._keyed = keyed

    def compute(self) -> Any:
        if not self._keyed:
            series = self._series.get(self.name)  # type: ignore[arg-type]
            value = series.compute() if series is not None else None
            return float("nan") if value is None else to_python(value)
        values = [s.compute() for s in self._series.values()]
        return [float("nan") if v is None else to_python(v) for v in values]

    def get(self) -> tuple[Any, Any]:
        if self._keyed:
            return list(self._series), self.compute()
        return self.name, self.compute()

    def reset(self) -> None:
        super().reset()
        self._series.clear()
        self._keyed = None
