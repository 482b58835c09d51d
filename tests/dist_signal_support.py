"""Helpers for the multi-process signal and resume tests: a 2-process ``hat-train`` job to signal.

The job runs the config of :mod:`resume_support` with ``--nproc 2`` (gloo), in its own session
so that a test can signal the launching process, one rank, or the whole process group, and
kill all of it when the test ends. A callback added to the config writes, at loop end, the
number of steps each rank trained (``$RANKS_DIR/rank{r}.txt``), so a test can check that every
rank stopped after the same step.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

from resume_support import CONFIG, ROOT
from conftest import time_limit

TESTS = pathlib.Path(__file__).resolve().parent

_STEPS_CALLBACK = '''

class RecordSteps(CallbackMixin):
    """Writes this rank's trained step count to $RANKS_DIR/rank{r}.txt at loop end."""

    def on_loop_end(self, loop, **kwargs):
        import ignite.distributed as idist

        out = os.environ.get("RANKS_DIR", "ranks")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank{idist.get_rank()}.txt"), "w") as f:
            f.write(str(loop.state.iteration))
'''


def write_dist_config(directory: pathlib.Path) -> pathlib.Path:
    """The resume config plus the ``RecordSteps`` callback; ``work_dir`` follows ``--work-dir``."""
    text = CONFIG.replace("\nfloat_trainer = dict(", _STEPS_CALLBACK + "\n\nfloat_trainer = dict(", 1)
    text = text.replace("callbacks=[lr_updater, KillAt()]", "callbacks=[lr_updater, KillAt(), RecordSteps()]", 1)
    assert "RecordSteps()" in text
    path = directory / "dist_cfg.py"
    path.write_text(text)
    return path


def job_env(extra: dict[str, str] | None) -> dict[str, str]:
    """This environment with the tests dir importable, plus ``extra``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]), **(extra or {}))
    env.pop("OMP_NUM_THREADS", None)
    return env


def start_job(config: pathlib.Path, work_dir: pathlib.Path, *args: str,
              env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``hat-train CONFIG --nproc 2`` in a new session (its pid is the process group id)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir),
         "--nproc", "2", "--dist-timeout", "30", *args],
        cwd=work_dir.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=job_env(env), start_new_session=True,
    )


def run_job(config: pathlib.Path, work_dir: pathlib.Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a 2-process job to its end; kill its process group if it outlives ``timeout``."""
    proc = start_job(config, work_dir, *args, env=env)
    try:
        _, err = proc.communicate(timeout=time_limit(timeout))
    finally:
        kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the job's process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=time_limit(10))


def read_until(proc: subprocess.Popen, text: str, timeout: float = 90) -> list[str]:
    """The job's stderr lines up to the first one containing ``text``."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + time_limit(timeout)
    for line in proc.stderr:
        lines.append(line)
        if text in line:
            return lines
        assert time.monotonic() < deadline, f"no {text!r} within {time_limit(timeout):.0f} s:\n{''.join(lines[-30:])}"
    raise AssertionError(f"the job ended before {text!r}:\n{''.join(lines[-30:])}")


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _parent(pid: int) -> int | None:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def rank_pids(launcher: int, timeout: float = 60) -> list[int]:
    """The pids of the job's two rank processes, in start order.

    The ranks are forked from the forkserver the launching process started (its child), or,
    where they are spawned, the launching process's own children.
    """
    deadline = time.monotonic() + time_limit(timeout)
    while True:
        pids = [int(p.name) for p in pathlib.Path("/proc").iterdir() if p.name.isdigit()]
        servers = {pid for pid in pids if _parent(pid) == launcher and "forkserver" in _cmdline(pid)}
        children = sorted(
            pid for pid in pids
            if _parent(pid) in servers or (_parent(pid) == launcher and "spawn_main" in _cmdline(pid))
        )
        if len(children) == 2:
            return children
        assert time.monotonic() < deadline, f"the job did not start 2 ranks within {time_limit(timeout):.0f} s: {children}"
        time.sleep(0.2)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def survivors(pgid: int, grace: float = 5.0) -> list[str]:
    """Command lines of the processes of group ``pgid`` still alive after up to ``grace`` seconds.

    Multiprocessing's resource tracker leaves a moment after the launching process (when it
    reads the end of its pipe), hence the grace.
    """
    deadline = time.monotonic() + time_limit(grace)
    while True:
        members = group_members(pgid)
        if not members or time.monotonic() > deadline:
            return [f"{pid}: {_cmdline(pid)[:120]}" for pid in members]
        time.sleep(0.1)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    members = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(p.name))
    return members


def start_nodes(config: pathlib.Path, work_dirs: tuple[pathlib.Path, pathlib.Path], launcher: str, *args: str,
                env: tuple[dict[str, str], dict[str, str]] = ({}, {})) -> list[subprocess.Popen]:
    """Start a 2-node job on this machine: node 0 and node 1, one process each, each with its own
    command and work dir, as on two machines, with one torch thread each as the ``--nproc 2`` job has
    here (so the two jobs compute bitwise alike); ``launcher`` is ``"plain"`` (``hat-train --nnodes 2
    --node-rank R --master-addr 127.0.0.1``) or ``"torchrun"`` (the same under ``torchrun --nnodes 2``)."""
    from hat_ignite.engine.launcher import free_port

    port = str(free_port())
    nodes = []
    for rank, (work_dir, extra) in enumerate(zip(work_dirs, env)):
        train = [str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir), "--dist-timeout", "30", *args]
        if launcher == "plain":
            command = [sys.executable, *train, "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
                       "--master-port", port]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                       "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port, *train]
        env_of_node = job_env(extra)
        env_of_node["OMP_NUM_THREADS"] = "1"  # the torch threads of a 2-process job on this 2-core machine
        nodes.append(subprocess.Popen(command, cwd=config.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, env=env_of_node, start_new_session=True))
    return nodes


def wait_nodes(nodes: list[subprocess.Popen], timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Wait for every node; a node still running after ``timeout`` seconds is a hang (killed, and
    the assertion says so)."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for node in nodes:
            try:
                _, err = node.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"node {nodes.index(node)} did not end within {timeout} s (a hang)") from None
            results.append(subprocess.CompletedProcess(node.args, node.returncode, "", err))
    finally:
        for node in nodes:
            kill_group(node)
    return results
