"""Signals, kills and resume in a real 2-process gloo job (``hat-train CONFIG --nproc 2``).

Every job runs in its own session (see :mod:`dist_signal_support`) and its whole process group is
killed when the test ends, so a hang or a failure leaves no process behind. The config is the
one of :mod:`resume_support` (dropout, random augmentation in the dataset, shuffled loader,
validation at each epoch end, a checkpoint every 2 steps); with 2 processes an epoch is 3 steps
and the run 9.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import pytest

from dist_signal_support import (
    alive,
    job_env,
    kill_group,
    rank_pids,
    read_until,
    run_job,
    start_job,
    start_nodes,
    survivors,
    wait_nodes,
    write_dist_config,
)
from resume_support import ROOT, differences, load
from conftest import time_limit

RUN_SPECIFIC = (".versions", ".content_sha256")
DIST_STEPS = 9  # 96 points, 16 per process and step, 2 processes, 3 epochs
STOP_LIMIT_S = 30.0


@pytest.fixture(scope="module")
def straight_2proc(tmp_path_factory):
    """Work dir of an uninterrupted 2-process run of the config."""
    tmp = tmp_path_factory.mktemp("straight2")
    config = write_dist_config(tmp)
    done = run_job(config, tmp / "wd", env={"RANKS_DIR": str(tmp / "ranks")})
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "wd"


def _final(work_dir):
    return load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")


def _resume_with(command: str, cwd, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the printed resume command (``hat-train ...``) with this checkout's bin/hat-train."""
    argv = shlex.split(command)
    assert argv[0] == "hat-train" and "--nproc" in argv and argv[-2:] == ["--resume", "auto"], argv
    proc = subprocess.Popen([sys.executable, str(ROOT / "bin" / "hat-train"), *argv[1:]], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=job_env(env),
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=time_limit(120))
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, "", err)


def _hit_after_first_save(proc: subprocess.Popen, hit: Callable[[list[int]], None]) -> tuple[str, float, list[int], list]:
    """Once the job saved its first checkpoint, ``hit(rank pids)``; wait for the job to end.

    Returns:
        The whole stderr, the seconds from the hit to the job's end, the rank pids, and the
        processes of the job's group still alive; the group is killed in any case.
    """
    try:
        ranks = rank_pids(proc.pid)
        lines = read_until(proc, "Saved checkpoint")
        sent = time.monotonic()
        hit(ranks)
        _, rest = proc.communicate(timeout=time_limit(STOP_LIMIT_S + 30))
        took = time.monotonic() - sent
        members = survivors(proc.pid)
    finally:
        kill_group(proc)
    return "".join(lines) + rest, took, ranks, members


@pytest.mark.parametrize(("target", "signum"), [
    ("group", signal.SIGTERM),   # torchrun / a terminal: every process gets it
    ("launcher", signal.SIGINT),  # a scheduler signalling the parent only
    ("rank1", signal.SIGTERM),   # one rank (not the one writing checkpoints)
])
def test_a_signal_stops_every_rank_at_the_same_step_with_a_resumable_checkpoint(
        tmp_path, straight_2proc, target, signum):
    config = write_dist_config(tmp_path)
    work_dir = tmp_path / "wd"
    env = {"STEP_SLEEP": "0.4", "RANKS_DIR": str(tmp_path / "ranks")}
    proc = start_job(config, work_dir, env=env)
    def send(ranks: list[int]) -> None:
        if target == "group":
            os.killpg(proc.pid, signum)
        elif target == "launcher":
            proc.send_signal(signum)
        else:
            os.kill(ranks[1], signum)

    err, took, ranks, members = _hit_after_first_save(proc, send)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert took < time_limit(STOP_LIMIT_S), took
    assert not any(alive(pid) for pid in ranks) and members == [], members
    name = signal.Signals(signum).name
    match = re.search(rf"stopped by {name} after global step (\d+); resumable checkpoint: (\S+)\. "
                      r"Resume with: (hat-train .* --resume auto)", err)
    assert match, err[-3000:]
    step, path = int(match.group(1)), match.group(2)
    assert 1 <= step < DIST_STEPS - 1
    # every rank trained exactly step + 1 steps
    assert [(tmp_path / "ranks" / f"rank{r}.txt").read_text() for r in (0, 1)] == [str(step + 1)] * 2
    saved = load(path)
    assert saved["step"] == step and saved["progress"]["iteration"] == step + 1
    assert saved["progress"]["world_size"] == 2
    assert _final(work_dir)["step"] == step  # `last` points at it
    if target != "rank1":
        return
    # resuming with exactly the printed command finishes, bitwise equal to the straight run
    done = _resume_with(match.group(3), tmp_path, env={"RANKS_DIR": str(tmp_path / "ranks")})
    assert done.returncode == 0, done.stderr[-3000:]
    final, straight = _final(work_dir), _final(straight_2proc)
    assert final["progress"]["iteration"] == straight["progress"]["iteration"] == DIST_STEPS
    assert differences(straight, final, RUN_SPECIFIC) == []


def test_a_sigkilled_rank_ends_the_job_without_orphans(tmp_path):
    config = write_dist_config(tmp_path)
    proc = start_job(config, tmp_path / "wd", env={"STEP_SLEEP": "0.4", "RANKS_DIR": str(tmp_path / "ranks")})
    err, took, ranks, members = _hit_after_first_save(proc, lambda ranks: os.kill(ranks[1], signal.SIGKILL))
    assert proc.returncode not in (0, None), err[-3000:]
    assert took < time_limit(STOP_LIMIT_S), took
    assert not any(alive(pid) for pid in ranks) and members == [], members
    assert "SIGKILL" in err, err[-3000:]  # the launcher names how the rank died


