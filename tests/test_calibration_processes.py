"""Calibration in several processes: each calibrates its shard, the observers' statistics are summed.

Real gloo process groups: ``tests/calibration_ranks.py`` (the Calibrator, every observer kind)
and ``hat-train --nproc 2 --stage calibration`` on the digits config, each against one process
calibrating on the same data.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys

import torch
from test_distributed import HAT_TRAIN, TESTS, run

from hat_ignite.cli.distributed import distributed_stage
from hat_ignite.config import Config

CONFIG = TESTS.parent / "configs" / "classification" / "digits_mlp.py"


def test_two_processes_give_the_ranges_of_one_process_on_all_batches_bit_for_bit(tmp_path):
    """The statistics are integer counts, minima and maxima, summed exactly over the processes; the
    batches are the same tensors in both runs (one intra-op thread), so the ranges are equal bit for bit."""
    proc = run([sys.executable, str(TESTS / "calibration_ranks.py"), str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = torch.load(tmp_path / "one.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert set(one) == {"min_max", "percentile", "mse", "kl", "mix", "weight_mse"}
    for observer, tensors in one.items():
        for rank in ranks:
            assert list(rank[observer]) == list(tensors)
            differing = [k for k in tensors if not torch.equal(rank[observer][k], tensors[k])]
            assert not differing, (observer, differing)
    # the observers differ where the outliers are: the input's range
    inputs = {o: float(t["graph.activation_post_process_0.activation_post_process.max_val"]) for o, t in one.items()}
    assert inputs["min_max"] == 25.0 and inputs["kl"] < 5.0


def _calibration_ranges(path) -> dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)["state_dict"]
    return {k: v for k, v in state.items() if k.endswith(("min_val", "max_val", "scale", "zero_point"))}


def test_hat_train_nproc_2_calibrates_shards_to_the_ranges_of_one_process(tmp_path):
    """``--nproc 2``: 2 x 5 steps over the first 640 training images (DistributedSampler, no shuffle)
    against one process's 10 steps over the same 640 images."""
    float_dir = tmp_path / "float"
    done = run([sys.executable, HAT_TRAIN, str(CONFIG), "-s", "float", "--work-dir", str(float_dir),
                "--opts", "float_trainer.num_epochs=1"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranges = {}
    for name, nproc, steps in (("one", 1, 10), ("two", 2, 5)):
        work_dir = tmp_path / name
        shutil.copytree(float_dir, work_dir)
        done = run([sys.executable, HAT_TRAIN, str(CONFIG), "-s", "calibration", "--work-dir", str(work_dir),
                    "--nproc", str(nproc), "--opts", f"calibration_trainer.num_steps={steps}",
                    "calibration_trainer.data_loader.shuffle=False"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        ranges[name] = _calibration_ranges(work_dir / "checkpoints" / "calibration-checkpoint-last.pth.tar")
        if nproc == 2:
            assert "Calibrator: 2 processes, each calibrating its shard of the data" in done.stderr
            assert "runs in one process" not in done.stderr
    assert list(ranges["one"]) == list(ranges["two"]) and ranges["one"]
    differing = [k for k in ranges["one"] if not torch.equal(ranges["one"][k], ranges["two"][k])]
    assert not differing, differing


def test_a_configs_several_device_ids_calibrate_on_the_first_as_hat_does(caplog):
    """HAT's Calibrator takes the first of the config's device_ids; --device-ids starts a process per GPU."""
    cfg = Config({"calibration_trainer": {"type": "Calibrator", "device": None}}, filename="cfg.py")
    args = argparse.Namespace(nproc=None, device_ids=[0, 1, 2], device_ids_from_config=True, nnodes=1)
    with caplog.at_level(logging.INFO, logger="hat_ignite.cli.distributed"):
        assert distributed_stage(args, [], cfg, "calibration_trainer", lambda argv: 0) is None
    assert cfg["calibration_trainer"]["device"] == 0 and cfg["calibration_trainer"]["type"] == "Calibrator"
    assert "calibrates on one device, GPU 0 of the config's device_ids [0, 1, 2], as HAT's Calibrator does" in caplog.text
