"""The range each calibration observer takes from its :class:`~.statistics.Statistics`.

A range is ``(lo, hi)``, the ``min_val`` / ``max_val`` torchao's observer turns into the uint8
scale and zero point of an activation. ``|x|`` below is the histogram of magnitudes (both signs
together); a clip value ``c`` gives the range ``(max(min, -c), min(max, c))``.

=============  ====================================================================================
observer       range
=============  ====================================================================================
``min_max``    the smallest and largest value of all calibration data
``percentile`` clip at the ``percentile`` of ``|x|``: the upper edge of the first histogram bin at
               which the cumulative count reaches ``percentile`` % of the values (at least that
               share of the values lies inside the range); horizon_plugin_pytorch's definition
``mse``        ``alpha * (min, max)`` for ``alpha`` = 1, 0.99, ..., 0.06 (every ``stride``-th), the
               one whose fake quantization of the histogram (bin centres weighted by their counts,
               quantized with the activation's own scale and zero point) has the least mean
               squared error; horizon's candidates, NVIDIA pytorch-quantization's histogram error
``kl``         TensorRT's entropy calibration: for each ``i`` from 128 bins to the last non-empty
               one, ``P`` = the first ``i`` bins of ``|x|`` with the rest added to bin ``i - 1``,
               ``Q`` = those ``i`` bins merged into 128 levels and spread back evenly over each
               level's non-empty bins; clip at the upper edge of the ``i`` with the least
               ``KL(P || Q)``. As in NVIDIA's pytorch-quantization and horizon, the first bin
               (the zeros a ReLU makes) counts as much as the second
``mix``        horizon's mix observer: the clip values at the 99.9, 99.95, 99.99, 99.993, 99.995,
               99.997, 99.999, 99.9995 and 99.9999 percentiles of ``|x|`` and the full range, the
               one with the least squared error as for ``mse``
=============  ====================================================================================
"""

from __future__ import annotations

from typing import Callable

import torch

from hat_ignite.quantization.observers.statistics import NO_DATA, Statistics

__all__ = ["RULES", "MIX_PERCENTILES", "MSE_STEPS", "clip", "histogram_mse", "range_of"]

#: ``(lo, hi) -> (scale, zero_point)`` for candidate ranges given as tensors (torchao's observer's own).
QParams = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]

#: horizon_plugin_pytorch's percentiles for the ``mix`` observer.
MIX_PERCENTILES = (99.9, 99.95, 99.99, 99.993, 99.995, 99.997, 99.999, 99.9995, 99.9999)
#: horizon's MSE search: ``alpha = 1 - 0.01 * k`` for ``k < MSE_STEPS``.
MSE_STEPS = 95
_KL_LEVELS = 128  # TensorRT: the int8 levels of one sign


def clip(stats: Statistics, c: float) -> tuple[float, float]:
    """The range ``(max(min, -c), min(max, c))``."""
    assert stats.min is not None and stats.max is not None
    return max(stats.min, -c), min(stats.max, c)


def percentile_clips(stats: Statistics, percentiles: tuple[float, ...]) -> list[float]:
    """The clip value for each percentile: the upper edge of the first bin at which the
    cumulative count of ``|x|`` reaches that share of all values."""
    mags = stats.magnitudes()
    cumulative = mags.cumsum(0)
    targets = torch.tensor([p / 100.0 for p in percentiles], dtype=torch.float64, device=mags.device) * cumulative[-1]
    index = torch.searchsorted(cumulative, targets).clamp(max=mags.numel() - 1)
    return [(int(i) + 1) * stats.width for i in index.tolist()]


def histogram_mse(stats: Statistics, lo: torch.Tensor, hi: torch.Tensor, qparams: QParams,
                  quant_min: int, quant_max: int) -> torch.Tensor:
    """The mean squared fake-quantization error of the histogram for each candidate range.

    Every non-empty bin stands for its centre, weighted by its count; each candidate ``(lo[k],
    hi[k])`` is quantized with the scale and zero point ``qparams`` gives it.
    """
    width = stats.width
    nbins = stats.nbins
    assert stats.positive is not None and stats.negative is not None
    centres = (torch.arange(nbins, dtype=torch.float64, device=stats.positive.device) + 0.5) * width
    values = torch.cat([centres, -centres])
    counts = torch.cat([stats.positive, stats.negative]).double()
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    scale, zero_point = qparams(lo.float(), hi.float())
    scale = scale.double().reshape(-1, 1).to(values.device)
    zero_point = zero_point.double().reshape(-1, 1).to(values.device)
    quantized = torch.clamp(torch.round(values / scale + zero_point), quant_min, quant_max)
    error = (quantized - zero_point) * scale - values
    return (error.square() * counts).sum(dim=1) / counts.sum()


def _best(stats: Statistics, candidates: list[tuple[float, float]], qparams: QParams,
          quant_min: int, quant_max: int) -> tuple[float, float]:
    """The candidate range with the least :func:`histogram_mse` (the first of equal ones)."""
    lo = torch.tensor([c[0] for c in candidates], dtype=torch.float64)
    hi = torch.tensor([c[1] for c in candidates], dtype=torch.float64)
    errors = histogram_mse(stats, lo, hi, qparams, quant_min, quant_max)
    return candidates[int(torch.argmin(errors))]


