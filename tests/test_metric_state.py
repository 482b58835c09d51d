"""Metric state in checkpoints: a metric saved after some batches, loaded into a new one and fed
the remaining batches, reports what one metric fed every batch reports.

The state goes through ``torch.save`` / ``torch.load(weights_only=True)``, as in a checkpoint.
"""

from __future__ import annotations

import io

import pytest
import torch

from hat_ignite.metrics import Accuracy, LossShow, MeanAveragePrecision, MeanIoU, TopKAccuracy


def _batches(seed: int = 0, n: int = 7) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 4, (9,), generator=gen), torch.randn(9, 4, generator=gen)) for _ in range(n)]


def _through_a_file(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("make", [Accuracy, lambda: TopKAccuracy(top_k=2), lambda: MeanAveragePrecision(4),
                                  lambda: MeanIoU(4)], ids=["accuracy", "top2", "mean_ap", "mean_iou"])
@pytest.mark.parametrize("cut", [0, 3, 7])
def test_a_metric_resumed_from_its_state_reports_the_straight_value(make, cut):
    batches = _batches()
    straight, first = make(), make()
    for labels, preds in batches:
        straight.update(labels, preds)
    for labels, preds in batches[:cut]:
        first.update(labels, preds)
    resumed = make()
    resumed.update(*batches[0])  # whatever it held before is replaced by the loaded state
    resumed.load_state_dict(_through_a_file(first.state_dict()))
    for labels, preds in batches[cut:]:
        resumed.update(labels, preds)
    assert resumed.get() == straight.get()


def test_loss_show_resumes_single_and_keyed_losses():
    losses = [torch.tensor(v) for v in (0.7, 1.3, 0.25, 2.0)]
    single, keyed = LossShow(), LossShow()
    for loss in losses[:2]:
        single.update(loss)
        keyed.update({"cls_loss": loss, "reg_loss": loss / 2})
    single2, keyed2 = LossShow(), LossShow()
    single2.load_state_dict(_through_a_file(single.state_dict()))
    keyed2.load_state_dict(_through_a_file(keyed.state_dict()))
    straight_single, straight_keyed = LossShow(), LossShow()
    for loss in losses:
        straight_single.update(loss)
        straight_keyed.update({"cls_loss": loss, "reg_loss": loss / 2})
    for loss in losses[2:]:
        single2.update(loss)
        keyed2.update({"cls_loss": loss, "reg_loss": loss / 2})
    assert single2.get() == straight_single.get()
    assert keyed2.get() == straight_keyed.get()
