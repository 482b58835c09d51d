"""The shipped digits config warms up as it says: its lr rises from step 1, and epoch 0 learns.

One real epoch of ``configs/classification/digits_mlp.py`` through ``bin/hat-train`` in a
subprocess, with the TensorBoard callback writing every step; the lrs and the validation accuracy
are read back from the event file the run wrote.
"""

from __future__ import annotations

import pytest
from conftest import DIGITS_CONFIG, run_tool

from hat_ignite.visualize.event_file import read_scalars

STEPS = 23  # one epoch of 1437 training digits in batches of 64
BASE_LR = 0.1  # the config's SGD lr (both param groups: weights, and biases without decay)


def test_digits_config_warms_up_step_by_step_and_learns_in_epoch_0(tmp_path):
    work_dir = tmp_path / "digits"
    proc = run_tool(
        "hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--opts", "float_trainer.num_epochs=1",
        "float_trainer.callbacks[5].update_freq=1", cwd=tmp_path, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = read_scalars(work_dir / "tensorboard")
    for tag in ("lr/group_0", "lr/group_1"):
        points = scalars[tag]
        assert [step for step, _ in points] == list(range(STEPS))
        # warmup_by="epoch", warmup_len=1: a linear ramp over the epoch's 23 steps, as in HAT
        # (the event file stores float32)
        assert [lr for _, lr in points] == pytest.approx([BASE_LR * g / STEPS for g in range(STEPS)], rel=1e-6)
        assert points[1][1] > 0.0
    [(step, accuracy)] = scalars["val/accuracy"]
    assert step == STEPS
    assert accuracy > 0.5, accuracy  # chance is 0.1
