"""The NaN/Inf guard on the device (fused optimizers): no host read per step, same promise.

A non-finite loss or gradient never reaches the parameters: the fused optimizer skips that update
and every later one on the device, and the run stops with an error naming the step, one step
later (when the flag is read). docs/engine.md, "Non-finite losses and gradients".
"""

from __future__ import annotations

import logging
import pathlib

import pytest
import torch

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, Trainer, collect_loss_by_regex
from hat_ignite.errors import NonFiniteLossError
from host_reads_dist import result_file, run_job
from test_nonfinite import Net, batches

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01, fused=True),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, fused=True),
}


class Snapshots(CallbackMixin):
    """Parameters and optimizer state after every step."""

    def __init__(self) -> None:
        self.params, self.states = [], []

    def on_step_end(self, model, optimizer, **kwargs):
        self.params.append([p.detach().clone() for p in model.parameters()])
        self.states.append([{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()])


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def same_states(a, b) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def fit(data, optimizer="sgd", callbacks=(), **processor_kwargs):
    torch.manual_seed(0)
    model = Net()
    processor_cls = processor_kwargs.pop("processor_cls", BasicBatchProcessor)
    trainer = Trainer(model=model, data_loader=data, optimizer=OPTIMIZERS[optimizer](model.parameters()),
                      batch_processor=processor_cls(need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss"),
                                                    **processor_kwargs),
                      device=None, num_epochs=1, callbacks=list(callbacks))
    return trainer


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("marker, what", [(1000.0, "Non-finite loss"), (-1000.0, "Non-finite gradient")])
def test_a_nan_at_step_k_leaves_the_parameters_of_step_k_minus_1_bitwise(optimizer, marker, what):
    k = 3
    snaps = Snapshots()
    trainer = fit(batches(k, marker, n=8), optimizer, [snaps])
    with pytest.raises(NonFiniteLossError) as info:
        trainer.fit()
    message = str(info.value)
    assert message.startswith(f"{what} at epoch_id=0, step_id={k}, global_step_id={k}, batch_idx=0")
    assert "skipped the update of that step and of every later one" in message
    # read one step later: raised inside step k + 1, whose update was queued and skipped as well
    assert len(snaps.params) == k + 1 and trainer.state.iteration == k + 2
    final = [p.detach() for p in trainer.model.parameters()]
    assert same(snaps.params[k - 1], final) and not same(snaps.params[k - 2], final)
    state = [{n: v.clone() for n, v in s.items()} for s in trainer.optimizer.state.values()]
    assert same_states(snaps.states[k - 1], state)  # momenta / moments / step counts untouched
    assert all(torch.isfinite(p).all() for p in final)


def test_a_nan_at_the_last_step_is_raised_at_the_end_of_the_epoch():
    trainer = fit(batches(3, 1000.0, n=4))
    with pytest.raises(NonFiniteLossError, match="Non-finite loss at epoch_id=0, step_id=3, global_step_id=3"):
        trainer.fit()
    assert trainer.state.iteration == 4


def test_a_nan_inside_an_accumulation_group_skips_the_group_update():
    snaps = Snapshots()
    trainer = fit(batches(4, 1000.0, n=8), callbacks=[snaps], grad_accumulation_step=2)
    with pytest.raises(NonFiniteLossError, match="step_id=5, global_step_id=5"):  # the group's update step
        trainer.fit()
    assert same(snaps.params[3], [p.detach() for p in trainer.model.parameters()])


def test_skip_policy_counts_and_logs_the_dropped_updates_a_step_later(caplog):
    snaps = Snapshots()
    data = batches(1, 1000.0) + batches(0, -1000.0, n=2)  # a NaN loss at step 1, an Inf gradient at step 4
    trainer = fit(data, callbacks=[snaps], nonfinite_policy="skip")
    with caplog.at_level(logging.WARNING, logger="hat_ignite.engine.processors.nonfinite"):
        trainer.fit()
    assert trainer.state.iteration == 6 and trainer.state.nonfinite_skipped == 2
    assert same(snaps.params[0], snaps.params[1]) and same(snaps.params[3], snaps.params[4])
    assert not same(snaps.params[1], snaps.params[2])  # the step after a skipped one trains
    text = [r.getMessage() for r in caplog.records]
    assert "(1 so far): non-finite loss at epoch_id=0, step_id=1" in text[0]
    assert "(2 so far): non-finite gradient at epoch_id=0, step_id=4" in text[1]


def test_skip_policy_with_multi_batch_steps():
    data = [tuple(batches(1, 1000.0, n=2))] * 3  # each step: a good batch and a NaN one
    trainer = fit(data, processor_cls=MultiBatchProcessor, nonfinite_policy="skip")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.fit()
    assert trainer.state.nonfinite_skipped == 3
    assert same(before, [p.detach() for p in trainer.model.parameters()])


def test_a_new_run_after_the_error_starts_with_clear_flags():
    trainer = fit(batches(1, 1000.0, n=4))
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.data_loader = batches(-1, 0.0, n=4)
    trainer.fit()
    assert not same(before, [p.detach() for p in trainer.model.parameters()])


NAN_OPTIMIZERS = ["fused SGD", "SGD momentum"]


@pytest.fixture(scope="module")
def nan_runs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One 2-process job whose ranks train with each optimizer of NAN_OPTIMIZERS in turn, rank 1's
    loss NaN at one step of each run."""
    return run_job("nan", tmp_path_factory.mktemp("nan_runs"), NAN_OPTIMIZERS, timeout=300)


@pytest.mark.parametrize("optimizer", NAN_OPTIMIZERS)
def test_a_nan_on_rank_1_only_stops_both_ranks_after_the_same_step(nan_runs, optimizer):
    k = 5  # host_reads_dist.NAN_STEP
    results = [torch.load(nan_runs / result_file("nan", optimizer, rank), weights_only=True) for rank in (0, 1)]
    where = f"Non-finite loss at epoch_id=0, step_id={k}, global_step_id={k}, batch_idx=0"
    assert results[1]["error"].startswith(f"{where}: losses[0]=nan.")
    assert results[0]["error"].startswith(f"{where}: on another rank (this rank's: losses[0]=")
    for result in results:
        assert result["iteration"] == k + 2  # both ranks stop at the same step
        if optimizer == "fused SGD":  # it skipped the bad update; plain SGD applied it (NaN) in memory
            assert same(result["snapshots"][k - 1], result["final"]) and not same(result["snapshots"][k - 2], result["final"])
    assert same(results[0]["snapshots"][k - 1], results[1]["snapshots"][k - 1])
    if optimizer == "fused SGD":
        assert same(results[0]["final"], results[1]["final"])
