"""LossShow and top-1 accuracy keep running sums; their values equal torchmetrics' exactly."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from hat_ignite.metrics import Accuracy, LossShow, TopKAccuracy
from hat_ignite.metrics.running import RunningCounts, RunningMean


def _tm_accuracy(num_classes: int, ignore_index: int | None = None) -> MulticlassAccuracy:
    return MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro", multidim_average="global",
                              ignore_index=ignore_index)


def test_loss_show_equals_mean_metric_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    show, keyed = LossShow(), LossShow()
    reference = MeanMetric(nan_strategy="disable")
    per_key = {"cls": MeanMetric(nan_strategy="disable"), "reg": MeanMetric(nan_strategy="disable")}
    for step in range(300):
        kind = step % 4
        if kind == 0:
            loss = torch.rand((), generator=gen) * 10 ** float(torch.randint(-3, 4, (), generator=gen))
            obs = loss
        elif kind == 1:
            loss = torch.rand(7, generator=gen, dtype=torch.float64)  # a vector counts with its mean
            obs = loss.float().mean()
        elif kind == 2:
            loss = [torch.rand((), generator=gen), torch.rand(3, generator=gen)]
            obs = loss[0] + loss[1].mean()
        else:
            loss = float(torch.rand((), generator=gen))
            obs = torch.tensor(loss)
        show.update(loss)
        reference.update(obs)
        cls, reg = torch.rand((), generator=gen, requires_grad=True), torch.rand((), generator=gen) * 100
        keyed.update({"cls": cls * 1.0, "reg": reg})
        per_key["cls"].update(cls.detach())
        per_key["reg"].update(reg)
        if step % 37 == 0 or step == 299:  # reading a value mid-way changes nothing after it
            assert show.get() == ("loss", float(reference.compute()))
            assert keyed.get() == (["cls", "reg"], [float(m.compute()) for m in per_key.values()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_cpu_loss_summed_on_the_host_equals_a_sum_tensor_of_the_default_dtype(dtype):
    gen = torch.Generator().manual_seed(1)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        mean = RunningMean()
        reference = torch.zeros((), dtype=torch.get_default_dtype())
        for _ in range(50):
            obs = torch.rand((), generator=gen, dtype=torch.float32) * 1000
            mean.update(obs)
            reference.add_(obs)
        assert float(mean.compute()) == float(reference / torch.tensor(50.0, dtype=reference.dtype))
    finally:
        torch.set_default_dtype(old)


def test_a_host_sum_past_float32_range_is_inf_like_a_float32_sum():
    mean, reference = RunningMean(), torch.zeros(())
    for value in (3e38, 3e38, -1.0):
        mean.update(torch.tensor(value))
        reference.add_(torch.tensor(value))
    assert float(mean.total) == float(reference) == math.inf
    assert float(mean.compute()) == math.inf
    negative = LossShow()
    negative.update(torch.tensor(-3e38))
    negative.update(torch.tensor(-3e38))
    assert negative.get() == ("loss", -math.inf)


def test_loss_show_keeps_nan_and_needs_no_grad():
    show = LossShow()
    weight = torch.tensor(2.0, requires_grad=True)
    show.update(weight * 3)
    show.update(torch.tensor(float("nan")))
    assert math.isnan(show.get()[1])
    show.reset()
    show.update(weight * 3)
    assert show.get() == ("loss", 6.0) and weight.grad is None


@pytest.mark.parametrize("ignore_index", [None, -1, 1, 255])
@pytest.mark.parametrize("shape", [(), (3, 4)])
def test_top1_accuracy_equals_multiclass_accuracy_bit_for_bit(ignore_index, shape):
    gen = torch.Generator().manual_seed(1)
    num_classes = 5
    acc, top1 = Accuracy(ignore_index=ignore_index), TopKAccuracy(top_k=1, ignore_index=ignore_index)
    reference = _tm_accuracy(num_classes, ignore_index)
    for step in range(200):
        n = int(torch.randint(1, 40, (), generator=gen))
        labels = torch.randint(0, num_classes, (n, *shape), generator=gen)
        if ignore_index is not None:
            labels[torch.rand(labels.shape, generator=gen) < 0.2] = ignore_index
            if step == 7:
                labels[:] = ignore_index  # a batch with nothing counted
        scores = torch.randn(n, num_classes, *shape, generator=gen)
        scores[:, 2] = scores[:, 3]  # ties: the first of equal scores wins, as in torchmetrics
        if step % 10 == 3:
            scores[0, 4] = float("nan")  # a NaN score counts as the maximum, as in torchmetrics
        acc.update(labels, scores)
        top1.update(labels, scores)
        reference.update(scores, labels)
        if step % 23 == 0 or step == 199:
            assert acc.get()[1] == top1.get()[1] == float(reference.compute())


def test_cpu_scores_are_kept_detached_and_scored_at_the_fold():
    gen = torch.Generator().manual_seed(3)
    acc, reference = Accuracy(), _tm_accuracy(4)
    weight = torch.ones(4, requires_grad=True)
    for step in range(70):  # over one fold's worth of kept batches, with two spatial sizes
        size = 2 if step % 3 else 3
        labels = torch.randint(0, 4, (5, size, size), generator=gen)
        scores = torch.randn(5, 4, size, size, generator=gen) * weight.view(1, 4, 1, 1)
        acc.update(labels, scores)
        reference.update(scores.detach(), labels)
        kept = acc._scores._pending_scores
        assert len(kept) == (step + 1) % 32 and all(not preds.requires_grad for _, preds, _, _ in kept)
    assert acc.get()[1] == float(reference.compute())
    assert not acc._scores._pending_scores  # reading the value scores what was kept


def test_a_kept_batch_changed_in_place_before_the_fold_raises():
    acc = Accuracy()
    labels, scores = torch.tensor([0, 1]), torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    acc.update(labels, scores)
    acc.update(labels, scores.clone())
    scores[0, 1] = 5.0  # e.g. a reused output buffer
    with pytest.raises(RuntimeError, match=r"labels or preds of 1 batch\(es\) .* changed in place"):
        acc.get()
    acc.reset()
    acc.update(labels, scores)
    assert acc.get()[1] == 0.5


@pytest.mark.parametrize("ignore_index", [None, 2])
def test_inference_mode_scores_are_counted_at_once(ignore_index):
    # inference tensors keep no version counter, so they cannot be kept until a fold
    acc, reference = Accuracy(ignore_index=ignore_index), _tm_accuracy(4, ignore_index)
    gen = torch.Generator().manual_seed(4)
    for step in range(5):
        labels, scores = torch.randint(0, 4, (6,), generator=gen), torch.randn(6, 4, generator=gen)
        reference.update(scores, labels)
        if step % 2:
            with torch.inference_mode():
                labels, scores = labels.clone(), scores.clone()
        acc.update(labels, scores)
    assert len(acc._scores._pending_scores) == 3  # the others were scored at once
    assert acc.get()[1] == float(reference.compute())


def test_accuracy_counts_nothing_counted_as_zero_like_torchmetrics():
    acc, reference = Accuracy(ignore_index=-1), _tm_accuracy(3, -1)
    labels, scores = torch.tensor([-1, -1]), torch.randn(2, 3)
    acc.update(labels, scores)
    reference.update(scores, labels)
    assert acc.get()[1] == float(reference.compute()) == 0.0


@pytest.mark.parametrize("ignore_index", [None, -1])
def test_class_index_accuracy_equals_the_mean_of_hits(ignore_index):
    gen = torch.Generator().manual_seed(2)
    acc, reference = Accuracy(ignore_index=ignore_index), MeanMetric(nan_strategy="error")
    for _ in range(50):
        labels = torch.randint(-1 if ignore_index is not None else 0, 4, (6, 5), generator=gen)
        preds = torch.randint(0, 4, (6, 5), generator=gen, dtype=torch.int32)
        acc.update(labels, preds)
        hits = (preds.long() == labels).float()
        if ignore_index is not None:
            hits = hits[labels != ignore_index]
        if hits.numel():
            reference.update(hits)
    assert acc.get()[1] == float(reference.compute())
    acc.reset()
    assert math.isnan(acc.get()[1])
    if ignore_index is not None:
        acc.update(torch.tensor([-1]), torch.tensor([0]))
        assert math.isnan(acc.get()[1])  # nothing counted: nan, as the mean of no hits


def test_inputs_are_converted_alike_on_checked_and_later_updates():
    gen = torch.Generator().manual_seed(4)
    acc, reference = Accuracy(), _tm_accuracy(3)
    for _ in range(5):  # float labels, float64 scores: converted at every update
        labels = torch.randint(0, 3, (8,), generator=gen)
        scores = torch.randn(8, 3, generator=gen, dtype=torch.float64)
        acc.update(labels.double(), scores)
        reference.update(scores.float(), labels)
    assert acc.get()[1] == float(reference.compute())


def test_updates_that_differ_from_the_kept_signature_are_checked_and_converted():
    # after a checked update, CPU scores of the same shapes and dtypes are only kept; labels of
    # another dtype (float, int32) or scores of another dtype or shape go through the checks
    gen = torch.Generator().manual_seed(6)
    acc, reference = Accuracy(), _tm_accuracy(3)
    for step in range(12):
        labels = torch.randint(0, 3, (8,), generator=gen)
        scores = torch.randn(8, 3, generator=gen)
        given_labels, given_scores = labels, scores
        if step % 4 == 1:
            given_labels = labels.double()
        elif step % 4 == 2:
            given_labels, given_scores = labels.int(), scores.double()
        elif step % 4 == 3:
            labels, scores = labels[:5], scores[:5]
            given_labels, given_scores = labels, scores
        acc.update(given_labels, given_scores)
        reference.update(given_scores.float(), labels)
    assert acc.get()[1] == float(reference.compute())
    with pytest.raises(ValueError, match="non-integral floats"):
        acc.update(torch.tensor([0.5] * 8), torch.randn(8, 3))  # kept signature's shapes, new dtype


def test_checks_run_on_the_first_update_after_a_reset_and_when_the_signature_changes():
    acc = Accuracy()
    acc.update(torch.tensor([0, 1]), torch.randn(2, 3))
    acc.update(torch.tensor([0, 1]), torch.randn(2, 3))  # same signature: counted only
    with pytest.raises(ValueError, match="earlier updates had 3"):
        acc.update(torch.tensor([0, 1]), torch.randn(2, 4))
    with pytest.raises(ValueError, match="labels first"):
        acc.update(torch.randn(3, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="non-integral floats"):
        acc.update(torch.tensor([0.5, 1.0]), torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="4 distinct values, more than the 3 classes"):
        acc.update(torch.tensor([0, 1, 2, 7]), torch.randn(4, 3))
    acc.reset()
    with pytest.raises(RuntimeError, match="distinct values"):
        acc.update(torch.tensor([0, 1, 2, 7]), torch.randn(4, 3))  # first update after a reset
    indices = Accuracy(num_classes=3)
    with pytest.raises(ValueError, match="num_classes=3"):
        indices.update(torch.tensor([0, 1]), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="ignore_index must be None or an integer"):
        Accuracy(ignore_index=0.5)


def test_mixing_scores_and_class_indices_is_an_error():
    acc = Accuracy()
    acc.update(torch.tensor([0, 1]), torch.randn(2, 3))
    acc.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="mixed class scores and class indices"):
        acc.get()


def test_running_sums_fold_and_count():
    counts = RunningCounts()
    assert counts.compute() is None
    hits = sum(i % 3 for i in range(200))
    for i in range(200):  # more updates than one fold holds; counts on the host and as masks
        mask = torch.arange(4) < i % 3
        counts.update(mask, 2 if i % 2 else torch.tensor([True, False, True, False]))
    assert counts.totals().tolist() == [hits, 400, 200]
    assert float(counts.compute()) == float(torch.tensor(hits, dtype=torch.float32) / torch.tensor(400.0))
    assert counts.value() == float(counts.compute()) and int(counts.hits) == hits  # counts stay tensors
    mixed = RunningCounts()  # masks that cannot be concatenated are counted one by one
    for mask in (torch.ones(2, 3, dtype=torch.bool), torch.ones(2, 4, dtype=torch.bool), torch.tensor(True)):
        mixed.update(mask, mask.numel())
    assert mixed.totals().tolist() == [15, 15, 3]
    big = RunningCounts()
    for _ in range(3):  # masks of a million elements are counted at once
        big.update(torch.ones(2**20, dtype=torch.bool), 2**20)
        assert not big._pending_hits
    assert big.totals().tolist() == [3 * 2**20, 3 * 2**20, 3]
    counts.reset()
    counts.update(torch.zeros(0, dtype=torch.bool), 0)
    assert float(counts.compute()) == 0.0 and counts.compute(nan_if_none_counted=True) is None
    assert counts.value() == 0.0 and counts.value(nan_if_none_counted=True) is None
    mean = RunningMean()
    assert mean.compute() is None and mean.value() is None
    mean.update(torch.tensor(1.0))
    mean.update(torch.tensor(2.0))
    assert float(mean.compute()) == 1.5 and mean.compute().dtype == torch.float32
    assert mean.value() == 1.5
    mean.reset()
    assert mean.compute() is None and mean.count == 0


def test_loss_show_and_accuracy_do_not_import_torchmetrics():
    code = (
        "import sys, torch\n"
        "from hat_ignite.metrics import Accuracy, LossShow, metric_name_values\n"
        "acc, show = Accuracy(ignore_index=-1), LossShow()\n"
        "acc.update(torch.tensor([0, 1]), torch.randn(2, 3)); show.update({'cls': torch.tensor(1.0)})\n"
        "metric_name_values([acc, show]); print('torchmetrics' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
