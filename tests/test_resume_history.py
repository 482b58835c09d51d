"""No work is lost around checkpoints: real ``hat-train`` runs of the shipped digits config.

Every run goes through the CLI in a new process, on ``configs/classification/digits_mlp.py``
cut to 3 epochs (23 steps each). Its first callback (a ``StatsMonitor`` that only logs) is
replaced by ``kill_hooks.KillAt``, which sends a real signal at a precise point; the straight
run carries the same callback without a kill point, so every run has the same callbacks.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from hat_ignite.visualize.event_file import read_scalars
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
EPOCHS, STEPS_PER_EPOCH = 3, 23
CKPT = "checkpoints/float-checkpoint-{}.pth.tar"


def hat_train(work_dir: pathlib.Path, *args: str, kill: dict | None = None) -> subprocess.CompletedProcess:
    """``hat-train`` on the shipped config, 3 epochs, with ``KillAt(**kill)`` as first callback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    hook = repr({"type": "kill_hooks.KillAt", **(kill or {})})
    opts = [f"float_trainer.num_epochs={EPOCHS}", f"float_trainer.callbacks[0]={hook}"]
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(CONFIG), "--work-dir", str(work_dir), *args,
         "--opts", *opts],
        cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(300), env=env,
    )


def curves(work_dir: pathlib.Path) -> dict:
    """The run's scalars without the timing figures (``stats/*``), which differ run to run."""
    return {tag: points for tag, points in read_scalars(work_dir / "tensorboard").items() if not tag.startswith("stats/")}


def file_digests(work_dir: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(work_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(work_dir.rglob("*")) if p.is_file()}


def loaded(path: pathlib.Path) -> dict:
    return torch.load(path, weights_only=True)


def train_record(work_dir: pathlib.Path) -> dict:
    return json.loads((work_dir / "metrics.json").read_text())["float_train"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> pathlib.Path:
    work_dir = tmp_path_factory.mktemp("straight") / "run"
    done = hat_train(work_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return work_dir


def test_resuming_a_finished_run_changes_no_file(straight):
    before = file_digests(straight)
    again = hat_train(straight, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr
    assert file_digests(straight) == before


def test_sigkill_mid_run_then_resume_keeps_every_point_of_the_history(straight, tmp_path):
    work_dir = tmp_path / "run"
    killed = hat_train(work_dir, kill={"step": 40})  # inside epoch 1; the last checkpoint is epoch 0's
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = curves(work_dir)
    assert before["loss/cls_loss"][-1][0] >= 20  # epoch 0's points (0, 5, 10, 15, 20) reached the file
    resumed = hat_train(work_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = curves(work_dir)
    for tag, points in before.items():  # nothing written before the kill is lost or changed
        assert set(points) <= set(after[tag]), tag
    # the whole run's history, point for point the straight run's (ceil(69 / 5) = 14 loss points here)
    assert after == curves(straight)
    assert len(after["loss/cls_loss"]) == -(-EPOCHS * STEPS_PER_EPOCH // 5)
    assert train_record(work_dir)["steps"] == EPOCHS * STEPS_PER_EPOCH


def test_sigkill_between_last_and_best_then_resume_ends_with_the_straight_best(straight, tmp_path):
    work_dir = tmp_path / "run"
    killed = hat_train(work_dir, kill={"best_write": 3})  # epoch 2 is the 3rd new best, and the last
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last, best = work_dir / CKPT.format("last"), work_dir / CKPT.format("best")
    assert loaded(last)["progress"]["iteration"] == EPOCHS * STEPS_PER_EPOCH
    stale = loaded(best)
    assert stale["progress"]["iteration"] == 2 * STEPS_PER_EPOCH  # what the kill left: best is behind
    assert loaded(last)["callbacks"]["Checkpoint"]["best_iteration"] == EPOCHS * STEPS_PER_EPOCH
    resumed = hat_train(work_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = loaded(straight / CKPT.format("best")), loaded(best)
    assert got["progress"]["iteration"] == EPOCHS * STEPS_PER_EPOCH
    assert got["content_sha256"] == expected["content_sha256"]
    for key, value in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key
    assert train_record(work_dir)["best"]["value"] == train_record(straight)["best"]["value"]


def test_resume_inside_the_last_epoch_reports_the_straight_train_metrics(straight, tmp_path):
    work_dir = tmp_path / "run"
    stopped = hat_train(work_dir, kill={"step": 55, "signal_name": "SIGTERM"})  # step 9 of 23 in epoch 2
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    resumed = hat_train(work_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming inside epoch 2" in resumed.stderr
    got, expected = train_record(work_dir), train_record(straight)
    assert got["train_metrics"] == expected["train_metrics"]
    assert got["val_metrics"] == expected["val_metrics"]
    # the history is the straight run's: a stopped run skips the end-of-training validation
    history, straight_history = curves(work_dir), curves(straight)
    assert history == straight_history
