"""No checkpoint ever holds a step whose update the on-device NaN/Inf guard skipped.

The guard's flag is read a step late (a fused optimizer skips the bad update on the device; a
plain SGD or AdamW applies it in memory); at a save point (a step-interval ``Checkpoint``) and at
a requested stop (SIGTERM) it is read at once, so the run raises naming the step before anything
of that step is written, and ``--resume auto`` finds step k - 1.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.callbacks.checkpoint import Checkpoint, latest_valid_checkpoint, list_checkpoints
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_regex
from hat_ignite.errors import NonFiniteLossError
from test_nonfinite import Net, batches

K = 3  # the step whose batch is bad


class Snapshots(CallbackMixin):
    def __init__(self) -> None:
        self.params: list[list[torch.Tensor]] = []

    def on_step_end(self, model, **kwargs):
        self.params.append([p.detach().clone() for p in model.parameters()])


class StopAt(CallbackMixin):
    """Asks the loop to stop at a step, as the CLI's SIGTERM handler does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, loop, global_step_id, **kwargs):
        if global_step_id == self.step:
            loop.request_stop("received SIGTERM", 15)


OPTIMIZERS = {
    "fused SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),
}


def trainer(marker: float, callbacks: list, optimizer: str = "fused SGD") -> Trainer:
    torch.manual_seed(0)
    model = Net()
    return Trainer(model=model, data_loader=batches(K, marker, n=8),
                   optimizer=OPTIMIZERS[optimizer](model.parameters()),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss")),
                   device=None, num_epochs=1, callbacks=callbacks)


@pytest.mark.parametrize("marker, what", [(1000.0, "Non-finite loss"), (-1000.0, "Non-finite gradient")])
@pytest.mark.parametrize("case", ["step checkpoint", "stop request"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_nan_at_a_save_or_stop_step_raises_there_and_writes_no_checkpoint_of_it(tmp_path, case, marker, what, optimizer):
    snaps = Snapshots()
    if case == "step checkpoint":  # saves after every step, so also after step K
        callbacks = [snaps, Checkpoint(tmp_path, interval_by="step", save_interval=1)]
    else:  # saves after step K - 1 only; the stop at step K would write a resume point of step K
        callbacks = [snaps, Checkpoint(tmp_path, interval_by="step", save_interval=K), StopAt(K)]
    loop = trainer(marker, callbacks, optimizer)
    with pytest.raises(NonFiniteLossError) as info:
        loop.fit()
    assert str(info.value).startswith(f"{what} at epoch_id=0, step_id={K}, global_step_id={K}, batch_idx=0")
    assert loop.state.iteration == K + 1 and loop.stopped_by is None  # raised inside step K, no stop taken
    names = [pathlib.Path(p).name for p in list_checkpoints(tmp_path, kind="step")]
    assert names[-1].startswith(f"checkpoint-step-{K - 1}-")
    assert not any(name.startswith(f"checkpoint-step-{K}-") for name in names)
    found = latest_valid_checkpoint(tmp_path)
    assert found is not None
    path, checkpoint = found
    assert path.endswith("checkpoint-last.pth.tar") and checkpoint["progress"]["iteration"] == K
    saved = list(checkpoint["state_dict"].values())
    assert all(torch.equal(a, b) for a, b in zip(saved, snaps.params[K - 1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(saved, snaps.params[K - 2]))
