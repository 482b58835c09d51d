"""A HAT project run end to end as HAT's tools run it: hat-train float / calibration / qat / int_infer, then
hat-predict int_infer, with two processes (float, calibration, qat) and two DataLoader workers each, and
HAT's converter lines unchanged (see tests/hat_project.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from conftest import ROOT, time_limit
from hat_project import CONFIG_PATH, project_env, write_hat_project

from hat_ignite.callbacks.checkpoint_io import load_checkpoint


def test_a_hat_project_runs_every_stage_through_the_command_line(tmp_path):
    write_hat_project(tmp_path)
    ckpts = tmp_path / "tmp_models" / "conv_bn_digits"

    def run(tool: str, stage: str, *extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "bin" / tool), "-c", str(CONFIG_PATH), "-s", stage, "--work-dir", "work", *extra],
            cwd=tmp_path, env=project_env(tmp_path, stage), capture_output=True, text=True, timeout=time_limit(300),
        )
        assert proc.returncode == 0, f"{tool} -s {stage}:\n{proc.stderr[-4000:]}"
        return proc.stderr

    def metrics() -> dict:
        return json.loads((tmp_path / "work" / "metrics.json").read_text())

    # the ranks' DataLoader workers (spawned) unpickle the dataset class registered through hat.registry
    log = run("hat-train", "float", "--nproc", "2")
    assert "hat.* imports are served by hat-ignite" in log
    assert metrics()["float_train"]["steps"] == 8  # 512 samples, 2 processes of 32 a step
    assert metrics()["float_train"]["val_metrics"]["accuracy"] > 0.5

    # uint8 images made float by the batch processor's batch_transforms; the loss stays in float Python;
    # HAT's calibration loader (its sampler removed) sharded over 2 processes, the observers summed
    log = run("hat-train", "calibration", "--nproc", "2")
    assert "preparing ['backbone', 'head']; left in float: ['loss']" in log
    assert "Calibrator: 2 processes, each calibrating its shard of the data" in log

    # Float2QAT, LoadCheckpoint(calibration), a model returning (preds, losses) in training,
    # convert_submodule_list=["backbone", "head"]
    run("hat-train", "qat", "--nproc", "2")
    qat_accuracy = metrics()["qat_train"]["val_metrics"]["accuracy"]
    records = load_checkpoint(ckpts / "qat-checkpoint-best.pth.tar")["prepared_modules"]
    assert [(r["path"], r["stage"], r["qat_mode"]) for r in records] == [
        ("backbone", "qat", "fuse_bn"), ("head", "qat", "fuse_bn")]

    # HAT's export-only stage: no data, num_epochs=0
    run("hat-train", "int_infer")
    saved = load_checkpoint(ckpts / "int_infer-checkpoint-last.pth.tar")
    assert {r["stage"] for r in saved["prepared_modules"]} == {"quantized"}
    assert sum(t.dtype == torch.int8 for t in saved["state_dict"].values()) == 3  # two convs, one linear

    run("hat-predict", "int_infer")
    int8_accuracy = metrics()["int_infer_predict"]["metrics"]["accuracy"]
    assert int8_accuracy > 0.5 and abs(int8_accuracy - qat_accuracy) <= 0.05
    lineage = json.loads((tmp_path / "work" / "lineage.json").read_text())
    assert lineage["int_infer"]["inputs"][0]["path"] == str(ckpts / "qat-checkpoint-best.pth.tar")
