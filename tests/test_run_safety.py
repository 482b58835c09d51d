"""No lost work around checkpoints: the work-dir lock, the optimizer check at resume, the failure
messages, and a stop that does not wait for the end-of-training validation.

Real ``hat-train`` subprocesses on the shipped digits config and on the config of
:mod:`resume_support` (each step sleeps ``STEP_SLEEP`` seconds, so a second command or a signal
arrives while training runs).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.callbacks.checkpoint_optim import load_optimizer_state
from hat_ignite.cli.resume import saved_at
from hat_ignite.cli.workdir_lock import LOCK_FILE, WorkDirBusyError, WorkDirLock
from hat_ignite.errors import CheckpointError
from resume_support import ROOT, TOTAL_STEPS, load, popen_train, write_config
from conftest import time_limit

DIGITS = ROOT / "configs" / "classification" / "digits_mlp.py"
ADAM = "float_trainer.optimizer={'type': 'torch.optim.Adam', 'lr': 0.001, 'params': {'\\\\.bias$': {'weight_decay': 0.0}}}"


def _hat_train(*args: str, cwd: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bin" / "hat-train"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=time_limit(180), env={**os.environ, **(env or {})})


def _read_until(proc: subprocess.Popen, text: str, lines: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if text in line:
            return
    raise AssertionError("".join(lines)[-3000:])


# -- the work-dir lock -------------------------------------------------------------------------
def _second_run_while_the_first_trains(first: subprocess.Popen, config: pathlib.Path, work_dir: pathlib.Path,
                                       cwd: pathlib.Path, release: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """Start a second ``hat-train`` into ``work_dir`` once ``first`` saved; let ``first`` finish
    (creating ``release``, the file that ends its steps' sleeps).

    Checks that the second one is refused while the first still runs, naming the first's pid and
    host, and that the first ends with exit code 0 and its lock file gone.
    """
    lines: list[str] = []
    try:
        _read_until(first, "Saved checkpoint", lines)  # the first run is training and has saved
        second = _hat_train(str(config), "--work-dir", str(work_dir), cwd=cwd)
        assert first.poll() is None, "the first run ended before the second one was refused"
        if release is not None:
            release.touch()
        rest = first.communicate(timeout=time_limit(300))[1]
    finally:
        first.kill()
    assert second.returncode == 1, second.stderr[-2000:]
    assert f"is in use by process {first.pid} on host {socket.gethostname()}" in second.stderr, second.stderr[-2000:]
    assert "pass another --work-dir" in second.stderr
    assert first.returncode == 0, ("".join(lines) + rest)[-3000:]
    log = (work_dir / "float_train.log").read_text()
    assert log.count("stage float_trainer, work dir") == 1  # the refused run never wrote into the log
    assert not (work_dir / LOCK_FILE).exists()  # released at the end
    return second


def test_a_second_run_into_a_busy_work_dir_is_refused_and_the_first_finishes_unharmed(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    release = tmp_path / "release"  # the run sleeps at each step until the second one was refused
    first = popen_train(config, work_dir, env={"STEP_SLEEP": "1.0", "STEP_SLEEP_UNTIL": str(release)})
    _second_run_while_the_first_trains(first, config, work_dir, tmp_path, release)
    final = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    assert final["progress"]["iteration"] == TOTAL_STEPS  # the first run completed every step


def test_a_second_run_of_the_shipped_config_into_its_busy_work_dir_is_refused(tmp_path):
    work_dir = tmp_path / "wd"
    command = [sys.executable, str(ROOT / "bin" / "hat-train"), str(DIGITS), "--work-dir", str(work_dir),
               "--opts", "float_trainer.num_epochs=120"]  # long enough to be running when the second starts
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _second_run_while_the_first_trains(first, DIGITS, work_dir, tmp_path)
    final = load(work_dir / "checkpoints" / "float-checkpoint-last.pth.tar")
    assert final["progress"]["epoch"] == 120  # the first run completed every epoch


def test_in_a_two_process_run_rank_0_holds_the_lock_for_the_job(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    release = tmp_path / "release"  # the ranks sleep at each step until the second run was refused
    job = popen_train(config, work_dir, "--nproc", "2", env={"STEP_SLEEP": "1.0", "STEP_SLEEP_UNTIL": str(release)})
    lines: list[str] = []
    try:
        _read_until(job, "Saved checkpoint", lines)
        holder = json.loads((work_dir / LOCK_FILE).read_text())
        second = _hat_train(str(config), "--work-dir", str(work_dir), cwd=tmp_path)
        release.touch()
        rest = job.communicate(timeout=time_limit(120))[1]
    finally:
        job.kill()
    assert holder["pid"] != job.pid and "--nproc 2" in holder["command"]  # a started rank, not the launcher
    assert second.returncode == 1 and f"is in use by process {holder['pid']} on host" in second.stderr, second.stderr
    assert job.returncode == 0, ("".join(lines) + rest)[-3000:]
    assert not (work_dir / LOCK_FILE).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": dead.pid, "host": socket.gethostname(), "command": "hat-train old.py", "started": "x"}))
    lock = WorkDirLock(str(tmp_path), "hat-train new.py")
    with caplog.at_level(logging.WARNING, logger="hat_ignite.cli"):
        lock.acquire()
    try:
        assert f"left by process {dead.pid} on host {socket.gethostname()} (hat-train old.py" in caplog.text
        assert "that process is gone" in caplog.text
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_live_holder_in_another_process_and_a_lock_from_another_host_are_refused(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from hat_ignite.cli.workdir_lock import WorkDirLock; "
         f"WorkDirLock({str(tmp_path)!r}, 'hat-train held.py').acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkDirBusyError, match=f"in use by process {holder.pid} on host .*hat-train held.py"):
            WorkDirLock(str(tmp_path), "hat-train other.py").acquire()
    finally:
        holder.kill()
        holder.wait()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere-node", "command": "hat-train x.py"}))
    with pytest.raises(WorkDirBusyError, match=f"on host elsewhere-node .*delete {tmp_path / LOCK_FILE}"):
        WorkDirLock(str(tmp_path), "hat-train other.py").acquire()


# -- the optimizer check ------------------------------------------------------------------------
def test_an_adam_checkpoint_resumed_into_the_sgd_config_is_refused_before_any_step(tmp_path):
    adam = _hat_train(str(DIGITS), "--work-dir", "adam", "--opts", "float_trainer.num_epochs=1", ADAM, cwd=tmp_path)
    assert adam.returncode == 0, adam.stderr[-2000:]
    ckpt = tmp_path / "adam" / "checkpoints" / "float-checkpoint-last.pth.tar"
    sgd = _hat_train(str(DIGITS), "--work-dir", "sgd", "--opts", "float_trainer.num_epochs=2", "--resume", str(ckpt),
                     cwd=tmp_path)
    assert sgd.returncode == 1
    assert (f"float_trainer did not start training (nothing was trained): CheckpointError: Checkpoint {ckpt}: the "
            f"saved optimizer state belongs to Adam, but this run's optimizer is SGD") in sgd.stderr, sgd.stderr[-2000:]
    assert "failed at epoch_id" not in sgd.stderr and "Restored" not in sgd.stderr
    # the end-of-training checkpoint of 23 steps (global steps 0-22) is named by its last step
    assert "(saved after global step 22, 23 steps done)" in sgd.stderr
    assert not list((tmp_path / "sgd").glob("checkpoints/*.pth.tar"))
    # the resolved config is written once training starts: a refused resume leaves none behind
    assert not (tmp_path / "sgd" / "float_train_config.py").exists()


def _optimizer(kind, **options):
    params = [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(3))]
    opt = kind([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], **options)
    return opt, params


def _stepped(kind, **options):
    opt, params = _optimizer(kind, **options)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return opt


def test_optimizer_states_of_another_type_or_shape_are_refused_without_a_recorded_type():
    adam, sgd = _stepped(torch.optim.Adam, lr=1e-3), _stepped(torch.optim.SGD, lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"Checkpoint /c\.pth: the saved optimizer state belongs to another "
                                              r"optimizer type: its parameter group 0 lacks the option\(s\) "
                                              r"\['dampening', 'momentum'\] this run's SGD needs"):
        load_optimizer_state(_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)[0], adam.state_dict(), "/c.pth")
    with pytest.raises(CheckpointError, match=r"/c\.pth: the saved optimizer state does not load into this run's Adam"):
        load_optimizer_state(_optimizer(torch.optim.Adam)[0], sgd.state_dict(), "/c.pth")
    no_momentum = _stepped(torch.optim.SGD, lr=0.1, momentum=0.0)  # keeps no momentum buffer ...
    state = copy.deepcopy(no_momentum.state_dict())
    state["state"] = {0: {"momentum_buffer": torch.zeros(5)}}  # ... but this one holds one of another shape
    with pytest.raises(CheckpointError, match=r"parameter 0 of group 0 has the state \['momentum_buffer'\], this "
                                              r"run's SGD keeps \[\]"):
        load_optimizer_state(_optimizer(torch.optim.SGD, lr=0.1)[0], state, "/c.pth")
    state = copy.deepcopy(sgd.state_dict())
    state["state"][0]["momentum_buffer"] = torch.zeros(7)
    with pytest.raises(CheckpointError, match=r"state 'momentum_buffer' of parameter 0 of group 0 has shape \(7,\), "
                                              r"the parameter \(3, 2\)"):
        load_optimizer_state(_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)[0], state, "/c.pth")
    same, _ = _optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)
    load_optimizer_state(same, sgd.state_dict(), "/c.pth", saved_type="SGD")  # the right state loads
    assert torch.equal(same.state_dict()["state"][0]["momentum_buffer"], sgd.state_dict()["state"][0]["momentum_buffer"])


# -- messages -------------------------------------------------------------------------------------
def test_a_garbage_file_is_refused_without_torchs_advice_to_load_unsafely(tmp_path):
    path = tmp_path / "garbage.pth.tar"
    path.write_bytes(bytes(range(256)) * 12)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    text = str(info.value)
    assert text.startswith(f"Cannot load checkpoint {path}: it is not a complete torch.save archive")
    assert "weights_only" not in text and "Re-running" not in text and "trusted source" not in text


def test_saved_at_names_the_last_step_done():
    assert saved_at({"step": 69, "progress": {"iteration": 69}}) == "saved after global step 68, 69 steps done"
    assert saved_at({"step": 3, "progress": {"iteration": 4}}) == "saved after global step 3, 4 steps done"


FETCH_FAILS = """
import torch

class FailsAt(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 40:  # in the batch of global step 10 (batches of 4, in order)
            raise KeyError("sample 40 is missing")
        return {"img": torch.randn(64), "labels": torch.tensor(i % 10)}

float_trainer = dict(
    type="Trainer",
    model=dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10),
    data_loader=dict(type="torch.utils.data.DataLoader", dataset=dict(type=FailsAt), batch_size=4),
    optimizer=dict(type="torch.optim.SGD", lr=0.1),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                         loss_collector=dict(type="collect_loss_by_index", indexes=0)),
    device=None,
    num_epochs=1,
)
"""


def test_a_data_loading_failure_names_the_step_whose_batch_was_being_fetched(tmp_path):
    (tmp_path / "fails.py").write_text(FETCH_FAILS)
    done = _hat_train(str(tmp_path / "fails.py"), "--work-dir", "wd", cwd=tmp_path)
    assert done.returncode == 1
    assert ("training float_trainer failed while fetching the batch of epoch_id=0, global_step_id=10: KeyError: "
            "'sample 40 is missing'") in done.stderr, done.stderr[-2000:]


# -- a stop does not wait for the end-of-training validation --------------------------------------
def test_sigterm_skips_the_end_of_training_validation(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    proc = popen_train(config, work_dir, env={"STEP_SLEEP": "0.3"})
    lines: list[str] = []
    try:
        _read_until(proc, "Saved checkpoint", lines)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rest = proc.communicate(timeout=time_limit(60))[1]
        seconds = time.monotonic() - sent
    finally:
        proc.kill()
    err = "".join(lines) + rest
    assert proc.returncode == 143, err[-2000:]
    after = err[err.index("Stopping after global step"):]
    # the stop is "(received SIGTERM)", or "(received SIGTERM, while waiting for the data loader)" when
    # the signal came while the next batch was being fetched (a loaded machine)
    assert "Skipping the end-of-training validation: the run was stopped (received SIGTERM" in after
    assert "Predictor" not in after and "Validation Epoch" not in after  # no validation pass ran after the stop
    assert "training curves not drawn after a stop" in after
    assert seconds < 30
