"""HAT-style metrics against hand computations and scikit-learn on fixed tensors."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from sklearn.metrics import accuracy_score, jaccard_score, top_k_accuracy_score

from hat_ignite.metrics import (
    Accuracy,
    EvalMetric,
    LossShow,
    MeanIOU,
    MeanIoU,
    TopKAccuracy,
    metric_name_values,
    reset_metrics,
)

LABELS = torch.tensor([0, 1, 2, 2, 1, 0])
LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.0],  # argmax 0, label 0: hit
        [0.5, 0.2, 0.9],  # argmax 2, label 1: miss (1 is last)
        [0.1, 0.3, 0.2],  # argmax 1, label 2: miss (2 is second)
        [0.0, 0.1, 3.0],  # argmax 2, label 2: hit
        [0.3, 0.4, 0.1],  # argmax 1, label 1: hit
        [0.2, 0.9, 0.5],  # argmax 1, label 0: miss (0 is last)
    ]
)


def test_accuracy_is_the_fraction_of_argmax_hits():
    acc = Accuracy()
    acc.update(LABELS, LOGITS)
    assert acc.get() == ("accuracy", 0.5)  # hits at rows 0, 3, 4


def test_accuracy_accumulates_until_reset():
    acc = Accuracy(name="acc")
    acc.update(LABELS[:2], LOGITS[:2])  # 1 of 2
    acc.update(LABELS[2:], LOGITS[2:])  # 2 of 4
    assert acc.get() == ("acc", 0.5)
    acc.reset()
    name, value = acc.get()
    assert name == "acc" and math.isnan(value)
    acc.update(LABELS[:1], LOGITS[:1])
    assert acc.get() == ("acc", 1.0)


def test_accuracy_ignore_index_and_class_index_preds():
    labels = torch.tensor([0, 1, -1, 2])
    scores = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    acc = Accuracy(ignore_index=-1)
    acc.update(labels, scores)  # the -1 row is skipped: 2 hits of 3
    assert acc.get()[1] == pytest.approx(2 / 3)
    by_index = Accuracy(ignore_index=-1)
    by_index.update(labels, torch.tensor([0, 0, 2, 2]))
    assert by_index.get()[1] == pytest.approx(2 / 3)


def test_accuracy_per_pixel_scores():
    labels = torch.tensor([[[0, 1], [1, 1]]])  # (N=1, H=2, W=2)
    scores = torch.zeros(1, 2, 2, 2)
    scores[0, 1] = 1.0  # every pixel predicts class 1: 3 of 4 pixels right
    acc = Accuracy()
    acc.update(labels, scores)
    assert acc.get()[1] == 0.75


def test_accuracy_and_topk_match_sklearn_over_batches():
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 7, (300,), generator=g)
    scores = torch.randn(300, 7, generator=g) + 1.5 * torch.nn.functional.one_hot(labels, 7)
    acc, top3 = Accuracy(), TopKAccuracy(top_k=3)
    for i in range(0, 300, 64):  # uneven last batch
        acc.update(labels[i : i + 64], scores[i : i + 64])
        top3.update(labels[i : i + 64], scores[i : i + 64])
    assert acc.get()[1] == pytest.approx(accuracy_score(labels.numpy(), scores.argmax(1).numpy()), abs=1e-6)
    assert top3.get()[1] == pytest.approx(
        top_k_accuracy_score(labels.numpy(), scores.numpy(), k=3, labels=list(range(7))), abs=1e-6
    )


def test_topk_accuracy_hand_computed():
    top2 = TopKAccuracy(top_k=2)
    top2.update(LABELS, LOGITS)
    # top-2 sets: {0,1} {2,0} {1,2} {2,1} {1,0} {1,2}; hits at rows 0, 2, 3, 4
    assert top2.get() == ("top_k_accuracy", pytest.approx(4 / 6))


def test_classification_input_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="labels first"):
        Accuracy().update(LOGITS, LABELS)  # swapped arguments
    with pytest.raises(ValueError, match="top_k=4 is larger than the 3 classes"):
        TopKAccuracy(top_k=4).update(LABELS, LOGITS)
    with pytest.raises(ValueError, match="top_k must be an integer >= 1"):
        TopKAccuracy(top_k=0)
    acc = Accuracy()
    acc.update(LABELS, LOGITS)
    with pytest.raises(ValueError, match="earlier updates had 3"):
        acc.update(torch.tensor([0]), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="num_classes=3"):
        Accuracy(num_classes=3).update(torch.tensor([0]), torch.tensor([5]))


def test_loss_show_means_per_update():
    show = LossShow()
    show.update(torch.tensor(1.0))
    show.update(torch.tensor([2.0, 4.0]))  # mean 3
    show.update([torch.tensor(1.0), torch.tensor(1.0)])  # total 2
    show.update(None)  # nothing to add
    assert show.get() == ("loss", 2.0)
    show.reset()
    assert math.isnan(show.get()[1])


def test_loss_show_dict_reports_each_key():
    show = LossShow()
    show.update({"cls": torch.tensor(1.0), "reg": torch.tensor(4.0)})
    show.update({"cls": torch.tensor(2.0), "reg": torch.tensor(2.0)})
    assert show.get() == (["cls", "reg"], [1.5, 3.0])
    with pytest.raises(ValueError, match="dict of losses after single losses|one kind per LossShow"):
        show.update(torch.tensor(1.0))
    with pytest.raises(TypeError, match="must be a tensor"):
        LossShow().update("0.3")


def _iou_by_hand(labels: list[int], preds: list[int], num_classes: int, ignore: int | None) -> list[float]:
    ious = []
    for c in range(num_classes):
        tp = fp = fn = 0
        for t, p in zip(labels, preds):
            if t == ignore:
                continue
            tp += t == c and p == c
            fp += t != c and p == c
            fn += t == c and p != c
        ious.append(tp / (tp + fp + fn) if tp + fp + fn else float("nan"))
    return ious


def test_mean_iou_matches_a_hand_confusion_matrix():
    labels = torch.tensor([[0, 0, 1, 1, 2, 255], [2, 2, 1, 0, 0, 255]])
    preds = torch.tensor([[0, 1, 1, 1, 2, 0], [2, 0, 1, 0, 1, 2]])
    miou = MeanIoU(num_classes=4, verbose=True)  # class 3 never appears: excluded from the mean
    miou.update(labels[:1], preds[:1])
    miou.update(labels[1:], preds[1:])
    per_class = _iou_by_hand(labels.flatten().tolist(), preds.flatten().tolist(), 4, 255)
    names, values = miou.get()
    assert names == ["mean_iou", "mean_iou_class_0", "mean_iou_class_1", "mean_iou_class_2", "mean_iou_class_3"]
    assert values[1:4] == pytest.approx(per_class[:3]) and math.isnan(values[4])
    assert values[0] == pytest.approx(sum(per_class[:3]) / 3)
    keep = labels.flatten() != 255
    sk = jaccard_score(labels.flatten()[keep].numpy(), preds.flatten()[keep].numpy(), labels=[0, 1, 2], average=None)
    assert values[1:4] == pytest.approx(sk.tolist())


def test_mean_iou_takes_scores_and_resets():
    labels = torch.tensor([[[0, 1], [1, 1]]])
    scores = torch.zeros(1, 2, 2, 2)
    scores[0, 1] = 1.0  # predicts 1 everywhere: IoU_0 = 0/1, IoU_1 = 3/4
    miou = MeanIOU(num_classes=2, ignore_index=None)
    miou.update(labels, scores)
    assert miou.get() == ("mean_iou", pytest.approx(0.375))
    miou.reset()
    assert math.isnan(miou.get()[1])
    with pytest.raises(ValueError, match="num_classes=2"):
        miou.update(labels, torch.zeros(1, 3, 2, 2))


def test_eval_metric_subclass_and_name_values_of_mixed_metrics():
    from torchmetrics.aggregation import SumMetric

    class MeanAbs(EvalMetric):
        def update(self, values):
            self.sum_metric += float(values.abs().sum())
            self.num_inst += values.numel()

    mean_abs, total = MeanAbs("mean_abs"), SumMetric()
    mean_abs.update(torch.tensor([-1.0, 3.0]))
    total.update(torch.tensor([2.0, 5.0]))
    show = LossShow()
    show.update({"a": torch.tensor(1.0), "b": torch.tensor(2.0)})
    pairs = metric_name_values({"task": [mean_abs, show], "other": total})
    assert pairs == [("mean_abs", 2.0), ("a", 1.0), ("b", 2.0), ("SumMetric", 7.0)]
    reset_metrics([mean_abs, total])
    assert math.isnan(mean_abs.get()[1])
    with pytest.raises(TypeError, match="is not a metric"):
        metric_name_values([object()])
    with pytest.raises(NotImplementedError, match="must implement update"):
        EvalMetric("x").update(1)


def test_importing_metrics_does_not_import_torchmetrics():
    code = "import sys, hat_ignite.metrics; print('torchmetrics' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_metrics_follow_the_input_device():
    acc, miou, show = Accuracy(), MeanIoU(num_classes=3), LossShow()
    acc.update(LABELS.cuda(), LOGITS.cuda())
    miou.update(LABELS.cuda(), LOGITS.cuda())
    show.update(torch.tensor(2.0, device="cuda"))
    assert acc.get()[1] == 0.5 and show.get()[1] == 2.0
    cpu = MeanIoU(num_classes=3)
    cpu.update(LABELS, LOGITS)
    assert miou.get()[1] == pytest.approx(cpu.get()[1])
    acc.update(LABELS, LOGITS)  # later batches on another device move the state along
    assert acc.get()[1] == 0.5


def test_mean_average_precision_matches_sklearn_over_batches():
    from sklearn.metrics import average_precision_score

    from hat_ignite.metrics import MeanAveragePrecision

    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 4, (60,), generator=gen)
    scores = torch.randn(60, 4, generator=gen) + torch.nn.functional.one_hot(labels, 4)  # informative
    mean_ap = MeanAveragePrecision(num_classes=4)
    for i in range(0, 60, 16):  # batches of 16, 16, 16, 12
        mean_ap.update(labels[i:i + 16], scores[i:i + 16])
    probs = scores.softmax(dim=1)  # logits: torchmetrics ranks softmax probabilities
    expected = average_precision_score(torch.nn.functional.one_hot(labels, 4).numpy(), probs.numpy(), average="macro")
    assert mean_ap.get() == ("mean_ap", pytest.approx(float(expected), abs=1e-6))
    mean_ap.reset()
    assert math.isnan(mean_ap.get()[1])
    with pytest.raises(ValueError, match=r"one score per class, shape \(N, 4\)"):
        mean_ap.update(labels[:4], scores[:4, :3])