def test_a_sigkilled_job_resumed_on_2_processes_is_bitwise_equal(tmp_path, straight_2proc):
    config = write_dist_config(tmp_path)
    work_dir = tmp_path / "wd"
    env = {"STEP_SLEEP": "0.4", "RANKS_DIR": str(tmp_path / "ranks")}
    proc = start_job(config, work_dir, env=env)
    try:
        read_until(proc, "checkpoint-step-3-")  # global step 3: inside epoch 1 (3 steps per epoch)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=time_limit(30))
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    newest = _final(work_dir)
    assert newest["step"] in (3, 5) and newest["step"] < DIST_STEPS - 1
    done = run_job(config, work_dir, "--resume", "auto", env={"RANKS_DIR": str(tmp_path / "ranks")})
    assert done.returncode == 0, done.stderr[-3000:]
    steps_done = newest["data"]["steps_done"]
    assert f"Resuming inside epoch {newest['step'] // 3} at step {steps_done} of 3" in done.stderr
    final, straight = _final(work_dir), _final(straight_2proc)
    assert final["progress"]["iteration"] == DIST_STEPS
    assert differences(straight, final, RUN_SPECIFIC) == []  # weights, optimizer, rng, data ...
    assert final["optimizer"]["state"]


def test_resuming_with_another_number_of_processes_is_refused(tmp_path, straight_2proc):
    from hat_ignite.callbacks.checkpoint_files import scan_checkpoints

    work_dir = tmp_path / "wd"
    shutil.copytree(straight_2proc, work_dir)
    config = write_dist_config(tmp_path)
    steps = {n: p for kind, n, p in scan_checkpoints(work_dir / "checkpoints", "") if kind == "step"}
    saved = steps[3]
    before = _file_hashes(work_dir)
    one = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir),
         "--resume", str(saved)],
        cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(120),
    )
    assert one.returncode == 1, one.stderr[-3000:]
    assert (f"Checkpoint {saved} was written by a run of 2 training process(es), but this run has 1" in one.stderr
            and "Resume it with 2 processes (hat-train ... --nproc 2)" in one.stderr), one.stderr[-3000:]
    # refused before the work dir is touched: the resolved config still matches the checkpoints
    assert _file_hashes(work_dir) == before


# -- several nodes: a killed node, own work dirs and a shared one, plain and under torchrun ---------------------
def _file_hashes(work_dir) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(work_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(work_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def killed_node(tmp_path_factory):
    """A 2-node job under torchrun (one process per node, the same work dir) whose node 1 is
    SIGKILLed at global step 4: both nodes end, with no hang."""
    tmp = tmp_path_factory.mktemp("nodes")
    config = write_dist_config(tmp)
    shared = tmp / "shared"
    ranks = {"RANKS_DIR": str(tmp / "ranks")}
    started = time.monotonic()
    ends = wait_nodes(start_nodes(config, (shared, shared), "torchrun",
                                  env=(ranks, dict(ranks, KILL_AT="step:4", KILL_MARKERS=str(tmp)))))
    assert all(end.returncode != 0 for end in ends), [end.stderr[-2000:] for end in ends]
    assert time.monotonic() - started < 90
    return tmp, config, shared


@pytest.mark.parametrize("launcher", ["plain", "torchrun"])
def test_a_node_whose_work_dir_lacks_the_checkpoint_refuses_the_resume_on_every_node(killed_node, launcher):
    tmp, config, shared = killed_node
    before = _file_hashes(shared)
    own = tmp / f"node1-{launcher}"  # node 1's own work dir (its local disk): rank 0 never wrote there
    ends = wait_nodes(start_nodes(config, (shared, own), launcher, "--resume", "auto"), timeout=90)
    resumed_from = re.search(r"Rank 0 \(node 0, host \S+\) would resume from (\S+), (\d+) steps done", ends[0].stderr)
    assert resumed_from, ends[0].stderr[-3000:]
    for node, end in enumerate(ends):
        assert end.returncode == 1, (node, end.stderr[-3000:])
        assert "would not resume from the same checkpoint, so none starts" in end.stderr, (node, end.stderr[-3000:])
        assert f"node 1 (host {socket.gethostname()}, rank 1) found no checkpoint in {own / 'checkpoints'}" in end.stderr
        assert (f"same work dir on a file system they all mount at the same path, or copy {resumed_from.group(1)} to "
                f"the same path on node 1 (host {socket.gethostname()})") in end.stderr
    assert _file_hashes(shared) == before and not own.exists()  # nothing written, the config dump included


def test_a_killed_node_resumed_on_a_shared_work_dir_is_bitwise_equal(killed_node, straight_2proc):
    _, config, shared = killed_node
    ends = wait_nodes(start_nodes(config, (shared, shared), "plain", "--resume", "auto"))
    assert [end.returncode for end in ends] == [0, 0], [end.stderr[-3000:] for end in ends]
    assert "Resuming inside epoch" in ends[0].stderr
    final, straight = _final(shared), _final(straight_2proc)
    assert final["progress"]["iteration"] == DIST_STEPS
    assert differences(straight, final, RUN_SPECIFIC) == []
