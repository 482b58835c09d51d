"""A stuck data loader: reported, stoppable with SIGTERM, and never keeping the work dir locked.

Real ``hat-train`` processes on the shipped ``configs/classification/digits_mlp.py`` (one epoch
of 23 steps) whose training set is ``hang_hooks.HangingDigits``: loading one sample blocks for
good while a marker file exists (no timeout, no output), in a data-loader worker process
(``num_workers=2``) or in the main process (``num_workers=0``). The watchdog's limit is set
short with ``--data-wait-limit``.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "classification" / "digits_mlp.py"
HANG_AT = 100  # a training sample; shuffled, it lands in some batch of the epoch
LAST = "checkpoints/float-checkpoint-last.pth.tar"


def make_config(tmp_path: pathlib.Path, num_workers: int) -> tuple[pathlib.Path, pathlib.Path]:
    """The shipped config over ``HangingDigits``; returns ``(config, hang file)``."""
    hang = tmp_path / f"hang{num_workers}"
    config = tmp_path / f"digits_hang{num_workers}.py"
    config.write_text(CONFIG.read_text() + f"""
# test_data_wait.py: the training set hangs while {hang} exists
float_trainer["data_loader"] = dict(
    data_loader, num_workers={num_workers},
    dataset=dict(type="hang_hooks.HangingDigits", hang_at={HANG_AT}, hang_file={str(hang)!r}, split="train",
                 val_ratio=0.2, seed=0),
)
""")
    return config, hang


def command(config: pathlib.Path, work_dir: pathlib.Path, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir),
            "--data-wait-limit", "1", *args, "--opts", "float_trainer.num_epochs=1"]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def run(config: pathlib.Path, work_dir: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(config, work_dir, *args), cwd=work_dir.parent, capture_output=True, text=True,
                          timeout=time_limit(300), env=env())


def start_hung(config: pathlib.Path, hang: pathlib.Path, work_dir: pathlib.Path) -> tuple[subprocess.Popen, pathlib.Path]:
    """Start a run whose loader hangs; return once the watchdog has reported it (log path too)."""
    hang.touch()
    log = work_dir.parent / f"{work_dir.name}.log"
    proc = subprocess.Popen(command(config, work_dir), cwd=work_dir.parent, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), env=env())
    deadline = time.monotonic() + time_limit(120)
    while "No batch from the data loader" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no watchdog report (exit {proc.poll()}): {log.read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, log


def stuck_pid(hang: pathlib.Path) -> int:
    return int(pathlib.Path(str(hang) + ".pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = pathlib.Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")


def wait_exit(proc: subprocess.Popen, seconds: float) -> int | None:
    try:
        return proc.wait(timeout=time_limit(seconds))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


@pytest.mark.parametrize("num_workers", [2, 0])
def test_a_hung_loader_is_reported_and_the_first_sigterm_stops_the_run(tmp_path, num_workers):
    config, hang = make_config(tmp_path, num_workers)
    work_dir = tmp_path / "run"
    proc, log = start_hung(config, hang, work_dir)
    text = log.read_text()
    report = text[text.index("No batch from the data loader"):].splitlines()[0]
    # the report names the wait, the batch, the limit, the loader's settings and what to do
    assert "the Trainer loop waits for the batch of epoch_id=0, global_step_id=" in report
    assert "(the limit is 1 s)" in report
    assert f"DataLoader(dataset=HangingDigits, batch_size=64, num_workers={num_workers}, timeout=0" in report
    assert "py-spy dump --pid" in report and "SIGTERM stops the run now" in report
    assert "--data-wait-limit" in report
    stuck = stuck_pid(hang)
    assert (stuck == proc.pid) == (num_workers == 0)  # a worker hangs, or the main process itself
    proc.send_signal(signal.SIGTERM)
    code = wait_exit(proc, 60)
    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]  # the first SIGTERM is enough
    step = int(report.split("global_step_id=")[1].split(" ")[0])  # the batch being waited for
    assert f"Stopping after global step {step - 1}: received SIGTERM, while waiting for the data loader" in text
    saved = torch.load(work_dir / LAST, weights_only=True)
    assert saved["progress"]["iteration"] == step  # the last finished step's state
    assert not alive(stuck) or stuck == proc.pid  # no stuck worker outlives the run
    if num_workers == 0:
        assert "random numbers the dataset drew for it are not rewound" in text
    assert not (work_dir / ".hat-ignite.lock").exists()


def test_a_run_stopped_while_its_loader_hung_resumes_to_the_straight_result(tmp_path):
    config, hang = make_config(tmp_path, 2)
    straight = tmp_path / "straight"
    done = run(config, straight)
    assert done.returncode == 0, done.stderr[-3000:]
    work_dir = tmp_path / "stopped"
    proc, log = start_hung(config, hang, work_dir)
    proc.send_signal(signal.SIGTERM)
    assert wait_exit(proc, 60) == 128 + signal.SIGTERM, log.read_text()[-3000:]
    hang.unlink()
    done = run(config, work_dir, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Resuming inside epoch 0 at step" in done.stderr
    expected, got = torch.load(straight / LAST, weights_only=True), torch.load(work_dir / LAST, weights_only=True)
    assert got["progress"] == expected["progress"]
    for key, value in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][key], value), key


def test_a_worker_that_outlives_its_run_does_not_hold_the_work_dir_lock(tmp_path):
    config, hang = make_config(tmp_path, 2)
    work_dir = tmp_path / "run"
    proc, log = start_hung(config, hang, work_dir)
    worker = stuck_pid(hang)
    assert worker != proc.pid
    proc.kill()  # SIGKILL: no exit hook ends the workers; the stuck one is orphaned
    proc.wait()
    try:
        assert alive(worker)
        hang.unlink()
        # the next run in the work dir is not refused: the orphaned worker holds no lock
        done = run(config, work_dir, "--resume")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "is in use by" not in done.stderr
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)


HOLDER = """
import os, sys, time
from hat_ignite.cli.workdir_lock import WorkDirLock
lock = WorkDirLock(sys.argv[1], "holder")
lock.acquire()
child = os.fork()
if child == 0:  # a forked child (as a data-loader worker is) that outlives its parent
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)  # the test reads the parent's output to its end
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # the parent dies without releasing: only the kernel drops its lock
"""


def test_a_forked_child_does_not_inherit_the_lock(tmp_path):
    from hat_ignite.cli.workdir_lock import WorkDirLock

    done = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path)], capture_output=True, text=True, timeout=time_limit(60),
                          env=env())
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[0])
    try:
        assert alive(child)
        lock = WorkDirLock(str(tmp_path), "next run")
        lock.acquire()  # was: WorkDirBusyError naming the dead parent, while the child lived
        lock.release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_lock_held_in_the_name_of_a_dead_process_says_how_to_find_the_holder(tmp_path):
    import fcntl
    import json
    import socket

    from hat_ignite.cli.workdir_lock import LOCK_FILE, WorkDirBusyError, WorkDirLock

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has any more
    path = tmp_path / LOCK_FILE
    path.write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "command": "hat-train old.py"}))
    with path.open("r+") as held:  # what a worker of an older version kept after its run died
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(WorkDirBusyError, match=r"That process is gone, yet another process still holds the "
                                                   rf"lock.*fuser -v {path}"):
            WorkDirLock(str(tmp_path), "next run").acquire()
