"""Real multi-process training on the CPU (gloo): DDP parity, nodes, torchrun, delay_sync, failures.

Every run is a real subprocess tree (``bin/hat-train`` or ``tests/dist_helpers.py``) started in
its own session and killed as a whole if it outlives its timeout, so a hang fails the test
instead of blocking the suite. Ports are picked free at run time.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, time_limit

from hat_ignite.engine.launcher import free_port

TESTS = pathlib.Path(__file__).resolve().parent
HAT_TRAIN = str(ROOT / "bin" / "hat-train")
TIMEOUT = 150


def run(cmd: list[str], cwd: pathlib.Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``cmd`` with the tests dir importable; kill its whole process group on timeout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]))
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=time_limit(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd} did not finish within {time_limit(timeout):.0f} s (a hang):\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


CONFIG = """
seed = 0
model = dict(type="{model}", in_features=64, hidden_features=32, num_classes=10{model_args})
data_loader = dict(
    type="torch.utils.data.DataLoader", dataset=dict(type="DigitsDataset", split="train"),
    batch_size={batch_size}, shuffle=True,
)
float_trainer = dict(
    type="{trainer}",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type="torch.optim.SGD", lr=0.2, momentum=0.9),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                         loss_collector=dict(type="collect_loss_by_index", indexes=0)),
    device=None,
    stop_by="step",
    num_steps=6,
    callbacks=[dict(type="dist_helpers.DumpParams", out_dir={out_dir!r})],
)
"""


def write_config(path: pathlib.Path, out_dir: pathlib.Path, batch_size: int, trainer: str = "Trainer",
                 model: str = "MLPClassifier", model_args: str = "") -> pathlib.Path:
    path.write_text(textwrap.dedent(CONFIG.format(
        out_dir=str(out_dir), batch_size=batch_size, trainer=trainer, model=model, model_args=model_args,
    )))
    return path


def params(out_dir: pathlib.Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out_dir / f"params_rank{rank}.pt", weights_only=True)


def assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """``hat-train --nproc 2`` with 16 images per process: the reference of several tests."""
    tmp = tmp_path_factory.mktemp("ddp2")
    cfg = write_config(tmp / "cfg.py", tmp / "out", batch_size=16)
    proc = run([sys.executable, HAT_TRAIN, str(cfg), "--work-dir", str(tmp / "work"), "--nproc", "2",
                "--dist-timeout", "60"], cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp, proc


def test_two_processes_match_one_process_with_the_same_global_batch(two_process_run, tmp_path):
    tmp, proc = two_process_run
    ranks = [params(tmp / "out", r) for r in (0, 1)]
    assert_close(ranks[0], ranks[1], atol=0)  # DDP keeps the replicas identical
    cfg = write_config(tmp_path / "cfg.py", tmp_path / "out", batch_size=32, trainer="DistributedDataParallelTrainer")
    single = run([sys.executable, HAT_TRAIN, str(cfg), "--work-dir", str(tmp_path / "work")], cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-4000:]
    assert not (tmp_path / "out" / "params_rank1.pt").exists()
    reference = params(tmp_path / "out", 0)
    assert_close(ranks[0], reference, atol=1e-5)
    # rank 0 alone writes the run's files and logs
    log = (tmp / "work" / "float_train.log").read_text()
    assert "DistributedDataParallelTrainer" in log and log.count("seed: 0") == 1
    assert json.loads((tmp / "work" / "metrics.json").read_text())["float_train"]["steps"] == 6


@pytest.mark.parametrize("nproc", [[], ["--nproc", "1"]], ids=["default", "nproc1"])
def test_a_one_process_ddp_stage_trains_in_the_hat_train_process(tmp_path, nproc):
    """No second interpreter for a job of one process: the stage trains in hat-train's own process
    (whose parent is this test), in a process group of one, with the DDP-wrapped model."""
    cfg = write_config(tmp_path / "cfg.py", tmp_path / "out", batch_size=32, trainer="DistributedDataParallelTrainer")
    cfg.write_text(cfg.read_text().replace(
        "callbacks=[", f"callbacks=[dict(type='dist_helpers.ProcessIds', out_dir={str(tmp_path / 'out')!r}), ", 1))
    proc = run([sys.executable, HAT_TRAIN, str(cfg), "--work-dir", str(tmp_path / "work"), *nproc], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ids = json.loads((tmp_path / "out" / "process_rank0.json").read_text())
    assert ids["ppid"] == os.getpid()  # hat-train itself trained: nothing was spawned
    assert (ids["world_size"], ids["model"]) == (1, "DistributedDataParallel")
    assert "Spawn function" not in proc.stdout + proc.stderr
    assert json.loads((tmp_path / "work" / "metrics.json").read_text())["float_train"]["steps"] == 6
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["params_rank0.pt", "process_rank0.json"]


def test_two_nodes_started_separately_train_together(two_process_run, tmp_path):
    tmp, _ = two_process_run
    cfg = write_config(tmp_path / "cfg.py", tmp_path / "out", batch_size=16, trainer="DistributedDataParallelTrainer")
    port = str(free_port())
    env_cmds = [
        [sys.executable, HAT_TRAIN, str(cfg), "--work-dir", str(tmp_path / "work"), "--nnodes", "2",
         "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port, "--dist-timeout", "60"]
        for node in (0, 1)
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT)]))
    nodes = [subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for c in env_cmds]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=time_limit(TIMEOUT)))
    except subprocess.TimeoutExpired:
        pytest.fail("a two-node run did not finish (a hang)")
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-4000:]
    node0, node1 = params(tmp_path / "out", 0), params(tmp_path / "out", 1)
    assert_close(node0, node1, atol=0)
    assert_close(node0, params(tmp / "out", 0), atol=1e-5)  # the same job as two processes on one node


def test_torchrun_runs_the_same_job_without_spawning(two_process_run, tmp_path):
    tmp, _ = two_process_run
    cfg = write_config(tmp_path / "cfg.py", tmp_path / "out", batch_size=16)
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), HAT_TRAIN, str(cfg), "--work-dir", str(tmp_path / "work"),
                "--dist-timeout", "60"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Spawn function" not in proc.stdout + proc.stderr  # joined torchrun's group, spawned nothing
    assert_close(params(tmp_path / "out", 0), params(tmp_path / "out", 1), atol=0)
    assert_close(params(tmp_path / "out", 0), params(tmp / "out", 0), atol=1e-5)


def test_delay_sync_and_accumulation_skip_all_reduces_without_changing_the_result(tmp_path):
    proc = run([sys.executable, str(TESTS / "dist_helpers.py"), "allreduce", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(tmp_path / "allreduce.pt", weights_only=True)
    (sync_count, sync_params), (delay_count, delay_params), (accum_count, accum_params) = (
        results["sync"], results["delay"], results["accum"]
    )
    buckets = delay_count // 4
    assert buckets >= 1 and delay_count == 4 * buckets  # one all-reduce per bucket per step
    assert sync_count == 3 * delay_count  # without delay_sync: one per sub-batch
    assert accum_count == 2 * buckets  # 4 steps, update every 2: synchronised twice
    assert_close(delay_params, sync_params, atol=1e-6)
    assert not all(torch.equal(accum_params[k], delay_params[k]) for k in accum_params)


def test_a_launched_process_frees_its_ddp_model_before_it_exits(tmp_path):
    # A DDP model kept in a reference cycle until the interpreter's exit can have its process
    # group released while Python is torn down, which aborts the process (SIGABRT) after a run
    # that succeeded; the launcher collects such cycles when the training function returns.
    proc = run([sys.executable, str(TESTS / "dist_helpers.py"), "release", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [(tmp_path / f"release_rank{r}.txt").read_text() for r in (0, 1)] == ["freed", "freed"]


def _two_processes_with_model(tmp_path: pathlib.Path, model: str, model_args: str,
                              dist_timeout: int) -> subprocess.CompletedProcess:
    """``hat-train --nproc 2`` on the test config with another model (16 images per process)."""
    cfg = write_config(tmp_path / "cfg.py", tmp_path / "out", batch_size=16, model=model, model_args=model_args)
    return run([sys.executable, HAT_TRAIN, str(cfg), "--work-dir", str(tmp_path / "work"), "--nproc", "2",
                "--dist-timeout", str(dist_timeout)], cwd=tmp_path, timeout=120)


def test_a_failing_rank_ends_the_whole_job_with_its_error(tmp_path):
    proc = _two_processes_with_model(tmp_path, "dist_helpers.FailingMLP", ", fail_rank=1, fail_step=2", dist_timeout=30)
    assert proc.returncode != 0
    assert "injected failure on rank 1 at step 2" in proc.stderr
    assert "hat-train (rank 1): error" in proc.stderr
    assert not (tmp_path / "out").exists()  # no rank reached the end of the loop


def test_a_nan_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path):
    # The NaN check's flag is all-reduced: rank 0, whose loss is finite, stops at the same step
    # with the same error instead of waiting in a collective that rank 1 never joins. The config's
    # SGD is not fused: the flags of step 2 are read on the device a step later, inside step 3.
    proc = _two_processes_with_model(tmp_path, "dist_helpers.NanLossMLP", ", nan_rank=1, nan_step=2", dist_timeout=60)
    assert proc.returncode != 0
    where = ("training float_trainer failed at epoch_id=0, global_step_id=3: NonFiniteLossError: "
             "Non-finite loss at epoch_id=0, step_id=2, global_step_id=2, batch_idx=0")
    assert f"hat-train (rank 1): error: {where}: losses[0]=nan." in proc.stderr, proc.stderr[-4000:]
    assert f"hat-train (rank 0): error: {where}: on another rank (this rank's: losses[0]=" \
        in proc.stderr, proc.stderr[-4000:]
    assert "Timeout" not in proc.stderr and "timed out" not in proc.stderr
    assert not (tmp_path / "out").exists()  # no rank reached the end of the loop


def test_multitask_config_trains_both_heads_in_two_processes(tmp_path):
    config = ROOT / "configs" / "classification" / "digits_multitask.py"
    proc = run([sys.executable, HAT_TRAIN, str(config), "--work-dir", str(tmp_path / "work"), "--nproc", "2",
                "--dist-timeout", "60", "--opts", "float_trainer.num_epochs=2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    val = json.loads((tmp_path / "work" / "metrics.json").read_text())["float_train"]["val_metrics"]
    assert val["digits_accuracy"] > 0.5  # chance: 0.1
    assert val["parity_accuracy"] > 0.7  # chance: 0.5


def test_hats_positional_launch_call_runs_two_processes_on_the_given_url(tmp_path):
    # HAT's launch(main_func, device_ids, dist_url, dist_launcher, num_processes, backend, args):
    # the third argument is the rendezvous URL, not the number of processes.
    port = free_port()
    proc = run([sys.executable, str(TESTS / "dist_helpers.py"), "hat_positional", str(tmp_path), str(port)],
               cwd=tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"whoami{r}.json").read_text()) for r in range(2)]
    assert ranks == [
        {"device": None, "rank": r, "world_size": 2, "backend": "gloo", "port": str(port)} for r in range(2)
    ]


def test_build_launcher_takes_hats_snake_case_types_and_its_call():
    from hat_ignite.engine.launcher import (
        build_launcher, launch_data_parallel, launch_distributed, launch_local, register_launcher,
    )

    assert build_launcher({"type": "distributed_data_parallel_trainer"}) is launch_distributed
    assert build_launcher("DistributedDataParallelTrainer") is launch_distributed
    assert build_launcher({"type": "data_parallel_trainer"}) is launch_data_parallel
    # HAT's tools/train.py call; HAT's DataParallelTrainer launcher (run outside the repository)
    # calls main_func([0, 1], *args) for these arguments.
    calls = []
    build_launcher({"type": "data_parallel_trainer"})(
        lambda device, *args: calls.append((device, args)), [0, 1], dist_url="auto", dist_launcher=None,
        args=("cfg.py", None, True, "float"),
    )
    build_launcher("Trainer")(lambda device, *args: calls.append((device, args)), None, "auto", None, args=(1,))
    assert calls == [([0, 1], ("cfg.py", None, True, "float")), (None, (1,))]
    with pytest.raises(ValueError, match="dist_launcher='mpi' is not supported"):
        launch_distributed(lambda device: None, None, "auto", "mpi")
    with pytest.raises(ValueError, match="'tcp://HOST:PORT'"):
        launch_distributed(lambda device: None, None, "file:///tmp/rendezvous")
    register_launcher("HatStyleTestTrainer", launch_local)
    assert build_launcher({"type": "HatStyleTestTrainer"}) is launch_local


def test_build_launcher_refuses_the_trainers_hat_ignite_does_not_provide_by_name():
    from hat_ignite.engine.launcher import build_launcher
    from hat_ignite.errors import ConfigError

    # before: these got the one-process launcher, whose refusal of 2 processes never named DeepSpeed
    with pytest.raises(ConfigError, match="'deepspeed_trainer' is a HAT trainer .* DeepSpeed is not supported"):
        build_launcher({"type": "deepspeed_trainer"})
    with pytest.raises(ConfigError, match="NVIDIA Apex is not supported"):
        build_launcher("ApexDistributedDataParallelTrainer")


def test_hat_serves_its_launch_functions(hat_alias):
    from hat.engine.ddp_trainer import launch as ddp_launch
    from hat.engine.dp_trainer import launch as dp_launch
    from hat.engine.launcher import build_launcher, register_launcher

    from hat_ignite.engine import launcher

    assert (ddp_launch, dp_launch) == (launcher.launch_distributed, launcher.launch_data_parallel)
    assert (build_launcher, register_launcher) == (launcher.build_launcher, launcher.register_launcher)
