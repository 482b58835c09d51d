"""Calibration statistics that do not depend on the order of the batches: exact to merge and reduce.

:class:`Statistics` holds what a calibration observer has seen: the smallest and largest finite
value, and (for the histogram observers) how many values fall in each bin of ``|x|``, apart for
negative and non-negative values. The bins cover ``[0, 2**exponent)`` with ``exponent`` the
smallest power of two above the largest magnitude seen, so that:

* a bin's index is ``floor(|x| * nbins / 2**exponent)``, computed exactly (a multiplication by a
  power of two);
* when a larger value arrives, the range doubles (once or more) and each pair of bins merges
  into one: ``floor(floor(a) / 2) == floor(a / 2)``, so the counts are those a histogram over the
  final range would have counted directly;
* the counts are integers (``int64``).

Hence the statistics of some batches are the same whichever order the batches came in, and the
statistics of several processes, brought to a common exponent and summed, are bit for bit those
of one process that saw all the batches. A moving average over batches (torchao's default
observer, horizon's) has neither property.

>>> a, b = Statistics(bins=4), Statistics(bins=4)
>>> a.observe(torch.tensor([0.5, -1.5])); a.observe(torch.tensor([3.0]))
>>> b.observe(torch.tensor([3.0])); b.observe(torch.tensor([0.5, -1.5]))
>>> a.same_as(b), a.min, a.max, a.exponent, a.positive.tolist(), a.negative.tolist()
(True, -1.5, 3.0, 2, [0, 1, 0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0, 0, 0])
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

__all__ = ["NO_DATA", "Statistics", "magnitude_exponent", "rebin", "all_reduce_statistics"]

#: The exponent of statistics that saw no non-zero value (smaller than any real one).
NO_DATA = -(2**62)


def magnitude_exponent(amax: float) -> int:
    """The smallest ``e`` with ``amax < 2**e`` (:data:`NO_DATA` for ``0``).

    >>> magnitude_exponent(1.0), magnitude_exponent(0.75), magnitude_exponent(0.0) == NO_DATA
    (1, 0, True)
    """
    if amax <= 0.0:
        return NO_DATA
    return math.frexp(amax)[1]  # amax = m * 2**e with 0.5 <= m < 1


def rebin(counts: torch.Tensor, shift: int) -> torch.Tensor:
    """``counts`` over a range ``2**shift`` times wider: every ``2**shift`` bins merge into one.

    The number of bins (a power of two) stays; the upper bins are empty afterwards.

    >>> rebin(torch.tensor([1, 2, 3, 4]), 1).tolist(), rebin(torch.tensor([1, 2, 3, 4]), 5).tolist()
    ([3, 7, 0, 0], [10, 0, 0, 0])
    """
    if shift <= 0:
        return counts
    out = torch.zeros_like(counts)
    n = counts.numel()
    if shift >= n.bit_length() - 1:
        out[0] = counts.sum()
        return out
    merged = counts.view(-1, 1 << shift).sum(dim=1)
    out[: merged.numel()] = merged
    return out


def _nbins(bins: int) -> int:
    """The histogram's bin count for ``bins`` requested: a power of two, twice as many (the data
    then fill between ``bins`` and ``2 * bins`` of them)."""
    return 1 << (2 * bins - 1).bit_length() if bins > 0 else 0


class Statistics:
    """The min, max and (with ``bins``) the magnitude histogram of everything observed.

    Args:
        bins: ``0``: the min and max only. Otherwise the data's range ``[0, max |x|]`` holds at
            least ``bins`` bins of the histogram: it has ``2 * bins`` of them (rounded up to a
            power of two) over ``[0, 2**exponent)``, and the largest magnitude lies in its upper half.

    Values that are not finite (``inf``, ``nan``) are left out.
    """

    def __init__(self, bins: int = 0) -> None:
        self.nbins = _nbins(int(bins))
        #: smallest and largest finite value seen (``None`` before any)
        self.min: float | None = None
        self.max: float | None = None
        #: the histogram covers ``[0, 2**exponent)``
        self.exponent = NO_DATA
        #: counts of ``|x|`` per bin for ``x >= 0`` and ``x < 0`` (``None`` before any data)
        self.positive: torch.Tensor | None = None
        self.negative: torch.Tensor | None = None

    def empty_like(self) -> Statistics:
        """New, empty statistics with the same bins."""
        fresh = Statistics()
        fresh.nbins = self.nbins
        return fresh

    @property
    def empty(self) -> bool:
        return self.min is None

    @property
    def width(self) -> float:
        """The width of a bin (``2**exponent / nbins``); ``0`` when only zeros were seen."""
        return 0.0 if self.exponent == NO_DATA else math.ldexp(1.0, self.exponent) / self.nbins

    def magnitudes(self) -> torch.Tensor:
        """Counts of ``|x|`` per bin, both signs together, as ``float64``."""
        assert self.positive is not None and self.negative is not None
        return (self.positive + self.negative).double()

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Add the values of ``x`` (any shape and floating dtype)."""
        x = x.detach().flatten().float()
        if x.numel() == 0:
            return
        lo, hi = (float(v) for v in torch.stack(torch.aminmax(x)).tolist())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            x = x[torch.isfinite(x)]
            if x.numel() == 0:
                return
            lo, hi = (float(v) for v in torch.stack(torch.aminmax(x)).tolist())
        self._merge_range(lo, hi)
        if not self.nbins:
            return
        self._grow(magnitude_exponent(max(-lo, hi)), x.device)
        assert self.positive is not None and self.negative is not None
        if self.exponent == NO_DATA:  # zeros only: all in the first bin
            self.positive[0] += x.numel()
            return
        factor = math.ldexp(1.0, self.nbins.bit_length() - 1 - self.exponent)
        index = (x.abs().double() * factor).floor().long()  # exact: a power-of-two factor in float64
        index += (x < 0).long() * self.nbins
        counts = torch.bincount(index, minlength=2 * self.nbins)
        self.positive += counts[: self.nbins]
        self.negative += counts[self.nbins:]

    def _merge_range(self, lo: float, hi: float) -> None:
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)

    def _grow(self, exponent: int, device: torch.device) -> None:
        """Widen the histogram to ``2**exponent`` (no change when it is wide enough already)."""
        if self.positive is None or self.negative is None:
            self.positive = torch.zeros(self.nbins, dtype=torch.int64, device=device)
            self.negative = torch.zeros(self.nbins, dtype=torch.int64, device=device)
        if exponent > self.exponent:
            shift = exponent - self.exponent if self.exponent != NO_DATA else exponent - NO_DATA
            self.positive = rebin(self.positive, shift)
            self.negative = rebin(self.negative, shift)
            self.exponent = exponent

    def merge(self, other: Statistics) -> None:
        """Add ``other``'s statistics (same ``bins``) to these."""
        if other.empty:
            return
        assert other.min is not None and other.max is not None
        self._merge_range(other.min, other.max)
        if not self.nbins:
            return
        assert other.positive is not None and other.negative is not None
        self._grow(other.exponent, other.positive.device)
        shift = self.exponent - other.exponent if other.exponent != NO_DATA else self.exponent - NO_DATA
        assert self.positive is not None and self.negative is not None
        self.positive += rebin(other.positive, shift).to(self.positive.device)
        self.negative += rebin(other.negative, shift).to(self.negative.device)

    def same_as(self, other: Statistics) -> bool:
        """Whether both hold exactly the same statistics."""
        if (self.nbins, self.min, self.max, self.exponent) != (other.nbins, other.min, other.max, other.exponent):
            return False
        if self.positive is None or other.positive is None:
            return self.positive is other.positive
        assert self.negative is not None and other.negative is not None
        return torch.equal(self.positive.cpu(), other.positive.cpu()) and torch.equal(
            self.negative.cpu(), other.negative.cpu())

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain numbers and CPU tensors (``torch.load(weights_only=True)`` reads them back)."""
        return {
            "nbins": self.nbins, "min": self.min, "max": self.max, "exponent": self.exponent,
            "positive": None if self.positive is None else self.positive.cpu(),
            "negative": None if self.negative is None else self.negative.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Put back a :meth:`state_dict`.

        Raises:
            ValueError: it was saved with another number of bins.
        """
        if int(state["nbins"]) != self.nbins:
            raise ValueError(f"the saved histogram has {state['nbins']} bins, this observer {self.nbins}")
        self.min, self.max = state["min"], state["max"]
        self.exponent = int(state["exponent"])
        for name in ("positive", "negative"):
            value = state[name]
            setattr(self, name, None if value is None else value.to(device or value.device, torch.int64).clone())