def kl_threshold_bins(mags: torch.Tensor, levels: int = _KL_LEVELS) -> int:
    """TensorRT's entropy calibration on a magnitude histogram: the number of bins ``i`` to keep.

    Returns the ``i`` (from ``levels`` up to the last non-empty bin) whose ``P`` (the first ``i``
    bins, the rest added to the last of them) and ``Q`` (those bins quantized to ``levels`` levels,
    each level's count spread evenly over its non-empty bins) have the least ``KL(P || Q)``
    (``inf`` where ``P`` has counts in an empty bin of ``Q``; the first of equal ones).

    All candidates at once, from prefix sums: with ``T`` the total count, ``C_i`` the count of
    the first ``i`` bins, ``L`` / ``N`` a level's count / non-empty bins and ``L'`` the last
    level's count plus the outliers, ``KL = (sum P log P - sum_levels L' log(L / N)) / T
    - log T + log C_i`` (``P`` and ``Q`` normalised, as TensorRT and scipy do).
    """
    mags = mags.double().clone()
    if mags.numel() > 1:  # as NVIDIA's pytorch-quantization and horizon: the zeros of a ReLU count as bin 1
        mags[0] = mags[1]
    nonzero = mags > 0
    used = int(torch.nonzero(nonzero).max()) + 1 if bool(nonzero.any()) else 0
    if used <= levels:
        return max(used, 1)
    zero = torch.zeros(1, dtype=torch.float64, device=mags.device)
    count = torch.cat([zero, mags.cumsum(0)])  # count[k] = sum(mags[:k])
    plogp = torch.cat([zero, torch.where(nonzero, mags * mags.log(), 0.0).cumsum(0)])
    filled = torch.cat([zero, nonzero.double().cumsum(0)])
    total = count[-1]
    sizes = torch.arange(levels, used + 1, device=mags.device)  # candidate i
    tail = total - count[sizes]
    edges = (torch.arange(levels + 1, device=mags.device) * sizes.unsqueeze(1) + levels - 1) // levels  # [C, levels+1]
    level_count = count[edges[:, 1:]] - count[edges[:, :-1]]
    level_filled = filled[edges[:, 1:]] - filled[edges[:, :-1]]
    weight = level_count.clone()
    weight[:, -1] += tail
    cross = torch.where(level_count > 0, weight * (level_count / level_filled.clamp(min=1)).log(), 0.0).sum(dim=1)
    last = mags[sizes - 1] + tail
    entropy = plogp[sizes - 1] + torch.where(last > 0, last * last.log(), 0.0)
    kl = (entropy - cross) / total - total.log() + count[sizes].log()
    kl = torch.where((mags[sizes - 1] == 0) & (tail > 0), float("inf"), kl)
    return int(sizes[torch.argmin(kl)])


def range_of(rule: str, stats: Statistics, options: dict, qparams: QParams, quant_min: int,
             quant_max: int) -> tuple[float, float]:
    """The range observer ``rule`` takes from ``stats`` (see the module docstring).

    Args:
        rule: ``"min_max"``, ``"percentile"``, ``"mse"``, ``"kl"`` or ``"mix"``.
        stats: what the observer saw (not empty).
        options: the observer's options (``percentile``, ``stride``).
        qparams: torchao's ``(lo, hi) -> (scale, zero_point)`` of the activation.
        quant_min: the quantized range's smallest value.
        quant_max: its largest.
    """
    assert stats.min is not None and stats.max is not None
    if rule == "min_max" or stats.exponent == NO_DATA:
        return stats.min, stats.max
    if rule == "percentile":
        return clip(stats, percentile_clips(stats, (float(options.get("percentile", 99.99)),))[0])
    if rule == "mse":
        alphas = [1.0 - 0.01 * k for k in range(0, MSE_STEPS, int(options.get("stride", 1)))]
        return _best(stats, [(a * stats.min, a * stats.max) for a in alphas], qparams, quant_min, quant_max)
    if rule == "kl":
        return clip(stats, kl_threshold_bins(stats.magnitudes()) * stats.width)
    if rule == "mix":
        candidates = [clip(stats, c) for c in percentile_clips(stats, MIX_PERCENTILES)] + [(stats.min, stats.max)]
        widest_first = sorted(set(candidates), key=lambda r: r[1] - r[0], reverse=True)
        return _best(stats, widest_first, qparams, quant_min, quant_max)
    raise ValueError(f"unknown calibration observer {rule!r}")


#: The activation calibration observers and what each takes (see the module docstring).
RULES = {
    "min_max": "the smallest and largest value of all calibration data",
    "percentile": "clip at a percentile of |x| (histogram; percentile=99.99, bins=2048)",
    "mse": "alpha * (min, max) with the least fake-quantization MSE, alpha = 1 ... 0.06 (stride=1, bins=2048)",
    "kl": "TensorRT's entropy calibration: the clip with the least KL divergence (bins=2048)",
    "mix": "the percentile clip (99.9 ... 99.9999) or full range with the least MSE (bins=2048)",
}
