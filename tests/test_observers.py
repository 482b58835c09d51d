"""HAT's calibration observers on activations with outliers: each range as its definition says.

The expected ranges are computed here from the raw values with numpy / torch's own fake
quantization, not with the observers' code: the percentile of ``|x|`` by sorting, the histogram
by ``numpy.histogram``, TensorRT's KL search as a loop over the candidate thresholds, the MSE of
each candidate range on the raw data.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from hat_ignite.quantization import Calibration2QAT, Float2Calibration, Float2QAT, ModelConvertPipeline, observing
from hat_ignite.quantization.observers.checkpoint import CalibrationStatistics
from hat_ignite.quantization.observers.rules import MIX_PERCENTILES
from hat_ignite.quantization.observers.statistics import Statistics
from hat_ignite.quantization.qconfig import parse_qconfig_params

BINS = 512  # the observers' option; their histogram has 2 * BINS bins over [0, 2**e)
EPS = 2.0**-12  # the X86 quantizer's eps


def outlier_batches(n: int = 4, rows: int = 3000, seed: int = 1) -> list[torch.Tensor]:
    """Gaussian activations (16 features) with two large outliers in all: 192,000 values."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randn(rows, 16, generator=g) for _ in range(n)]
    batches[1][7, 3] = 14.0
    batches[-1][100, 5] = -9.5
    return batches


_PREPARED: list[nn.Module] = []


def calibrated_input_range(observer: str, batches: list[torch.Tensor], **options) -> tuple[float, float]:
    """The range the activation observer ``observer`` gives the input of a Linear after ``batches``.

    One prepared model serves every call (exporting takes a while): ``set_qconfig``, as a
    ``ModelConvertPipeline`` calls it, gives it fresh observers each time.
    """
    qconfig = dict(activation_calibration_observer=observer)
    if options:
        qconfig["activation_calibration_qkwargs"] = options
    if not _PREPARED:
        _PREPARED.append(Float2Calibration(example_inputs=batches[0])(nn.Sequential(nn.Linear(16, 4))))
    model = _PREPARED[0]
    model.set_qconfig(parse_qconfig_params(qconfig))
    with observing(model), torch.no_grad():
        for x in batches:
            model.eval()(x)
    observed = model.graph.activation_post_process_0.activation_post_process
    return float(observed.min_val), float(observed.max_val)


# -- independent references ----------------------------------------------------------------
def histogram_range(x: np.ndarray, bins: int) -> tuple[float, int]:
    """Bin width and bin count of the observers' histogram: 2 * bins over [0, 2**e), max|x| < 2**e."""
    nbins = 2 * bins
    return 2.0 ** np.frexp(np.abs(x).max())[1] / nbins, nbins


def percentile_clip(x: np.ndarray, percentile: float, bins: int) -> float:
    """The upper edge of the bin holding the ceil(p % * n)-th smallest |x|."""
    width, _ = histogram_range(x, bins)
    k = math.ceil(percentile / 100 * x.size)
    kth = np.sort(np.abs(x))[k - 1]
    return (math.floor(kth / width) + 1) * width


def clipped(x: np.ndarray, c: float) -> tuple[float, float]:
    return max(float(x.min()), -c), min(float(x.max()), c)


def fake_quant_mse(x: torch.Tensor, lo: float, hi: float) -> float:
    """Mean squared error of uint8 affine fake quantization of ``x`` with the range ``(lo, hi)``."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / 255, EPS)
    zero_point = int(min(max(-round(lo / scale), 0), 255))
    return float((torch.fake_quantize_per_tensor_affine(x, scale, zero_point, 0, 255) - x).square().mean())


def tensorrt_kl_bins(x: np.ndarray, bins: int) -> tuple[int, list[float]]:
    """TensorRT's entropy calibration written out: each candidate i kept bins, KL(P || Q)."""
    width, nbins = histogram_range(x, bins)
    edges = (0.0, width * nbins)
    hist = (np.histogram(x[x >= 0], bins=nbins, range=edges)[0]
            + np.histogram(-x[x < 0], bins=nbins, range=edges)[0]).astype(np.float64)
    hist[0] = hist[1]  # NVIDIA's pytorch-quantization: ReLU zeros count as the next bin
    used = int(np.nonzero(hist)[0].max()) + 1
    divergences = []
    for i in range(128, used + 1):
        p = hist[:i].copy()
        p[i - 1] += hist[i:].sum()
        level = np.arange(i) * 128 // i
        level_sum = np.bincount(level, weights=hist[:i], minlength=128)
        level_nonzero = np.bincount(level, weights=(hist[:i] > 0).astype(float), minlength=128)
        q = np.where(hist[:i] > 0, level_sum[level] / np.maximum(level_nonzero[level], 1), 0.0)
        p, q = p / p.sum(), q / q.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p / q), 0.0)
        divergences.append(float(terms.sum()))
    return 128 + int(np.argmin(divergences)), divergences


