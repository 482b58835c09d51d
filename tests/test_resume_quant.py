"""A stopped calibration or QAT stage, resumed, ends exactly as a straight run of it.

Real ``hat-train`` processes on the shipped ``configs/classification/digits_mlp.py``: one float
epoch, then the calibration stage (30 steps: more than the loader's 23 batches, so it crosses
an epoch) and a one-epoch QAT stage, each once straight and once stopped by a real SIGTERM
(``kill_hooks.KillAt``, the stage's first callback in every run) and resumed with ``--resume``.
Every tensor of the final checkpoints (weights, observer ranges, scales, zero points, eps) must
be equal.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
KILL = "{'type': 'kill_hooks.KillAt'}"
ADDED = f"""
# test_resume_quant.py: a KillAt first callback in each stage (inactive unless --opts sets step)
float_trainer["callbacks"][0] = {KILL}
calibration_trainer["callbacks"] = [{KILL}] + calibration_trainer["callbacks"]
qat_trainer["callbacks"][0] = {KILL}
"""
CALIBRATION_STEPS = 30


def hat_train(config: pathlib.Path, work_dir: pathlib.Path, stage: str, *opts: str,
              resume: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    args = [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "-s", stage, "--work-dir", str(work_dir)]
    args += ["--resume"] if resume else []
    args += ["--opts", "float_trainer.num_epochs=1", f"calibration_trainer.num_steps={CALIBRATION_STEPS}",
             "qat_trainer.num_epochs=1", *opts]
    return subprocess.run(args, cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(300), env=env)


def tensors(path: pathlib.Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def assert_same_tensors(got: pathlib.Path, expected: pathlib.Path) -> None:
    a, b = tensors(got), tensors(expected)
    assert list(a) == list(b)
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, differing


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A float run, then straight calibration and QAT stages in ``straight``."""
    root = tmp_path_factory.mktemp("quant_resume")
    config = root / "digits_mlp_kill.py"
    config.write_text(CONFIG.read_text() + ADDED)
    base = root / "float"
    done = hat_train(config, base, "float")
    assert done.returncode == 0, done.stderr[-3000:]
    straight = root / "straight"
    shutil.copytree(base, straight)
    for stage in ("calibration", "qat"):
        done = hat_train(config, straight, stage)
        assert done.returncode == 0, done.stderr[-3000:]
    return {"config": config, "float": base, "straight": straight, "root": root}


def stop_and_resume(runs: dict, work_dir: pathlib.Path, stage: str, key: str, step: int) -> str:
    """SIGTERM the stage at global step ``step``, resume it; return the resumed run's log."""
    kill = [f"{key}.callbacks[0].step={step}", f"{key}.callbacks[0].signal_name='SIGTERM'"]
    stopped = hat_train(runs["config"], work_dir, stage, *kill)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    resumed = hat_train(runs["config"], work_dir, stage, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return resumed.stderr


def test_a_stopped_calibration_resumes_to_the_straight_observers(runs):
    work_dir = runs["root"] / "calibration_stopped"
    shutil.copytree(runs["float"], work_dir)
    log = stop_and_resume(runs, work_dir, "calibration", "calibration_trainer", 12)
    # the calibration checkpoint holds its data position, and the float checkpoint the stage
    # starts from restores no progress (it was at global step 23 of the float run)
    assert "data position (step 13 of 23 in the epoch)" in log
    assert "Resuming inside epoch 0 at step 13 of 23" in log
    assert "float-checkpoint-best.pth.tar: progress" not in log
    assert "data position (none saved" not in log
    ckpt = "checkpoints/calibration-checkpoint-{}.pth.tar"
    for name in ("last", "best"):
        assert_same_tensors(work_dir / ckpt.format(name), runs["straight"] / ckpt.format(name))
    observers = tensors(work_dir / ckpt.format("last"))
    eps = [v for k, v in observers.items() if k.endswith("activation_post_process.eps")]
    assert eps and all(float(v) == 2.0 ** -12 for v in eps)  # the quantizer's eps, not torch's default


def test_a_stopped_qat_resumes_to_the_straight_weights(runs):
    work_dir = runs["root"] / "qat_stopped"
    shutil.copytree(runs["float"], work_dir)
    shutil.copytree(runs["straight"] / "checkpoints", work_dir / "checkpoints", dirs_exist_ok=True)
    for name in os.listdir(work_dir / "checkpoints"):
        if name.startswith("qat-"):
            os.remove(work_dir / "checkpoints" / name)
    log = stop_and_resume(runs, work_dir, "qat", "qat_trainer", 10)
    assert "calibration-checkpoint-best.pth.tar: progress" not in log
    assert "Resuming inside epoch 0 at step 11 of 23" in log
    ckpt = "checkpoints/qat-checkpoint-{}.pth.tar"
    for name in ("last", "best"):
        assert_same_tensors(work_dir / ckpt.format(name), runs["straight"] / ckpt.format(name))
    # the calibration checkpoint QAT starts from keeps its observers' eps when loaded
    eps = [v for k, v in tensors(work_dir / ckpt.format("last")).items() if k.endswith("activation_post_process.eps")]
    assert eps and all(float(v) == 2.0 ** -12 for v in eps)
