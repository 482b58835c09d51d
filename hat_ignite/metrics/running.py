"""Running sums for the per-step metrics: a few in-place tensor ops per update, no host sync.

:class:`~hat_ignite.metrics.LossShow` and top-1 :class:`~hat_ignite.metrics.Accuracy` need only
sufficient statistics: a sum and a count of observations, or the number of hits and of counted
samples. They are kept here in small tensors on the inputs' device and turned into a value only
when one is asked for (``compute()``), with the arithmetic torchmetrics uses for the same metrics,
so the values are the same:

* :class:`RunningMean` is ``MeanMetric``: the observations are added one by one to a sum in the
  default float dtype (float32), and the mean is that sum divided by the count in that dtype;
* :class:`RunningCounts` is micro-averaged ``MulticlassAccuracy`` (and the mean of 0/1 hits): the
  counts are integers, the value is ``float32(hits) / float32(counted)``.

One difference: the count of a :class:`RunningMean` is a Python integer, exact at any size, where
``MeanMetric`` adds 1.0 to a float32 weight, which stops growing at 2**24 updates.

Under ``torch.distributed``, ``compute()`` gathers every rank's sums (``all_gather``, then a sum
over ranks, as torchmetrics reduces them) and every rank must call it, including ranks that saw
no update since the last reset.

>>> mean = RunningMean()
>>> for loss in (torch.tensor(1.0), torch.tensor(2.5)):
...     mean.update(loss)
>>> float(mean.compute())
1.75
>>> counts = RunningCounts()
>>> counts.update(torch.tensor(3), 4)      # 3 hits among 4 samples
>>> counts.update(torch.tensor(1), torch.tensor(4))  # the count may be a tensor too
>>> float(counts.compute())
0.5
"""

from __future__ import annotations

import torch

from hat_ignite.metrics.base import _world_size

__all__ = ["RunningMean", "RunningCounts"]

_FOLD_EVERY = 64  # RunningCounts folds its pending per-update counts into one sum this often


def _sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` (1-D) summed over every rank: gathered, stacked by rank, summed over ranks."""
    import ignite.distributed as idist

    gathered = idist.all_gather(values)
    return gathered.reshape(-1, values.numel()).sum(dim=0)


def _device_for_empty() -> torch.device:
    """The device of a collective when this rank holds no state (the backend's device)."""
    import ignite.distributed as idist

    return idist.device()


class RunningMean:
    """The mean of scalar observations: a running sum tensor and a count.

    ``update`` adds the observation to the sum in place (one tensor op; the sum moves to the
    observation's device when that changes) and counts it on the host.
    """

    __slots__ = ("total", "count")

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    def update(self, obs: torch.Tensor) -> None:
        """Add one observation, a 0-d floating-point tensor that does not require grad."""
        total = self.total
        if total is None:
            total = self.total = torch.zeros((), dtype=torch.get_default_dtype(), device=obs.device)
        elif total.device != obs.device:
            total = self.total = total.to(obs.device)
        total.add_(obs)
        self.count += 1

    def compute(self) -> torch.Tensor | None:
        """The mean as a 0-d tensor, over every rank; ``None`` when nothing was added anywhere."""
        total = self.total
        if _world_size() > 1:
            if total is None:
                total = torch.zeros((), dtype=torch.get_default_dtype(), device=_device_for_empty())
            count = torch.tensor(float(self.count), dtype=total.dtype, device=total.device)
            total, count = _sum_over_ranks(torch.stack([total, count]))
            return None if not count else total / count
        if total is None or not self.count:
            return None
        return total / torch.tensor(float(self.count), dtype=total.dtype, device=total.device)

    def reset(self) -> None:
        """Forget everything added so far."""
        self.total = None
        self.count = 0


class RunningCounts:
    """Hits among counted samples: integer counts, summed lazily.

    ``update`` only appends the batch's hit count (a tensor) to a list, folded into one int64
    sum every few dozen updates and before a value is read, so an update costs no tensor op. A
    counted-sample number known on the host (the batch size) stays a Python int.
    """

    __slots__ = ("hits", "counted", "host_counted", "updates", "_pending_hits", "_pending_counted")

    def __init__(self) -> None:
        self.hits: torch.Tensor | None = None
        self.counted: torch.Tensor | None = None
        self.host_counted = 0
        self.updates = 0
        self._pending_hits: list[torch.Tensor] = []
        self._pending_counted: list[torch.Tensor] = []

    def update(self, hits: torch.Tensor, counted: int | torch.Tensor) -> None:
        """Add a batch: ``hits`` a 0-d integer tensor, ``counted`` an int or a 0-d integer tensor."""
        pending = self._pending_hits
        pending.append(hits)
        if counted.__class__ is int:
            self.host_counted += counted
        else:
            self._pending_counted.append(counted)
        self.updates += 1
        if len(pending) >= _FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        for name, pending in (("hits", self._pending_hits), ("counted", self._pending_counted)):
            if not pending:
                continue
            device = pending[-1].device
            batch = torch.stack([p.to(device) for p in pending]).sum(dtype=torch.int64)
            pending.clear()
            old = getattr(self, name)
            setattr(self, name, batch if old is None else old.to(device) + batch)

    def totals(self, device: torch.device | None = None) -> torch.Tensor:
        """``[hits, counted, updates]`` of this process as an int64 tensor (folds what is pending)."""
        self._fold()
        if device is None:
            device = self.hits.device if self.hits is not None else torch.device("cpu")
        out = torch.tensor([0, self.host_counted, self.updates], dtype=torch.int64, device=device)
        if self.hits is not None:
            out[0] += self.hits.to(device)
        if self.counted is not None:
            out[1] += self.counted.to(device)
        return out

    def compute(self, nan_if_none_counted: bool = False) -> torch.Tensor | None:
        """``hits / counted`` as a float32 0-d tensor, over every rank.

        Args:
            nan_if_none_counted: return ``None`` when no sample was counted; otherwise that gives
                0.0 once anything was updated (torchmetrics' ``MulticlassAccuracy`` divides
                safely), and ``None`` only without any update.
        """
        self._fold()
        if _world_size() > 1:
            device = self.hits.device if self.hits is not None else _device_for_empty()
            hits, counted, updates = _sum_over_ranks(self.totals(device))
        else:
            hits, counted, updates = self.totals()
        if not updates or (nan_if_none_counted and not counted):
            return None
        if not counted:
            return torch.zeros((), dtype=torch.float32, device=hits.device)
        return hits.float() / counted.float()

    def reset(self) -> None:
        """Forget everything counted so far."""
        self.hits = self.counted = None
        self.host_counted = self.updates = 0
        self._pending_hits.clear()
        self._pending_counted.clear()