def all_reduce_statistics(stats: Sequence[Statistics], device: torch.device) -> None:
    """Replace each of ``stats`` by its sum over the processes of the default process group.

    Every process must call it with the same observers in the same order (one ``MAX`` collective
    for the ranges and exponents of all of them, one ``SUM`` for all their histograms). Ranges
    reduce by ``MIN``/``MAX``; the histograms are brought to the largest exponent of any process
    and summed as integers: the result is exact.

    Args:
        stats: this process's statistics (of one step, say), changed in place.
        device: where the collectives' tensors live (the process's GPU with NCCL, else the CPU).
    """
    dist = torch.distributed
    inf = float("inf")
    bounds = torch.tensor(
        [v for s in stats for v in (-s.min if s.min is not None else -inf, s.max if s.max is not None else -inf,
                                     float(s.exponent))],
        dtype=torch.float64, device=device,
    )
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    agreed = bounds.view(-1, 3).tolist()
    histograms: list[torch.Tensor] = []
    for s, (neg_min, max_, exponent) in zip(stats, agreed):
        s.min = None if neg_min == -inf else -neg_min
        s.max = None if max_ == -inf else max_
        if not s.nbins:
            continue
        s._grow(int(exponent), device)
        assert s.positive is not None and s.negative is not None
        histograms += [s.positive.to(device), s.negative.to(device)]
    if histograms:
        flat = torch.cat(histograms)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        parts = iter(flat.split([h.numel() for h in histograms]))
        for s in stats:
            if s.nbins:
                s.positive, s.negative = next(parts).clone(), next(parts).clone()
