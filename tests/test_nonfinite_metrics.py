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
                           "--opts", *opts], cwd=work_dir.parent, capture_output=True, text=True, timeout=300, env=env)


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
