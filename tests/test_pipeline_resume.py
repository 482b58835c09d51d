"""A ``LoadCheckpoint`` in ``model_convert_pipeline`` restores the training state when the trainer is built.

HAT restores its pipeline's checkpoint in the loop's constructor: right after building a trainer,
``trainer.checkpoint`` is the loaded checkpoint, the optimizer holds its state and
``start_epoch`` / ``start_step`` say where ``fit()`` goes on (HAT: after an epoch checkpoint
``start_epoch = epoch + 1`` and ``start_step = step``; after a step checkpoint
``start_epoch = epoch`` and ``start_step = step + 1``). Each test writes a real checkpoint by
training, then builds the resumed trainer.
"""

from __future__ import annotations

import torch

from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from test_checkpoint import DropoutNet, make_trainer


class Epochs:
    """Records the epochs and steps a run goes through."""

    def __init__(self) -> None:
        self.epochs: list[int] = []
        self.steps: list[int] = []

    def on_epoch_begin(self, epoch_id, **kwargs):
        self.epochs.append(epoch_id)

    def on_step_end(self, global_step_id, **kwargs):
        self.steps.append(global_step_id)


def _epoch_checkpoint(tmp_path) -> str:
    ck = Checkpoint(save_dir=str(tmp_path / "ck"), interval_by="epoch", save_hash=False)
    make_trainer([ck], num_epochs=2).fit()
    return str(tmp_path / "ck" / "checkpoint-epoch-0001.pth.tar")


def test_the_state_is_restored_when_the_trainer_is_built(tmp_path):
    path = _epoch_checkpoint(tmp_path)
    seen = Epochs()
    trainer = make_trainer([seen], model=DropoutNet(), seed=1, num_epochs=4, model_convert_pipeline=LoadCheckpoint(path),
                           resume_optimizer=True, resume_epoch_or_step=True)
    ckpt = trainer.checkpoint
    assert (ckpt["epoch"], ckpt["step"]) == (1, 6)
    assert (trainer.start_epoch, trainer.start_step) == (ckpt["epoch"] + 1, ckpt["step"])  # HAT's figures
    state = trainer.optimizer.state_dict()
    assert state["param_groups"] == ckpt["optimizer"]["param_groups"]
    assert len(state["state"]) == len(ckpt["optimizer"]["state"]) == 4
    for i, saved in ckpt["optimizer"]["state"].items():
        assert torch.equal(state["state"][i]["momentum_buffer"], saved["momentum_buffer"])
    trainer.fit()
    assert seen.epochs == [2, 3] and seen.steps == list(range(6, 12))
    straight = make_trainer([], num_epochs=4)  # built as the run that saved was
    straight.fit()
    for ours, theirs in zip(trainer.model.parameters(), straight.model.parameters()):
        assert torch.equal(ours, theirs)  # exact resume


def test_a_step_checkpoint_goes_on_after_its_step(tmp_path):
    ck = Checkpoint(save_dir=str(tmp_path / "ck"), interval_by="step", save_hash=False)
    make_trainer([ck], num_steps=4).fit()
    path = str(tmp_path / "ck" / "checkpoint-step-3.pth.tar")
    trainer = make_trainer([], num_steps=6, model_convert_pipeline=LoadCheckpoint(path),
                           resume_optimizer=True, resume_epoch_or_step=True)
    ckpt = trainer.checkpoint
    assert (ckpt["epoch"], ckpt["step"]) == (1, 3)
    assert (trainer.start_epoch, trainer.start_step) == (ckpt["epoch"], ckpt["step"] + 1)


def test_weights_only_keeps_the_start_and_a_later_flag_change_resumes_at_fit(tmp_path):
    path = _epoch_checkpoint(tmp_path)
    seen = Epochs()
    trainer = make_trainer([seen], num_epochs=3, model_convert_pipeline=LoadCheckpoint(path))
    assert trainer.checkpoint["epoch"] == 1
    assert (trainer.start_epoch, trainer.start_step) == (0, 0) and not trainer.optimizer.state_dict()["state"]
    trainer.resume_optimizer = trainer.resume_epoch_or_step = True  # as `hat-train --resume` sets them
    trainer.fit()
    assert seen.epochs == [2]
