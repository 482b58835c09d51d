"""``nonfinite_policy="skip"``: a step whose update is dropped contributes nothing, to the model or the metrics.

Real ``hat-train`` runs of the shipped digits config (1 epoch of 23 steps, a checkpoint after
every step) whose model (``dist_helpers.NanLossMLP``) returns a NaN loss at global step 5 only.
With fused SGD (the shipped config) the guard's flag stays on the device and is read a step
later; with plain SGD it is read before the update. Either way the train metrics saved in each
checkpoint hold steps 0-4 and 6.. and nothing of step 5.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
BAD = 5
MODEL = {"type": "dist_helpers.NanLossMLP", "nan_rank": 0, "nan_step": BAD, "in_features": 64,
         "hidden_features": 128, "num_classes": 10}


def hat_train(work_dir: pathlib.Path, fused: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    opts = ["float_trainer.num_epochs=1", f"float_trainer.model={MODEL!r}", f"float_trainer.optimizer.fused={fused}",
            "float_trainer.batch_processor.nonfinite_policy='skip'", "float_trainer.callbacks[4].interval_by=step",
            "float_trainer.callbacks[4].keep_n=None"]
    return subprocess.run([sys.executable, str(ROOT / "bin" / "hat-train"), str(CONFIG), "--work-dir", str(work_dir),
                           "--opts", *opts], cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(300), env=env)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-on-device", "plain-blocking"])
def test_a_skipped_step_adds_nothing_to_the_train_metrics_of_any_checkpoint(tmp_path, fused):
    work_dir = tmp_path / "run"
    done = hat_train(work_dir, fused)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Skipped the optimizer update (1 so far): non-finite loss at epoch_id=0, step_id=5, global_step_id=5" \
        in done.stderr
    files = {int(re.search(r"step-(\d+)-", p.name).group(1)): p for p in (work_dir / "checkpoints").glob("*step-*")}
    assert sorted(files) == list(range(23))
    for step, path in sorted(files.items()):
        loss, accuracy = torch.load(path, weights_only=True)["callbacks"]["MetricUpdater"]["metrics"]
        series = loss["series"]["cls_loss"]
        counted = step + 1 - (step >= BAD)  # every step done so far but the skipped one
        # before: from step 5 on the count included step 5 and the total was NaN
        assert series["count"] == counted, step
        assert math.isfinite(float(series["total"])), step
        assert accuracy["scores"]["updates"] == counted, step
    # the skipped step's contribution is exactly what step 5's checkpoint adds: nothing
    at = {s: torch.load(files[s], weights_only=True)["callbacks"]["MetricUpdater"]["metrics"][0]["series"]
          for s in (BAD - 1, BAD)}
    assert torch.equal(at[BAD]["cls_loss"]["total"], at[BAD - 1]["cls_loss"]["total"])
    train = json.loads((work_dir / "metrics.json").read_text())["float_train"]["train_metrics"]
    assert math.isfinite(train["cls_loss"]) and 0 < train["cls_loss"] < 3


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
@pytest.mark.parametrize("accumulation, marker, counted", [
    (1, 1000.0, 5),   # a NaN loss at step 3: that step only
    (2, 1000.0, 4),   # the update of steps 2 and 3 is dropped: both feed nothing
    (2, -1000.0, 4),  # an infinite gradient with a finite loss: dropped all the same
])
def test_every_step_of_a_dropped_update_feeds_no_metric(fused, accumulation, marker, counted):
    from hat_ignite.callbacks import MetricUpdater
    from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_regex
    from hat_ignite.metrics import LossShow
    from test_nonfinite import Net, batches

    torch.manual_seed(0)
    model, loss = Net(), LossShow()
    updater = MetricUpdater(metric_update_func=lambda metrics, batch, outs: metrics[0].update(outs), metrics=[loss],
                            step_log_freq=1, epoch_log_freq=1)  # a log (and a read of the outcomes) every step
    trainer = Trainer(model=model, data_loader=batches(3, marker, n=6),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1, fused=fused),
                      batch_processor=BasicBatchProcessor(
                          need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss"),
                          nonfinite_policy="skip", grad_accumulation_step=accumulation),
                      device=None, num_epochs=1, callbacks=[updater])
    trainer.fit()
    assert trainer.state.nonfinite_skipped == 1
    names, values = loss.get()
    state = updater.state_dict()["metrics"][0]["series"]
    assert [state[name]["count"] for name in names] == [counted, counted]  # before: 6, every step
    assert all(math.isfinite(v) for v in values), values
    assert [trainer.update_dropped(s) for s in range(6)] == [s in range(4 - accumulation, 4) for s in range(6)]
