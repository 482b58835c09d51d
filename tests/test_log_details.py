"""Log details: the lr line of a run resumed inside an epoch, rounded lrs, and what hat-train says
about the device ids of a DDP config, DDP's find_unused_parameters, and a work dir that holds an
earlier run."""

from __future__ import annotations

import logging
import re

import torch
from conftest import DIGITS_CONFIG, run_tool
from torch.utils.data import DataLoader, Subset

from hat_ignite.callbacks import StatsMonitor, StepDecayLrUpdater
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.models.mlp import MLPClassifier

STEPS = 20  # per epoch


def test_the_lr_line_of_a_resumed_epoch_names_its_step_and_lrs_are_rounded(caplog):
    torch.manual_seed(0)
    model = MLPClassifier(hidden_features=16)
    data = DataLoader(Subset(DigitsDataset("train"), range(8 * STEPS)), batch_size=8)
    trainer = Trainer(
        model, data, torch.optim.SGD(model.parameters(), lr=0.2),
        BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None, num_epochs=2,
        start_step=13,  # as a run resumed at global step 13, inside epoch 0
        callbacks=[StepDecayLrUpdater(lr_decay_id=[1]), StatsMonitor(log_freq=STEPS)],
    )
    with caplog.at_level(logging.INFO):
        trainer.fit()
    lines = [r.getMessage() for r in caplog.records]
    lr_lines = [line for line in lines if re.match(r"Epoch\[\d\] Step\[\d+\] GlobalStep\[\d+\] lr=", line)]
    # before: "Epoch[0] Step[0] GlobalStep[13]"
    assert lr_lines == ["Epoch[0] Step[13] GlobalStep[13] lr=0.2", "Epoch[1] Step[0] GlobalStep[20] lr=0.02"]
    assert trainer.optimizer.param_groups[0]["lr"] == 0.020000000000000004  # 0.2 * 0.1, in floats
    stats = [line for line in lines if "samples/sec, step" in line]
    # before: "lr=0.020000000000000004"
    assert len(stats) == 2 and "Epoch[1] Step[19] GlobalStep[39]" in stats[1] and "lr=0.02," in stats[1], stats


DDP_CONFIG_TAIL = '''
device_ids = [0, 1]  # HAT's configs name their GPUs; this machine has none
float_trainer["type"] = "distributed_data_parallel_trainer"
'''


def test_hat_train_says_each_thing_once_and_names_an_earlier_run(tmp_path):
    work_dir = tmp_path / "wd"
    first = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--opts", "float_trainer.num_epochs=1",
                     cwd=tmp_path, timeout=180)
    assert first.returncode == 0, first.stderr
    assert "holds an earlier" not in first.stderr  # a new work dir: nothing to say
    config = tmp_path / "ddp.py"
    config.write_text(DIGITS_CONFIG.read_text() + DDP_CONFIG_TAIL)
    again = run_tool("hat-train", "-c", config, "-s", "float", "--work-dir", work_dir,
                     "--opts", "float_trainer.num_epochs=1", cwd=tmp_path, timeout=240)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    # the first process and the one it started both read the config: said once (before: twice)
    assert out.count("device_ids=[0, 1] ignored: no CUDA device here") == 1, out
    assert out.count("find_unused_parameters=True (HAT's default") == 1, out
    # before: the earlier run's checkpoints, metrics and TensorBoard history were replaced without a word
    (note,) = [line for line in out.splitlines() if "holds an earlier float run" in line]
    assert "WARNING" in note and "float_train.log" in note and "metrics.json (float_train)" in note
    assert "TensorBoard(overwrite=True) removes its event files" in note
    assert "--resume auto" in note and "another --work-dir" in note
    assert "removed 1 event file(s) of an earlier run" in out
    assert note.split(" WARNING ", 1)[1] in (work_dir / "float_train.log").read_text()


def test_each_step_s_lr_is_logged_once_with_cos_lr_updater_defaults(caplog):
    """``step_log_interval=1`` (the default): one line per step, the epoch's first step included (HAT
    logs that step twice, at epoch begin and at step begin); with 2, the epoch begin logs step 0."""
    from hat_ignite.callbacks import CosLrUpdater

    for interval, logged in ((1, [0, 1, 2, 3, 4, 5]), (2, [0, 1, 3, 5])):
        torch.manual_seed(0)
        model = MLPClassifier(hidden_features=4)
        trainer = Trainer(
            model, DataLoader(Subset(DigitsDataset("train"), range(24)), batch_size=8),
            torch.optim.SGD(model.parameters(), lr=0.2),
            BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None, num_epochs=2,
            callbacks=[CosLrUpdater(step_log_interval=interval)],
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hat_ignite.callbacks.lr_updater_base"):
            trainer.fit()
        steps = [int(re.search(r"GlobalStep\[(\d+)\] lr=", r.getMessage())[1]) for r in caplog.records]
        assert steps == logged, interval
