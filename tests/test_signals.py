"""SIGTERM / SIGINT to a running ``hat-train``: finish the step, save a resumable checkpoint, exit
143 / 130 naming the command that resumes; a second signal exits at once.

Real ``hat-train`` subprocesses on the config of :mod:`resume_support`; each step sleeps
(``STEP_SLEEP``) so that the signal arrives while training runs.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time

from hat_ignite.callbacks.checkpoint_files import latest_valid_checkpoint
from resume_support import ROOT, TOTAL_STEPS, differences, load, popen_train, straight_run, write_config
from conftest import time_limit

RUN_SPECIFIC = (".versions", ".content_sha256")


def _signal_after_first_save(proc: subprocess.Popen, *signums: int, gap: float = 0.0, delay: float = 0.0) -> str:
    """Send ``signums`` ``delay`` s after the first checkpoint is saved; return the whole stderr."""
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "Saved checkpoint" in line:
            time.sleep(delay)
            for i, signum in enumerate(signums):
                if i:
                    time.sleep(gap)
                proc.send_signal(signum)
            break
    try:
        _, rest = proc.communicate(timeout=time_limit(60))
    finally:
        proc.kill()
    return "".join(lines) + rest


def test_sigterm_saves_a_checkpoint_that_resumes_to_the_straight_result(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    proc = popen_train(config, work_dir, env={"STEP_SLEEP": "0.3"})
    err = _signal_after_first_save(proc, signal.SIGTERM)
    assert proc.returncode == 143, err[-2000:]
    match = re.search(r"stopped by SIGTERM after global step (\d+); resumable checkpoint: (\S+)\. "
                      r"Resume with: (hat-train .* --resume auto)", err)
    assert match, err[-2000:]
    step, path, command = int(match.group(1)), match.group(2), match.group(3)
    assert step < TOTAL_STEPS - 1
    saved = load(path)
    assert saved["step"] == step and saved["progress"]["iteration"] == step + 1
    assert latest_valid_checkpoint(work_dir / "checkpoints")[0] in (path, str(work_dir / "checkpoints" /
                                                                              "checkpoint-last.pth.tar"))
    assert load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")["step"] == step  # marked as the last
    # run exactly the command the message gives
    argv = shlex.split(command)
    assert argv[0] == "hat-train"
    done = subprocess.run([sys.executable, str(ROOT / "bin" / "hat-train"), *argv[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(120))
    assert done.returncode == 0, done.stderr[-2000:]
    final = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    straight = load(straight_run("workers0") / "checkpoints" / "checkpoint-last.pth.tar")
    assert final["step"] == TOTAL_STEPS  # written at the end of training, after the last epoch's end hooks
    assert differences(straight, final, RUN_SPECIFIC) == []


def test_sigint_exits_130_after_saving_and_names_the_resume_command(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    proc = popen_train(config, work_dir, env={"STEP_SLEEP": "0.3"})
    err = _signal_after_first_save(proc, signal.SIGINT)
    assert proc.returncode == 130, err[-2000:]
    assert "stopped by SIGINT after global step" in err and "--resume auto" in err
    _, checkpoint = latest_valid_checkpoint(work_dir / "checkpoints")
    assert checkpoint["progress"]["iteration"] == checkpoint["step"] + 1 and checkpoint["data"]["steps_done"] >= 1


def test_a_second_signal_exits_at_once_without_saving(tmp_path):
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    proc = popen_train(config, work_dir, env={"STEP_SLEEP": "1.5"})
    # both signals land inside the next step's 1.5 s sleep, not in the save's own step end
    err = _signal_after_first_save(proc, signal.SIGTERM, signal.SIGTERM, gap=0.2, delay=0.4)
    assert proc.returncode == 143, err[-2000:]
    assert "second SIGTERM: exiting now without saving" in err
    assert "resumable checkpoint" not in err


def test_the_stop_handler_does_not_keep_the_trainer_alive():
    # After a stop the handler stays installed to the process's end (a second signal exits at
    # once); it must not hold the trainer, whose DDP model would keep the process group alive.
    import gc
    import weakref

    from hat_ignite.cli.resume import install_stop_signals

    class Stoppable:
        def request_stop(self, reason: str, code: int) -> None:
            self.stop = (reason, code)

    trainer = Stoppable()
    received, restore = install_stop_signals(trainer)
    try:
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the first signal: a stop request
        assert received == [signal.SIGTERM] and trainer.stop == ("received SIGTERM", signal.SIGTERM)
        ref = weakref.ref(trainer)
        del trainer
        gc.collect()
        assert ref() is None
    finally:
        restore()
