"""`LossShow`: the running mean of a loss (or of several named losses)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hat_ignite.metrics.base import EvalMetric
from hat_ignite.metrics.running import RunningMean

__all__ = ["LossShow"]


def _observation(loss: Any, key: str | None) -> torch.Tensor | None:
    """One number per update: a tensor's mean, or the sum of a list's tensors' means.

    Returns a 0-d float32 tensor (or ``None`` for ``None`` or an empty list). A 0-d float32
    tensor is used as it is, graph and all: its mean would be itself, and the running mean only
    reads its value (see :class:`~hat_ignite.metrics.running.RunningMean`).
    """
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.dtype is torch.float32 and not loss.dim():
            return loss
        return loss.detach().float().mean()
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    if isinstance(loss, (list, tuple)):
        parts = [p.detach() for p in (_observation(v, key) for v in loss) if p is not None]
        if not parts:
            return None
        total = parts[0]
        for p in parts[1:]:
            total = total + p.to(total.device)
        return total
    where = "loss" if key is None else f"loss[{key!r}]"
    raise TypeError(
        f"LossShow.update: {where} must be a tensor, a number, a list of them or a dict of them, got "
        f"{type(loss).__name__}."
    )


class LossShow(EvalMetric):
    """The mean of a loss over the updates since the last reset.

    Each update adds one observation: a tensor counts with its mean, a list/tuple of tensors
    with the sum of their means (the total loss). A dict of losses is tracked per key, each key
    reported under its own name. Non-finite observations are kept, so a NaN loss shows as NaN.

    An update adds each observation to a running sum: on the host for a loss on the CPU (no
    tensor op), on the loss's device otherwise (a tensor op or two, no host-device sync);
    :meth:`get` divides by the count, with torchmetrics ``MeanMetric``'s
    arithmetic (see :mod:`hat_ignite.metrics.running`). Under ``torch.distributed`` it is the
    mean over every rank's observations; with a dict of losses every rank must have seen the
    same keys.

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
        self._series: dict[str, RunningMean] = {}
        self._keyed: bool | None = None

    def update(self, loss: Any) -> None:
        """Add one observation of ``loss`` (a tensor, a list of tensors, or a dict of them).

        Costs no tensor op for a 0-d float32 loss on the CPU, a couple of tensor ops per loss
        otherwise, and no host-device sync; the mean is divided out when :meth:`get` asks for it.
        """
        keyed = loss.__class__ is dict or isinstance(loss, Mapping)
        if keyed is not self._keyed and self._keyed is not None:
            raise ValueError(
                "LossShow.update: got a dict of losses after single losses (or the reverse); "
                "use one kind per LossShow, or reset() in between."
            )
        series = self._series
        if not keyed:
            obs = _observation(loss, None)
            if obs is not None:
                running = series.get(self.name)  # type: ignore[arg-type]
                if running is None:
                    running = series[self.name] = RunningMean()  # type: ignore[index]
                running.update(obs)
            self._keyed = False
            return
        for key, value in loss.items():
            key = key if key.__class__ is str else str(key)
            obs = _observation(value, key)
            if obs is None:
                continue
            running = series.get(key)
            if running is None:
                running = series[key] = RunningMean()
            running.update(obs)
        self._keyed = True

    def compute(self) -> Any:
        if not self._keyed:
            # a process without updates still computes (an empty mean), for the collectives
            series = self._series.get(self.name) or RunningMean()  # type: ignore[arg-type]
            value = series.value()
            return float("nan") if value is None else value
        values = [s.value() for s in self._series.values()]
        return [float("nan") if v is None else v for v in values]

    def get(self) -> tuple[Any, Any]:
        if self._keyed:
            return list(self._series), self.compute()
        return self.name, self.compute()

    def reset(self) -> None:
        super().reset()
        self._series.clear()
        self._keyed = None

    def state_dict(self) -> dict[str, Any]:
        """The running sum and count of each loss (see :meth:`EvalMetric.state_dict`).

        >>> show = LossShow()
        >>> show.update(torch.tensor(1.0)); show.update(torch.tensor(2.0))
        >>> again = LossShow()
        >>> again.load_state_dict(show.state_dict()); again.update(torch.tensor(6.0))
        >>> again.get()
        ('loss', 3.0)
        """
        series = {key: running.state_dict() for key, running in self._series.items()}
        return {**super().state_dict(), "keyed": self._keyed, "series": series}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reset()
        super().load_state_dict(state)
        self._keyed = state.get("keyed")
        for key, saved in (state.get("series") or {}).items():
            running = self._series[key] = RunningMean()
            running.load_state_dict(saved)
