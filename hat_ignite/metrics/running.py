"""Running sums for the per-step metrics: few or no tensor ops per update, no host-device sync.

:class:`~hat_ignite.metrics.LossShow` and top-1 :class:`~hat_ignite.metrics.Accuracy` need only
sufficient statistics: a sum and a count of observations, or the number of hits and of counted
samples. They are kept here in small tensors on the inputs' device (CPU class scores are kept as
they are and scored every few dozen updates) and turned into a value only when one is asked for
(``compute()``, at a logging step): an update never reads a tensor on the host, so on a GPU it
never waits for the device. The arithmetic is the one torchmetrics uses for the same metrics,
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
>>> counts.update(torch.tensor([True, True, False, True]), 4)      # 3 hits among 4 samples
>>> counts.update(torch.tensor([True, False, False]), torch.tensor([True, False, True]))  # 1 of 2
>>> float(counts.compute())
0.6666666865348816
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

from hat_ignite.metrics.base import _world_size

__all__ = ["RunningMean", "RunningCounts"]

_FOLD_EVERY = 64  # RunningCounts counts its pending masks at least this often (updates) ...
# ... and scores the CPU batches it keeps at least this often: a batch a DataLoader worker made
# holds an open file descriptor (its shared-memory segment) for as long as it is kept
_KEEP_SCORES = 32
_FOLD_SIZE = 2**20  # ... and once they hold this many elements


def _sum_over_ranks(values: torch.Tensor) -> torch.Tensor:
    """``values`` (1-D) summed over every rank: gathered, stacked by rank, summed over ranks."""
    import ignite.distributed as idist

    gathered = idist.all_gather(values)
    # Ignite types the result as any gatherable; a tensor in gives a tensor
    return gathered.reshape(-1, values.numel()).sum(dim=0)  # type: ignore[union-attr]


def _device_for_empty() -> torch.device:
    """The device of a collective when this rank holds no state (the backend's device)."""
    import ignite.distributed as idist

    return idist.device()


def _count_masks(masks: list[torch.Tensor]) -> torch.Tensor:
    """The number of true elements in ``masks``, an int64 0-d tensor on the last mask's device."""
    if len(masks) > 1:
        try:  # one concatenation and one count (same trailing shape and device: the usual case)
            return torch.count_nonzero(torch.cat(masks))
        except RuntimeError:  # 0-d masks, other trailing shapes or devices: count one by one
            device = masks[-1].device
            return torch.stack([torch.count_nonzero(m).to(device) for m in masks]).sum()
    return torch.count_nonzero(masks[0])


class RunningMean:
    """The mean of scalar observations: a running sum tensor and a count.

    ``update`` adds the observation in place to a 0-d sum of the default float dtype on the
    observation's device (one tensor op, no host read: on a GPU nothing waits for the device)
    and counts it on the host. The value is read only when asked for (:meth:`compute`,
    :meth:`value`), at a logging step.
    """

    __slots__ = ("total", "count")

    def __init__(self) -> None:
        #: The running sum (a 0-d tensor) once anything was added, else ``None``.
        self.total: torch.Tensor | None = None
        self.count = 0

    def update(self, obs: torch.Tensor) -> None:
        """Add one observation, a 0-d floating-point tensor (only its value is read, never its graph)."""
        total = self.total
        if total is None:
            total = self.total = torch.zeros((), dtype=torch.get_default_dtype(), device=obs.device)
        elif total.device != obs.device:
            total = self.total = total.to(obs.device)
        total.add_(obs.detach())
        self.count += 1

    def _sum(self, device: torch.device | None = None) -> torch.Tensor:
        """The running sum as a 0-d tensor (zero on ``device`` when nothing was added)."""
        if self.total is not None:
            return self.total
        return torch.zeros((), dtype=torch.get_default_dtype(), device=device)

    def compute(self) -> torch.Tensor | None:
        """The mean as a 0-d tensor, over every rank; ``None`` when nothing was added anywhere."""
        if _world_size() > 1:
            total = self._sum(_device_for_empty())
            count = torch.tensor(float(self.count), dtype=total.dtype, device=total.device)
            total, count = _sum_over_ranks(torch.stack([total, count]))
            return None if not count else total / count
        if not self.count:
            return None
        total = self._sum()
        return total / torch.tensor(float(self.count), dtype=total.dtype, device=total.device)

    def value(self) -> float | None:
        """:meth:`compute` as a Python float (a host read: call it at logging steps only)."""
        result = self.compute()
        return None if result is None else float(result.item())

    def reset(self) -> None:
        """Forget everything added so far."""
        self.total = None
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        """The running sum (a 0-d tensor, ``None`` before any update) and the count."""
        return {"total": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        total = state.get("total")
        self.total = total.clone() if isinstance(total, torch.Tensor) else None
        self.count = int(state.get("count", 0))


_FLOAT32 = struct.Struct("f")


def _to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as a float32 tensor op rounds it (inf past the range).

    >>> _to_float32(0.1), _to_float32(1e39), _to_float32(-1e39)
    (0.10000000149011612, inf, -inf)
    """
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:  # struct refuses what rounds past float32's range; IEEE gives inf
        return math.copysign(math.inf, value)


def _host_ratio(hits: int, counted: int) -> float:
    """``float32(hits) / float32(counted)`` as float32 tensors compute it (0.0 when nothing was counted).

    A quotient of two float32 numbers computed in float64 and rounded once to float32 is the
    correctly rounded float32 quotient, which is what the tensor division gives.

    >>> _host_ratio(2, 3), float(torch.tensor(2.0) / torch.tensor(3.0))
    (0.6666666865348816, 0.6666666865348816)
    """
    if not counted:
        return 0.0
    return _to_float32(_to_float32(float(hits)) / _to_float32(float(counted)))


class RunningCounts:
    """Hits among counted samples: boolean masks (or CPU class scores), counted lazily.

    ``update`` only keeps the batch's hit mask (a boolean tensor the caller made and does not
    touch again) in a list; the masks are counted together, into one int64 sum, every few dozen
    updates (or once they hold about a million elements) and before a value is read. That takes
    the counting off the per-step path. A counted-sample number known on the host (the batch
    size) stays a Python int; otherwise a mask of the counted samples is kept the same way.

    :meth:`update_scores` goes one step further for class scores on the CPU: it keeps the batch's
    ``labels`` and ``preds`` themselves and finds the top-1 hits of all the kept batches at the
    fold, with one ``argmax`` and one comparison over their concatenation instead of two tensor
    ops per batch. The per-row results are those of the batch-by-batch ops, so the counts are
    equal. The kept tensors must not change before the fold: a change in place is detected
    (through the tensors' version counters) and raises instead of counting changed values. At
    most 32 batches are kept (fewer once they hold about a million scores): a batch made by a
    DataLoader worker holds an open file descriptor while it is kept.

    Args:
        ignore_index: the label value :meth:`update_scores` does not count (``None``: every
            label is counted).
    """

    __slots__ = (
        "hits", "counted", "host_counted", "updates", "ignore_index",
        "_pending_hits", "_pending_counted", "_pending_scores", "_pending_size",
    )

    def __init__(self, ignore_index: int | None = None) -> None:
        self.hits: torch.Tensor | None = None
        self.counted: torch.Tensor | None = None
        self.host_counted = 0
        self.updates = 0
        self.ignore_index = ignore_index
        self._pending_hits: list[torch.Tensor] = []
        self._pending_counted: list[torch.Tensor] = []
        # (labels, preds, labels._version, preds._version) of the batches update_scores kept
        self._pending_scores: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
        self._pending_size = 0

    def update(self, hits: torch.Tensor, counted: int | torch.Tensor) -> None:
        """Add a batch: ``hits`` a boolean mask of the hits, ``counted`` an int or a boolean mask."""
        pending = self._pending_hits
        pending.append(hits)
        if counted.__class__ is int:
            self.host_counted += counted
        else:
            self._pending_counted.append(counted)  # type: ignore[arg-type]  # a mask: ints took the branch above
        self.updates += 1
        self._pending_size += hits.numel()
        if len(pending) >= _FOLD_EVERY or self._pending_size >= _FOLD_SIZE:
            self._fold()

    def update_scores(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        """Add a batch of class scores: kept and counted at the next fold on the CPU.

        Scores on an accelerator are counted now (their ops run asynchronously, and a CUDA graph
        may overwrite its outputs), as are inference tensors (made under
        ``torch.inference_mode()``), which keep no version counter to check the kept values by.

        Args:
            labels: class indices of shape ``(N, ...)``, on the device of ``preds``.
            preds: float scores of shape ``(N, C, ...)``, detached from any graph. Kept ones must
                not be changed in place before the fold.
        """
        if preds.is_cpu and self.keep_scores(labels, preds, labels.numel(), preds.numel()):
            return
        self.updates += 1
        if self.ignore_index is None:
            self.host_counted += labels.numel()
        self._add_hits(labels, preds)
        self._pending_size += labels.numel()
        if len(self._pending_hits) >= _FOLD_EVERY or self._pending_size >= _FOLD_SIZE:
            self._fold()

    def keep_scores(self, labels: torch.Tensor, preds: torch.Tensor, counted: int, size: int) -> bool:
        """Keep a batch of CPU class scores for the next fold: :meth:`update_scores` minus its tests.

        For callers that know the batch is on the CPU and its element counts (the same for every
        batch of one shape), which saves reading them at each update.

        Args:
            labels: class indices ``(N, ...)`` on the CPU.
            preds: float scores ``(N, C, ...)`` on the CPU, detached from any graph.
            counted: ``labels.numel()``.
            size: ``preds.numel()``.

        Returns:
            ``False``, having added nothing, for inference tensors (which have no version counter
            to check the kept values by): count those with :meth:`update_scores`.
        """
        try:
            kept = (labels, preds, labels._version, preds._version)
        except RuntimeError:  # inference tensors
            return False
        self.updates += 1
        if self.ignore_index is None:
            self.host_counted += counted
        pending = self._pending_scores
        pending.append(kept)
        self._pending_size += size
        if len(pending) >= _KEEP_SCORES or self._pending_size >= _FOLD_SIZE:
            self._fold()
        return True

    def _add_hits(self, labels: torch.Tensor, preds: torch.Tensor) -> None:
        """Add the top-1 hit mask of ``preds`` against ``labels`` (and what is counted) to the pending masks."""
        hits = preds.argmax(1) == labels
        if self.ignore_index is None:
            self._pending_hits.append(hits)
        else:
            keep = labels != self.ignore_index
            self._pending_hits.append(hits & keep)
            self._pending_counted.append(keep)

    def _score_pending(self) -> None:
        """Turn the kept ``(labels, preds)`` batches into hit (and counted) masks."""
        pending = self._pending_scores
        changed = [i for i, (labels, preds, lv, pv) in enumerate(pending) if labels._version != lv or preds._version != pv]
        if changed:
            pending.clear()
            raise RuntimeError(
                f"RunningCounts: the labels or preds of {len(changed)} batch(es) passed to an accuracy "
                f"update were changed in place before they were counted (CPU class scores are kept and "
                f"counted every {_KEEP_SCORES} updates). Pass tensors that stay as they are until then, "
                f"e.g. update(labels.clone(), preds.clone()), or change copies instead."
            )
        batches: list[tuple[torch.Tensor, torch.Tensor]]
        if len(pending) == 1:
            batches = [pending[0][:2]]
        else:
            try:  # one concatenation each (same trailing shapes: the usual case)
                batches = [(torch.cat([p[0] for p in pending]), torch.cat([p[1] for p in pending]))]
            except RuntimeError:  # other trailing shapes: score batch by batch
                batches = [p[:2] for p in pending]
        pending.clear()
        for labels, preds in batches:
            self._add_hits(labels, preds)

    def _fold(self) -> None:
        if self._pending_scores:
            self._score_pending()
        self._pending_size = 0
        for name, pending in (("hits", self._pending_hits), ("counted", self._pending_counted)):
            if not pending:
                continue
            total: torch.Tensor | int = _count_masks(pending)
            pending.clear()
            old = getattr(self, name)
            if old is None:
                setattr(self, name, total)
            elif old.__class__ is int or total.__class__ is int:
                setattr(self, name, old + total)
            else:
                setattr(self, name, old.to(total.device) + total)  # type: ignore[union-attr]

    def totals(self, device: torch.device | None = None) -> torch.Tensor:
        """``[hits, counted, updates]`` of this process as an int64 tensor (folds what is pending)."""
        self._fold()
        hits, counted = self.hits, self.counted
        if device is None:
            device = hits.device if isinstance(hits, torch.Tensor) else torch.device("cpu")
        out = torch.tensor(
            [hits if hits.__class__ is int else 0, self.host_counted + (counted if counted.__class__ is int else 0),
             self.updates], dtype=torch.int64, device=device,
        )
        if isinstance(hits, torch.Tensor):
            out[0] += hits.to(device)
        if isinstance(counted, torch.Tensor):
            out[1] += counted.to(device)
        return out

    def _local(self) -> tuple[torch.Tensor | int | None, torch.Tensor | int, int]:
        """``(hits, counted, updates)`` of this process, folded (counts on the CPU as ints)."""
        self._fold()
        counted = self.host_counted if self.counted is None else self.counted + self.host_counted
        return self.hits, counted, self.updates

    def compute(self, nan_if_none_counted: bool = False) -> torch.Tensor | None:
        """``hits / counted`` as a float32 0-d tensor, over every rank.

        Args:
            nan_if_none_counted: return ``None`` when no sample was counted; otherwise that gives
                0.0 once anything was updated (torchmetrics' ``MulticlassAccuracy`` divides
                safely), and ``None`` only without any update.
        """
        if _world_size() > 1:
            self._fold()
            device = self.hits.device if isinstance(self.hits, torch.Tensor) else _device_for_empty()
            hits, counted, updates = _sum_over_ranks(self.totals(device))
        else:
            hits, counted, updates = self._local()
        if not updates or (nan_if_none_counted and not counted):
            return None
        if hits.__class__ is int and counted.__class__ is int:
            return torch.tensor(_host_ratio(hits, counted), dtype=torch.float32)
        device = hits.device if isinstance(hits, torch.Tensor) else counted.device
        if not counted:
            return torch.zeros((), dtype=torch.float32, device=device)
        return torch.as_tensor(hits, device=device).float() / torch.as_tensor(counted, device=device).float()

    def value(self, nan_if_none_counted: bool = False) -> float | None:
        """:meth:`compute` as a Python float; counts kept on the host are divided without a tensor op."""
        if _world_size() == 1:
            hits, counted, updates = self._local()
            if hits.__class__ is int and counted.__class__ is int:
                if not updates or (nan_if_none_counted and not counted):
                    return None
                return _host_ratio(hits, counted)
        result = self.compute(nan_if_none_counted)
        return None if result is None else float(result.item())

    def state_dict(self) -> dict[str, Any]:
        """The counts so far (what is pending is counted first)."""
        self._fold()
        return {"hits": self.hits, "counted": self.counted, "host_counted": self.host_counted, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue counting from a :meth:`state_dict`."""
        self.reset()
        self.hits, self.counted = state.get("hits"), state.get("counted")
        self.host_counted = int(state.get("host_counted", 0))
        self.updates = int(state.get("updates", 0))

    def reset(self) -> None:
        """Forget everything counted so far."""
        self.hits = self.counted = None
        self.host_counted = self.updates = 0
        self._pending_hits.clear()
        self._pending_counted.clear()
        self._pending_scores.clear()
        self._pending_size = 0