# -- the observers -------------------------------------------------------------------------
def test_min_max_is_the_range_of_all_batches_whatever_their_order():
    batches = outlier_batches()
    data = torch.cat(batches)
    assert calibrated_input_range("min_max", batches) == (float(data.min()), float(data.max())) == (
        calibrated_input_range("min_max", batches[::-1]))


def test_percentile_clips_at_the_percentile_of_the_magnitudes():
    batches = outlier_batches()
    x = torch.cat(batches).numpy().ravel()
    for percentile in (99.99, 99.9):
        got = calibrated_input_range("percentile", batches, percentile=percentile, bins=BINS)
        assert got == clipped(x, percentile_clip(x, percentile, BINS))
        share = np.mean((x >= got[0]) & (x <= got[1]))
        assert share >= percentile / 100 and got[1] < 5.0  # the outliers (14, -9.5) are clipped


def test_mse_takes_the_candidate_range_with_the_least_quantization_error():
    batches = outlier_batches()
    data = torch.cat(batches)
    lo, hi = calibrated_input_range("mse", batches, bins=BINS)
    alpha = lo / float(data.min())
    assert hi == pytest.approx(alpha * float(data.max()), rel=1e-6)
    errors = {k: fake_quant_mse(data, (1 - k / 100) * float(data.min()), (1 - k / 100) * float(data.max()))
              for k in range(95)}
    best = min(errors.values())
    assert fake_quant_mse(data, lo, hi) <= 1.02 * best  # the histogram stands for the raw values
    assert alpha < 0.8 and best < 0.8 * errors[0]  # clipping the two outliers pays


def test_kl_is_tensorrts_entropy_threshold():
    batches = outlier_batches()
    x = torch.cat(batches).numpy().ravel()
    best, divergences = tensorrt_kl_bins(x, BINS)
    width, _ = histogram_range(x, BINS)
    got = calibrated_input_range("kl", batches, bins=BINS)
    kept = round(got[1] / width)
    assert got == clipped(x, kept * width) and kept * width == got[1]
    assert divergences[kept - 128] == pytest.approx(divergences[best - 128], rel=1e-9, abs=1e-12)
    assert got[1] < 5.0


def test_mix_takes_the_percentile_or_full_range_with_the_least_error():
    batches = outlier_batches()
    data = torch.cat(batches)
    x = data.numpy().ravel()
    candidates = [clipped(x, percentile_clip(x, p, 2048)) for p in MIX_PERCENTILES]
    candidates.append((float(x.min()), float(x.max())))
    got = calibrated_input_range("mix", batches)
    assert got in candidates
    assert fake_quant_mse(data, *got) <= 1.02 * min(fake_quant_mse(data, *c) for c in candidates)


def test_ranges_do_not_depend_on_the_order_of_the_batches():
    batches = outlier_batches()
    for observer in ("percentile", "mse", "kl", "mix"):
        assert calibrated_input_range(observer, batches) == calibrated_input_range(observer, batches[::-1]), observer


def test_statistics_merge_and_reduce_exactly():
    """Two shards merged (as the processes of a calibration are summed) are one process's statistics,
    and the histogram is numpy's over the same range."""
    batches = outlier_batches()
    one, first, second = Statistics(BINS), Statistics(BINS), Statistics(BINS)
    for x in batches:
        one.observe(x)
    for x in batches[::2]:
        first.observe(x)
    for x in batches[1::2]:
        second.observe(x)
    first.merge(second)
    assert first.same_as(one)
    x = torch.cat(batches).numpy().ravel()
    width, nbins = histogram_range(x, BINS)
    assert one.width == width and one.nbins == nbins
    assert one.positive.tolist() == np.histogram(x[x >= 0], bins=nbins, range=(0, width * nbins))[0].tolist()
    assert one.negative.tolist() == np.histogram(-x[x < 0], bins=nbins, range=(0, width * nbins))[0].tolist()
    with_inf = Statistics(BINS)
    with_inf.observe(torch.tensor([float("inf"), float("nan"), 1.0, -2.0]))
    assert (with_inf.min, with_inf.max, int(with_inf.positive.sum() + with_inf.negative.sum())) == (-2.0, 1.0, 2)


