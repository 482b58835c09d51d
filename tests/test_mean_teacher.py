"""MeanTeacher against HAT's own figures, and in a real training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from hat_ignite.callbacks.mean_teacher import MeanTeacher
from hat_ignite.engine import BasicBatchProcessor, Trainer
from hat_ignite.registry import build_from_cfg

#: measured with HAT's own MeanTeacher on the same model and the same calls
FIGURES = json.loads((Path(__file__).parent / "data" / "hat_mean_teacher_figures.json").read_text())


class TS(nn.Module):
    """The model the figures were measured on: a student and a teacher copy of Linear + BatchNorm."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.student_net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
        self.teacher_net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
        with torch.no_grad():
            for p in list(self.student_net.parameters()) + list(self.teacher_net.parameters()):
                p.copy_(torch.randn(p.shape, generator=g))
            self.student_net[1].running_mean.copy_(torch.tensor([0.5, -0.25]))
            self.student_net[1].running_var.copy_(torch.tensor([2.0, 3.0]))

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.student_net(x).sum(1), y),)


def test_teacher_follows_hats_average_step_by_step():
    model = TS()
    mt = MeanTeacher(decay=0.9, decay_base=2.0)
    mt.on_loop_begin(loop=None, model=model)  # HAT's keywords
    assert sorted(k for k, p in model.named_parameters() if not p.requires_grad) == FIGURES["frozen"]
    for g, row in enumerate(FIGURES["rows"]):
        with torch.no_grad():
            for p in model.student_net.parameters():
                p.add_(0.1 * (g + 1))
        mt.on_step_end(g, model=model)
        got = {k: v for k, v in model.teacher_net.state_dict().items() if "num_batches" not in k}
        assert sorted(got) == sorted(row)
        for k, v in got.items():
            torch.testing.assert_close(v, torch.tensor(row[k]), rtol=1e-6, atol=1e-7, msg=k)
    assert int(model.teacher_net[1].num_batches_tracked) == 0


def test_in_a_trainer_the_teacher_gets_no_gradient_and_tracks_the_student():
    torch.manual_seed(0)
    model = TS()
    before = [p.detach().clone() for p in model.teacher_net.parameters()]
    data = [(torch.randn(4, 3), torch.randn(4)) for _ in range(5)]
    trainer = Trainer(
        model=model, data_loader=data, device=None, num_epochs=2,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        batch_processor=BasicBatchProcessor(True, loss_collector=lambda out: list(out)),
        callbacks=[build_from_cfg({"type": "MeanTeacher", "decay": 0.5, "decay_base": 1.0})],
    )
    trainer.fit()
    assert all(p.grad is None for p in model.teacher_net.parameters())
    # with d <= 0.5 every step, ten steps leave the teacher near the student, far from where it began
    for t, s, b in zip(model.teacher_net.parameters(), model.student_net.parameters(), before):
        assert (t - s).abs().max() < 0.5 * (b - s).abs().max()


def test_a_model_without_a_matching_teacher_is_named(caplog):
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.student, self.teacher = nn.Linear(2, 2), nn.Linear(2, 2)

    plain = Plain()
    before = plain.teacher.weight.detach().clone()
    mt = MeanTeacher()
    mt.on_loop_begin(model=plain)  # as in HAT, left alone; unlike HAT, said
    mt.on_step_end(global_step_id=0, model=plain)
    assert torch.equal(plain.teacher.weight, before)
    assert "no tensor under a 'teacher_*' sub-module (its children: ['student', 'teacher'])" in caplog.text

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.student_a, self.teacher_a = nn.Linear(2, 2), nn.Linear(2, 3)
    with pytest.raises(ValueError, match=r"teacher's 'teacher_a.weight' \(3, 2\) needs a student tensor 'student_a.weight'"):
        MeanTeacher().on_loop_begin(model=Odd())
    with pytest.raises(ValueError, match=r"decay=1.5"):
        MeanTeacher(decay=1.5)
