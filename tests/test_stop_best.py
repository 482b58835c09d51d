"""A stop never changes which checkpoint is ``best``: SIGTERM during a validation, then ``--resume``.

Real ``hat-train`` processes on the shipped ``configs/classification/digits_mlp.py``, 3 epochs of
23 steps, validating at each epoch end and saving a checkpoint every 5 steps (so a validation's
result is judged at the next step save point, not at the epoch end). ``kill_hooks.KillAt``
among the validation's callbacks sends a real SIGTERM inside the second validation (epoch 1's
end, after global step 45); every run carries the same callbacks.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import torch
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
ADDED = """
# test_stop_best.py: a KillAt among the validation's callbacks (inactive unless --opts sets it)
val_callback["callbacks"] = [dict(type="kill_hooks.KillAt")] + val_callback["callbacks"]
float_trainer["callbacks"][3] = val_callback
"""
BEST = "checkpoints/float-checkpoint-best.pth.tar"


def hat_train(config: pathlib.Path, work_dir: pathlib.Path, *opts: str, resume: bool = False
              ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    args = [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir),
            *(["--resume"] if resume else []),
            "--opts", "float_trainer.num_epochs=3", "float_trainer.callbacks[4].interval_by='step'",
            "float_trainer.callbacks[4].save_interval=5", "float_trainer.callbacks[4].keep_n=20", *opts]
    return subprocess.run(args, cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(300), env=env)


def test_sigterm_during_validation_keeps_the_straight_best(tmp_path):
    config = tmp_path / "digits_mlp_kill.py"
    config.write_text(CONFIG.read_text() + ADDED)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    done = hat_train(config, straight)
    assert done.returncode == 0, done.stderr[-3000:]
    kill = ["float_trainer.callbacks[3].callbacks[0].validation=2",
            "float_trainer.callbacks[3].callbacks[0].signal_name='SIGTERM'"]
    done = hat_train(config, stopped, *kill)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert "Stopping after global step 46: received SIGTERM" in done.stderr
    # the stop's resume point (after global step 46) is not a save point of the schedule: the
    # validation result it follows is left for the next one (global step 49), as in the straight run
    assert "new best" not in done.stderr.split("Validation Epoch[1]")[1]
    done = hat_train(config, stopped, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # the save point after the stopped validation (global step 49) holds the straight run's best,
    # and so does the final best (the end of training judges the last validation)
    (step_49,) = (straight / "checkpoints").glob("float-checkpoint-step-49-*.pth.tar")
    pairs = [(straight / BEST, stopped / BEST), (step_49, stopped / "checkpoints" / step_49.name)]
    at_49 = torch.load(step_49, weights_only=True)
    assert at_49["callbacks"]["Checkpoint"]["best_iteration"] == 50
    for straight_file, stopped_file in pairs:
        expected, got = torch.load(straight_file, weights_only=True), torch.load(stopped_file, weights_only=True)
        assert got["step"] == expected["step"]
        assert got["callbacks"]["Checkpoint"] == expected["callbacks"]["Checkpoint"]
        for key, value in expected["state_dict"].items():
            assert torch.equal(got["state_dict"][key], value), key
