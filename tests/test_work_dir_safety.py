"""No lost work, no hang: a run that clears up never deletes another run's work, and a FIFO (or
any file that is not a regular one) in a work dir never blocks ``hat-train --resume``.

Real ``hat-train`` subprocesses on the shipped digits config (the model registered in a user
module beside the config, as HAT projects do), real FIFOs made with ``os.mkfifo``, and a real
second process racing for the same new work dir.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from hat_ignite.cli.workdir_lock import LOCK_FILE
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "classification" / "digits_mlp.py"
HAT_TRAIN = str(ROOT / "bin" / "hat-train")

SLOW_MODEL = '''
import os
import time

from hat.registry import OBJECT_REGISTRY
from hat_ignite.models.mlp import MLPClassifier


@OBJECT_REGISTRY.register
class SlowBuildMLP(MLPClassifier):
    """The digits MLP; with BUILD_MARKER set it says so in that file, then builds until the file
    BUILD_RELEASE exists (10 minutes at most)."""

    def __init__(self, **kwargs):
        marker = os.environ.get("BUILD_MARKER")
        if marker:
            open(marker, "w").close()
            release, give_up = os.environ["BUILD_RELEASE"], time.monotonic() + 600
            while not os.path.exists(release) and time.monotonic() < give_up:
                time.sleep(0.05)
        super().__init__(**kwargs)
'''


def _project(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "slow_model.py").write_text(SLOW_MODEL)
    source = DIGITS.read_text().replace('type="MLPClassifier"', 'type="SlowBuildMLP"')
    assert "SlowBuildMLP" in source
    config = tmp_path / "cfg.py"
    config.write_text("import slow_model  # noqa: F401  (registers SlowBuildMLP)\n" + source)
    return config


def _train(config: pathlib.Path, work_dir: pathlib.Path, *args: str, timeout: float = 120,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``hat-train`` one short epoch; a run still going after ``timeout`` is killed (a hang fails)."""
    return subprocess.run(
        [sys.executable, HAT_TRAIN, str(config), "--work-dir", str(work_dir), "--opts", "float_trainer.num_epochs=1",
         *args],
        cwd=config.parent, capture_output=True, text=True, timeout=time_limit(timeout), env={**os.environ, **(env or {})},
    )


def test_a_dry_run_whose_build_outlasts_another_run_leaves_that_runs_work(tmp_path):
    """The dry run finds the work dir missing and goes on building until the test releases it;
    meanwhile a real run creates the dir, trains and writes everything. The dry run's clean-up then
    removes nothing of it. (The build waits for a file, not for a time, so a loaded machine cannot
    end it before the real run.)"""
    config = _project(tmp_path)
    work_dir = tmp_path / "wd"
    marker, release = tmp_path / "building", tmp_path / "release"
    dry = subprocess.Popen(
        [sys.executable, HAT_TRAIN, str(config), "--work-dir", str(work_dir), "--dry-run"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "BUILD_MARKER": str(marker), "BUILD_RELEASE": str(release)},
    )
    try:
        deadline = time.monotonic() + time_limit(90)
        while not marker.exists():  # the dry run has looked at the work dir and is building
            assert dry.poll() is None and time.monotonic() < deadline, dry.communicate()[1][-2000:]
            time.sleep(0.05)
        assert not work_dir.exists()
        real = _train(config, work_dir)
        assert real.returncode == 0, real.stderr[-3000:]
        written = sorted(str(p.relative_to(work_dir)) for p in work_dir.rglob("*"))
        assert dry.poll() is None, "the dry run ended before the real run finished: nothing was tested"
        release.touch()
        _, err = dry.communicate(timeout=time_limit(90))
    finally:
        dry.kill()
    assert dry.returncode == 0, err[-2000:]
    assert sorted(str(p.relative_to(work_dir)) for p in work_dir.rglob("*")) == written
    assert "float_train.log" in written and "metrics.json" in written
    assert any(name.startswith("checkpoints/float-checkpoint-last") for name in written)


def test_a_failed_build_in_a_new_work_dir_leaves_nothing_behind(tmp_path):
    config = _project(tmp_path)
    work_dir = tmp_path / "wd"
    failed = _train(config, work_dir, "float_trainer.model.hidden_features=-3")
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert not work_dir.exists()  # the folders its callbacks made while building are gone


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """A config and a work dir holding one finished epoch: log, checkpoints, metrics.json."""
    tmp_path = tmp_path_factory.mktemp("trained")
    config = _project(tmp_path)
    work_dir = tmp_path / "wd"
    done = _train(config, work_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return config, work_dir


def _fifo_in_place(path: pathlib.Path, fifo_dir: pathlib.Path, link: bool = False) -> None:
    if path.exists():
        path.unlink()
    if link:
        target = fifo_dir / "elsewhere.fifo"
        os.mkfifo(target)
        path.symlink_to(target)
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("case", ["last", "newest periodic", "symlink to a FIFO as last", "metrics.json"])
def test_a_fifo_among_the_checkpoints_does_not_block_resume(trained, tmp_path, case):
    config, source = trained
    work_dir = tmp_path / "wd"
    shutil.copytree(source, work_dir)
    checkpoints = work_dir / "checkpoints"
    if case == "last":
        _fifo_in_place(checkpoints / "float-checkpoint-last.pth.tar", tmp_path)
    elif case == "newest periodic":  # a newer epoch's name than any real file
        _fifo_in_place(checkpoints / "float-checkpoint-epoch-0007-0a1b2c3d.pth.tar", tmp_path)
    elif case == "symlink to a FIFO as last":
        _fifo_in_place(checkpoints / "float-checkpoint-last.pth.tar", tmp_path, link=True)
    else:
        _fifo_in_place(work_dir / "metrics.json", tmp_path)
    resumed = _train(config, work_dir, "float_trainer.num_epochs=2", "--resume", timeout=150)
    assert resumed.returncode in (0, 1), resumed.stderr[-3000:]
    if resumed.returncode == 1:  # refused: the FIFO is named, with what to do
        assert "is a FIFO (named pipe), not a regular file" in resumed.stderr, resumed.stderr[-3000:]
    else:
        assert "Resuming from" in resumed.stderr, resumed.stderr[-3000:]


def test_a_fifo_as_the_lock_file_is_refused_at_once(trained, tmp_path):
    config, source = trained
    work_dir = tmp_path / "wd"
    shutil.copytree(source, work_dir)
    os.mkfifo(work_dir / LOCK_FILE)
    refused = _train(config, work_dir, "float_trainer.num_epochs=2", "--resume", timeout=150)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert f"the work dir lock {work_dir / LOCK_FILE} is a FIFO (named pipe), not a regular file" in refused.stderr
