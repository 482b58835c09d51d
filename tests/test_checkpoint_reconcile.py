"""A resumed run brings ``last`` and ``best`` up to the checkpoint it resumes from.

The files a kill between the writes of a save point leaves are made here from a real run's
files: ``last`` and ``best`` hard links to the previous save point's file, the new periodic file
beside them (the kill itself, through the real CLI, is in ``tests/test_resume_history.py``).
"""

from __future__ import annotations

import os
import pathlib

import torch

from hat_ignite.callbacks.checkpoint import Checkpoint, list_checkpoints
from hat_ignite.callbacks.checkpoint_files import latest_valid_checkpoint
from hat_ignite.callbacks.checkpoint_reconcile import saved_identity
from hat_ignite.callbacks.checkpoint_state import restore_training_state
from test_checkpoint import STEPS_PER_EPOCH, FeedMetric, make_trainer

VALUES = [0.1, 0.5, 0.9]  # every epoch is a new best


def _run(tmp_path: pathlib.Path) -> list[str]:
    make_trainer([FeedMetric("acc", VALUES, nested=True), Checkpoint(tmp_path, mode="max", monitor_metric_key="acc")],
                 num_epochs=3).fit()
    return list_checkpoints(tmp_path)


def test_a_stale_last_and_best_are_brought_up_to_the_resumed_checkpoint(tmp_path, caplog):
    epochs = _run(tmp_path)
    last, best = tmp_path / "checkpoint-last.pth.tar", tmp_path / "checkpoint-best.pth.tar"
    for path in (last, best):  # a kill right after epoch 2's periodic file was written
        os.remove(path)
        os.link(epochs[1], path)
    path, checkpoint = latest_valid_checkpoint(tmp_path)
    assert path == epochs[2]
    assert checkpoint["callbacks"]["Checkpoint"]["best_iteration"] == 3 * STEPS_PER_EPOCH
    trainer = make_trainer([FeedMetric("acc", VALUES, nested=True), Checkpoint(tmp_path, mode="max", monitor_metric_key="acc")],
                           num_epochs=3, resume_optimizer=True, resume_epoch_or_step=True)
    restore_training_state(trainer, checkpoint, path)
    trainer.fit()  # nothing left to train: only the loop begin and end run
    assert os.path.samefile(last, epochs[2]) and os.path.samefile(best, epochs[2])
    assert "did not hold the checkpoint this run resumes from" in caplog.text
    assert "was behind the best value the checkpoint records" in caplog.text


def test_best_is_taken_from_the_file_of_the_recorded_best_step(tmp_path):
    epochs = _run(tmp_path)
    best = tmp_path / "checkpoint-best.pth.tar"
    os.remove(best)
    os.link(epochs[0], best)  # stale: epoch 0 while the record says epoch 2
    checkpoint = torch.load(epochs[2], weights_only=True)
    checkpoint["callbacks"]["Checkpoint"]["best_iteration"] = 2 * STEPS_PER_EPOCH  # as if epoch 1 was the best
    trainer = make_trainer([Checkpoint(tmp_path, mode="max", monitor_metric_key="acc")], num_epochs=3,
                           resume_optimizer=True, resume_epoch_or_step=True)
    restore_training_state(trainer, checkpoint, epochs[2])
    trainer.fit()
    assert os.path.samefile(best, epochs[1])
    assert saved_identity(str(best))[1] == 2 * STEPS_PER_EPOCH
