"""NaN / Inf guard: a non-finite loss or gradient never reaches the parameters (docs/reliability.md)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, Trainer, collect_loss_by_regex
from hat_ignite.engine.processors.nonfinite import NonFiniteGuard, all_ranks_finite, grads_finite
from hat_ignite.errors import NonFiniteLossError


class Net(nn.Module):
    """Regression with two named losses; ``x[0, 0] == 1000`` makes the loss NaN and
    ``x[0, 0] == -1000`` makes the gradient infinite while the loss stays finite."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x, y):
        pred = self.fc(x)
        mse = nn.functional.mse_loss(pred, y)
        if x[0, 0] == 1000:
            mse = mse * float("nan")
        reg = self.fc.weight.abs().sum() * 1e-3
        if x[0, 0] == -1000:  # d/dw sqrt(w * 0) at 0 is infinite, the value is 0
            reg = reg + torch.sqrt(self.fc.weight[0, 0] * 0.0)
        return {"mse_loss": mse, "reg_loss": reg}


def batches(bad_at: int, marker: float, n: int = 4):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x, y = torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)
        if i == bad_at:
            x[0, 0] = marker
        out.append((x, y))
    return out


class Snapshots(CallbackMixin):
    def __init__(self) -> None:
        self.params, self.momenta = [], []

    def on_step_end(self, model, optimizer, **kwargs):
        self.params.append([p.detach().clone() for p in model.parameters()])


def run(data, processor, num_epochs=1, callbacks=()):
    torch.manual_seed(0)
    model = Net()
    trainer = Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                      batch_processor=processor, device=None, num_epochs=num_epochs, callbacks=list(callbacks))
    return trainer


def processor(**kwargs):
    return BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss"), **kwargs)


@pytest.mark.parametrize("marker, what", [(1000.0, "Non-finite loss"), (-1000.0, "Non-finite gradient")])
def test_a_plain_optimizer_raises_naming_the_step_without_a_host_read_per_step(marker, what):
    """Plain SGD cannot skip an update on the device: under the default policy the guard still
    reads nothing per step; the flags of step 2 are read at step 3 and the run stops naming
    step 2 (nothing is saved: tests/test_nonfinite_checkpoint.py)."""
    snaps = Snapshots()
    trainer = run(batches(2, marker, n=6), processor(), callbacks=[snaps])
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit()
    message = str(info.value)
    assert message.startswith(f"{what} at epoch_id=0, step_id=2, global_step_id=2, batch_idx=0")
    assert "SGD cannot skip an update on the device" in message and "do not save them" in message
    assert trainer.state.iteration == 4  # raised inside step 3, when step 2's flags were read
    assert len(snaps.params) == 3  # steps 0, 1 and 2 finished


@pytest.mark.parametrize("marker, what, names", [
    (1000.0, "Non-finite loss", "mse_loss=nan"),
    (-1000.0, "Non-finite gradient", "parameters fc.weight"),
])
def test_skip_policy_with_a_plain_optimizer_checks_before_the_update(marker, what, names, caplog):
    """Under ``nonfinite_policy="skip"`` a plain optimizer needs the blocking check: the bad
    step's update (and its momentum) never happens, and the log names the loss or parameter."""
    snaps = Snapshots()
    trainer = run(batches(2, marker), processor(nonfinite_policy="skip"), callbacks=[snaps])
    momenta = []

    class KeepMomentum(CallbackMixin):
        def on_step_end(self, optimizer, **kwargs):
            momenta.append([s["momentum_buffer"].clone() for s in optimizer.state.values()])

    trainer.attach_callbacks([KeepMomentum()])
    with caplog.at_level(logging.WARNING, logger="hat_ignite.engine.processors.nonfinite"):
        trainer.fit()
    assert trainer.state.nonfinite_skipped == 1
    assert all(torch.equal(a, b) for a, b in zip(snaps.params[1], snaps.params[2]))
    assert all(torch.equal(a, b) for a, b in zip(momenta[1], momenta[2]))
    text = [r.getMessage() for r in caplog.records]
    assert len(text) == 1 and f"{what.lower()} at epoch_id=0, step_id=2" in text[0] and names in text[0]


def test_skip_mode_drops_and_counts_the_bad_updates(caplog):
    snaps = Snapshots()
    data = batches(1, 1000.0) + batches(0, -1000.0, n=2)  # a NaN loss at step 1, an Inf gradient at step 4
    trainer = run(data, processor(nonfinite_policy="skip"), callbacks=[snaps])
    with caplog.at_level(logging.WARNING, logger="hat_ignite.engine.processors.nonfinite"):
        trainer.fit()
    assert trainer.state.iteration == 6 and trainer.state.nonfinite_skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(snaps.params[0], snaps.params[1]))  # step 1 skipped
    assert all(torch.equal(a, b) for a, b in zip(snaps.params[3], snaps.params[4]))  # step 4 skipped
    assert not all(torch.equal(a, b) for a, b in zip(snaps.params[1], snaps.params[2]))  # step 2 trained
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    text = [r.getMessage() for r in caplog.records]
    assert "(1 so far): non-finite loss at epoch_id=0, step_id=1" in text[0]
    assert "(2 so far): non-finite gradient at epoch_id=0, step_id=4" in text[1]


def test_skip_mode_with_multi_batch_drops_the_whole_step():
    data = [tuple(batches(1, 1000.0, n=2))] * 2  # each step: a good batch and a NaN one
    trainer = run(data, MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss"),
                                            nonfinite_policy="skip"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.fit()
    assert trainer.state.nonfinite_skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_fp16_overflow_handled_by_the_grad_scaler_is_not_an_error():
    scaler = torch.amp.GradScaler("cpu", init_scale=3.0e38)  # the first scaled backward overflows
    trainer = run(batches(-1, 0.0), processor(grad_scaler=scaler, enable_amp_dtype=torch.bfloat16))
    trainer.fit()
    assert trainer.state.iteration == 4 and getattr(trainer.state, "nonfinite_skipped", 0) == 0
    assert scaler.get_scale() < 3.0e38  # the scaler saw the overflow and backed off
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_policy_is_checked_and_the_flag_reduction_is_local_in_one_process():
    with pytest.raises(ValueError, match="nonfinite_policy='ignore'.*'raise'.*'skip'"):
        processor(nonfinite_policy="ignore")
    assert all_ranks_finite(True) and not all_ranks_finite(False)
    assert NonFiniteGuard("skip").pending is None


def test_the_gradient_check_sees_parameters_added_to_the_optimizer_during_training():
    first, added = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([first], lr=0.1)
    guard = NonFiniteGuard()
    first.grad = torch.ones(2)
    assert [g.shape for g in guard._params.grads(optimizer)] == [(2,)]
    optimizer.add_param_group({"params": [added]})
    added.grad = torch.tensor([1.0, float("nan"), 0.0])
    grads = guard._params.grads(optimizer)
    assert [g.shape for g in grads] == [(2,), (3,)] and not grads_finite(grads)
    optimizer.param_groups[1]["params"].append(torch.nn.Parameter(torch.zeros(1)))  # a group's list grown in place
    guard._params.grads(optimizer)
    assert len(guard._params.params) == 3