def test_weight_mse_takes_each_channels_best_range():
    torch.manual_seed(0)
    linear = nn.Linear(1024, 8)
    with torch.no_grad():  # heavy-tailed weights, where a slightly narrower range pays
        linear.weight.copy_(torch.distributions.Laplace(0.0, 0.02).sample((8, 1024)))
    x = torch.randn(4, 1024)
    model = ModelConvertPipeline(
        converters=[Float2Calibration(example_inputs=x)],
        qconfig_params=dict(activation_calibration_observer="min_max", weight_calibration_observer="mse"),
    )(nn.Sequential(linear))
    with observing(model), torch.no_grad():
        model.eval()(x)
    observed = model.graph.activation_post_process_1.activation_post_process  # the weight's
    w = linear.weight.detach()
    lo, hi = torch.aminmax(w, dim=1)
    chosen = []
    for channel in range(8):
        errors = []
        for k in range(95):
            a = 1 - k / 100
            scale = max(max(-a * float(lo[channel]), a * float(hi[channel])) / 127.5, EPS)
            q = torch.fake_quantize_per_tensor_affine(w[channel], scale, 0, -128, 127)
            errors.append(float((q - w[channel]).square().sum()))
        a = 1 - int(np.argmin(errors)) / 100
        assert float(observed.max_val[channel]) == pytest.approx(a * float(hi[channel]), rel=1e-6)
        assert float(observed.min_val[channel]) == pytest.approx(a * float(lo[channel]), rel=1e-6)
        chosen.append(a)
    assert min(chosen) < 1.0, chosen  # not simply each channel's min and max


def test_every_observer_loads_into_qat_which_starts_from_its_range(tmp_path):
    """The state_dict is torchao's whatever the observer: Float2QAT + LoadCheckpoint as in HAT's qat stage."""
    batches = outlier_batches(n=2, rows=500)
    qat = Float2QAT(example_inputs=batches[0])(nn.Sequential(nn.Linear(16, 4)))
    for observer in ("min_max", "percentile", "mse", "kl", "mix"):
        model = ModelConvertPipeline(converters=[Float2Calibration(example_inputs=batches[0])],
                                     qconfig_params=dict(activation_calibration_observer=observer))(nn.Sequential(nn.Linear(16, 4)))
        with observing(model), torch.no_grad():
            for x in batches:
                model.eval()(x)
        state = model.state_dict()
        assert list(state) == list(qat.state_dict())
        qat.load_state_dict(state)
        assert torch.equal(qat.graph.activation_post_process_0.scale, model.graph.activation_post_process_0.scale)
        Calibration2QAT()(model)
        assert model.stage == "qat" and torch.equal(model.state_dict()["graph.activation_post_process_0.scale"],
                                                    state["graph.activation_post_process_0.scale"])


def test_calibration_statistics_survive_a_weights_only_checkpoint():
    batches = outlier_batches(n=4, rows=500)

    def prepared() -> nn.Module:
        torch.manual_seed(0)
        return ModelConvertPipeline(converters=[Float2Calibration(example_inputs=batches[0])],
                                    qconfig_params=dict(activation_calibration_observer="kl"))(nn.Sequential(nn.Linear(16, 4)))

    class Engine:
        def __init__(self, model):
            self.model = model

    straight, stopped = prepared(), prepared()
    for model, seen in ((straight, batches), (stopped, batches[:2])):
        with observing(model), torch.no_grad():
            for x in seen:
                model.eval()(x)
    saved = CalibrationStatistics()
    saved.attach(Engine(stopped))
    buffer = io.BytesIO()
    torch.save({"state_dict": stopped.state_dict(), "stats": saved.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed = prepared()
    resumed.load_state_dict(checkpoint["state_dict"])
    restored = CalibrationStatistics()
    restored.attach(Engine(resumed))
    restored.load_state_dict(checkpoint["stats"])
    with observing(resumed), torch.no_grad():
        for x in batches[2:]:
            resumed.eval()(x)
    assert torch.equal(resumed.state_dict()["graph.activation_post_process_0.activation_post_process.max_val"],
                       straight.state_dict()["graph.activation_post_process_0.activation_post_process.max_val"])
    other = ModelConvertPipeline(converters=[Float2Calibration(example_inputs=batches[0])],
                                 qconfig_params=dict(activation_calibration_observer="mix"))(nn.Sequential(nn.Linear(16, 4)))
    mismatched = CalibrationStatistics()
    mismatched.attach(Engine(other))
    with pytest.raises(ValueError, match="calibrated with 'kl', this run uses 'mix'"):
        mismatched.load_state_dict(checkpoint["stats"])
