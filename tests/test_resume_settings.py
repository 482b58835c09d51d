"""A resume honours the config it is given, or refuses it naming why: real ``hat-train`` runs.

Every run goes through the CLI in a new process, on the shipped ``configs/classification/digits_mlp.py``
(23 steps per epoch of 64 samples) cut short with ``--opts``. A 1-epoch run is resumed to 2 epochs
with the config unchanged (the reference) and with one optimizer setting changed; a changed batch
size and a schedule that ends before the checkpoint are refused; a run that saves by step ends
with ``last`` and ``best`` taken after its last validation, so resuming it finished changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess

import pytest
import torch

from conftest import run_tool
from hat_ignite.callbacks.checkpoint_optim import load_optimizer_state
from hat_ignite.errors import CheckpointError

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
STEPS = 23  # steps per epoch of the shipped config (1437 training digits, batches of 64)
LAST = "checkpoints/float-checkpoint-last.pth.tar"
BEST = "checkpoints/float-checkpoint-best.pth.tar"
STEP_SAVES = ["float_trainer.callbacks[4].interval_by=step", f"float_trainer.callbacks[4].save_interval={STEPS}"]


def hat_train(cwd: pathlib.Path, work_dir: str, *opts: str, resume: bool = False,
              stage: str = "float") -> subprocess.CompletedProcess:
    args = [str(CONFIG), "--stage", stage, "--work-dir", work_dir, *(["--resume"] if resume else []), "--opts", *opts]
    return run_tool("hat-train", *args, cwd=cwd, timeout=300)


def loaded(path: pathlib.Path) -> dict:
    return torch.load(path, weights_only=True)


def digests(work_dir: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(work_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(work_dir.rglob("*")) if p.is_file()}


def record(work_dir: pathlib.Path) -> dict:
    return json.loads((work_dir / "metrics.json").read_text())["float_train"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    """``base``: 1 epoch; ``same``: ``base`` resumed to 2 epochs with the config unchanged."""
    root = tmp_path_factory.mktemp("settings")
    done = hat_train(root, "base", "float_trainer.num_epochs=1")
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.copytree(root / "base", root / "same")
    same = hat_train(root, "same", "float_trainer.num_epochs=2", resume=True)
    assert same.returncode == 0, same.stderr[-3000:]
    (root / "same.log").write_text(same.stderr)
    return root


def test_a_longer_schedule_is_applied_and_said_so(runs):
    log = (runs / "same.log").read_text()
    assert ("checkpoint epoch num_epochs=1 (23 steps) -> config epoch num_epochs=2 (46 steps) (23 steps done): "
            "the run is extended and goes on to step 46") in log
    assert "optimizer option" not in log
    assert loaded(runs / "same" / LAST)["progress"]["iteration"] == 2 * STEPS


def resumed_with(runs: pathlib.Path, name: str, *opts: str) -> subprocess.CompletedProcess:
    shutil.copytree(runs / "base", runs / name)
    return hat_train(runs, name, "float_trainer.num_epochs=2", *opts, resume=True)


CHANGES = {  # option: (checkpoint's value, config's value, the param groups that differ)
    "lr": ("0.1", "0.01", "param groups 0, 1"),
    "momentum": ("0.9", "0.0", "param groups 0, 1"),
    "weight_decay": ("0.0001", "0.001", "param group 1"),  # group 0 (the biases) keeps its own 0.0
    "fused": ("True", "False", "param groups 0, 1"),
}


def test_changed_optimizer_options_are_applied_and_each_is_logged(runs):
    got = resumed_with(runs, "changed", *(f"float_trainer.optimizer.{k}={v[1]}" for k, v in CHANGES.items()))
    assert got.returncode == 0, got.stderr[-3000:]
    changes = [line for line in got.stderr.splitlines() if "optimizer option" in line]
    assert len(changes) == len(CHANGES), changes
    lines = {line.split("optimizer option ")[1].split(":")[0]: line for line in changes}
    for option, (saved, config, groups) in CHANGES.items():
        assert f"optimizer option {option}: checkpoint {saved} -> config {config} ({groups}): the config's value is " \
               f"used" in lines[option]
    final, reference = loaded(runs / "changed" / LAST), loaded(runs / "same" / LAST)
    group = final["optimizer"]["param_groups"][1]
    assert (group["lr"], group["initial_lr"], group["momentum"], group["weight_decay"], group["fused"]) == (
        0.01, 0.01, 0.0, 0.001, False)
    # the lr updater schedules from the config's base lr, not the one it saved
    assert final["callbacks"]["StepDecayLrUpdater"]["base_lrs"] == [0.01, 0.01]
    assert "the saved momentum_buffer state is dropped" in lines["momentum"]
    assert all("momentum_buffer" not in s for s in final["optimizer"]["state"].values())
    # before: the saved options were loaded over the config's, and the result was bitwise the reference's
    assert any(not torch.equal(final["state_dict"][k], v) for k, v in reference["state_dict"].items())


def test_a_plain_sgd_checkpoint_resumes_into_fused_sgd(tmp_path):
    plain = hat_train(tmp_path, "run", "float_trainer.num_epochs=1", "float_trainer.optimizer.fused=False")
    assert plain.returncode == 0, plain.stderr[-3000:]
    fused = hat_train(tmp_path, "run", "float_trainer.num_epochs=2", resume=True)
    # before: AssertionError: Expected grad_scale and found_inf to be None, at the first step
    assert fused.returncode == 0, fused.stderr[-3000:]
    assert "optimizer option fused: checkpoint False -> config True (param groups 0, 1)" in fused.stderr
    final = loaded(tmp_path / "run" / LAST)
    assert final["progress"]["iteration"] == 2 * STEPS
    assert all(g["fused"] is True for g in final["optimizer"]["param_groups"])


def test_a_changed_batch_size_is_refused_naming_both_step_counts(runs):
    shutil.copytree(runs / "base", runs / "batch")  # a finished 1-epoch run
    got = hat_train(runs, "batch", "float_trainer.num_epochs=2", "float_trainer.data_loader.batch_size=128",
                    resume=True)
    assert got.returncode == 1, got.stderr[-3000:]
    # before: with num_epochs=2 "already finished (all 2 epochs of 12 steps are done)" after 1 epoch of 23
    assert "already finished" not in got.stderr
    assert ("float_trainer did not start training (nothing was trained): CheckpointError: Checkpoint "
            f"{runs / 'batch' / 'checkpoints'}") in got.stderr
    assert "was written with 23 steps per epoch, but this run's data loader has 12 (another batch size" in got.stderr
    assert "Resume with the data loader that wrote it" in got.stderr
    assert "Restored from" not in got.stderr
    assert loaded(runs / "batch" / LAST)["progress"]["iteration"] == STEPS


def test_a_schedule_ending_before_the_checkpoint_is_refused(runs):
    work_dir = runs / "shorter"
    shutil.copytree(runs / "same", work_dir)  # 2 epochs saved ...
    (work_dir / "metrics.json").unlink()  # ... and the run's end not recorded: an unfinished run
    before = loaded(work_dir / LAST)
    got = hat_train(runs, "shorter", "float_trainer.num_epochs=1", resume=True)
    # before: exit 0, no step trained, no word said
    assert got.returncode == 1, got.stderr[-3000:]
    assert ("has 46 steps done, past the end of this run's schedule (epoch: num_epochs=1 (23 steps)); it was "
            "written in a run of num_epochs=2 (46 steps)") in got.stderr
    assert "Resume with a schedule of at least 46 steps" in got.stderr
    assert loaded(work_dir / LAST)["content_sha256"] == before["content_sha256"]


def test_an_option_change_needing_state_the_checkpoint_lacks_is_refused():
    params = [torch.nn.Parameter(torch.ones(3))]
    saved = torch.optim.Adam(params, lr=0.01)
    params[0].grad = torch.ones(3)
    saved.step()
    run = torch.optim.Adam(params, lr=0.01, amsgrad=True)
    with pytest.raises(CheckpointError, match=r"/c\.pth: the saved optimizer state cannot take this run's optimizer "
                                              r"options: the config changes amsgrad of param group 0, which then "
                                              r"needs the state \['max_exp_avg_sq'\] the checkpoint does not have"):
        load_optimizer_state(run, saved.state_dict(), "/c.pth", "Adam", run_options=True)
    # without the resume's run_options the saved options are loaded, as torch does
    plain = torch.optim.Adam(params, lr=0.5)
    assert load_optimizer_state(plain, saved.state_dict(), "/c.pth", "Adam") == []
    assert plain.param_groups[0]["lr"] == 0.01


def test_a_finished_run_saving_by_step_resumes_as_a_no_op_and_its_best_holds_the_last_validation(tmp_path):
    straight = hat_train(tmp_path, "run", "float_trainer.num_epochs=3", *STEP_SAVES)
    assert straight.returncode == 0, straight.stderr[-3000:]
    work_dir = tmp_path / "run"
    final = record(work_dir)
    # the last epoch's validation (after the step-68 save point) is the best: before, best stayed behind it
    assert final["best"]["value"] == final["val_metrics"]["accuracy"]
    best, last = loaded(work_dir / BEST), loaded(work_dir / LAST)
    assert best["progress"]["iteration"] == last["progress"]["iteration"] == 3 * STEPS
    assert last["data"]["epoch_open"] is False  # written after the last epoch's end hooks
    assert last["callbacks"]["Checkpoint"]["best_iteration"] == 3 * STEPS
    before = digests(work_dir)
    again = hat_train(tmp_path, "run", "float_trainer.num_epochs=3", *STEP_SAVES, resume=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" in again.stderr
    assert "Running the on_epoch_end hooks" not in again.stderr
    assert digests(work_dir) == before
    # the next stage, saving by step too, writes the best checkpoint the stage after it loads
    calibration = hat_train(tmp_path, "run", *STEP_SAVES, "calibration_trainer.callbacks[1].interval_by=step",
                            f"calibration_trainer.callbacks[1].save_interval={STEPS}", stage="calibration")
    assert calibration.returncode == 0, calibration.stderr[-3000:]
    assert (work_dir / "checkpoints" / "calibration-checkpoint-best.pth.tar").is_file()
