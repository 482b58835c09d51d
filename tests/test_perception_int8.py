"""Perception models through every stage from the command line: float -> calibration -> QAT -> int8.

The project in ``tests/projects/perception`` is shaped as a user's: its own module beside the
configs registers, through ``hat.registry``, nets written the way torchvision writes them (a
``BasicBlock`` / ``Bottleneck`` calling its one ``self.relu`` several times, MobileNetV2's
``Sequential`` blocks with functional pooling) and a RetinaNet-shaped detector (a dict of losses, a
head whose convs run on every FPN level, HAT's export-only ``int_infer`` stage with a
``deploy_model``). Each runs through ``hat-train`` / ``hat-predict`` in subprocesses, and the int8
model's accuracy on held-out data stays within one point of the float model's (or above it).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, time_limit

from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.quantization import load_quantized_model

PROJECT = pathlib.Path(__file__).parent / "projects" / "perception"


def _project(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "perception"
    shutil.copytree(PROJECT, root)
    return root


def _run(root: pathlib.Path, tool: str, config: str, stage: str, **env: str) -> None:
    """``tool -c config -s stage`` in the project folder, as a user runs it (no PYTHONPATH)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HAT_TRAINING_STEP")}
    environ.update(env, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bin" / tool), "-c", config, "-s", stage, "--work-dir", "work"],
        cwd=root, env=environ, capture_output=True, text=True, timeout=time_limit(600),
    )
    assert proc.returncode == 0, f"{tool} -s {stage}:\n{proc.stderr[-4000:]}"


def _assert_int8_keeps(root: pathlib.Path, key: str, float_floor: float) -> None:
    """The float model's validation ``key`` is above ``float_floor``; the int8 program (``hat-predict
    -s int_infer``) loses at most one point of it, and scores as the simulated int8 (QAT) model it
    was converted from (within one point: the short QAT may also gain some)."""
    metrics = json.loads((root / "work" / "metrics.json").read_text())
    float_score = metrics["float_train"]["val_metrics"][key]
    qat_score = metrics["qat_train"]["val_metrics"][key]
    int8_score = metrics["int_infer_predict"]["metrics"][key]
    assert float_score > float_floor
    assert int8_score >= float_score - 0.01, (float_score, int8_score)
    assert abs(int8_score - qat_score) <= 0.01, (qat_score, int8_score)


@pytest.mark.parametrize("net", ["resnet18", "resnet50", "mobilenet_v2"])
def test_a_torchvision_shaped_classifier_keeps_its_accuracy_through_every_stage(tmp_path, net):
    root = _project(tmp_path)
    for stage in ("float", "calibration", "qat"):
        _run(root, "hat-train", "classifier.py", stage, PERCEPTION_NET=net)
    _run(root, "hat-predict", "classifier.py", "int_infer", PERCEPTION_NET=net)

    _assert_int8_keeps(root, "accuracy", float_floor=0.9)

    # the whole torchvision-shaped net was prepared (its loss stays in float Python)
    records = load_checkpoint(root / "tmp_models" / f"digits_{net}" / "qat-checkpoint-best.pth.tar")["prepared_modules"]
    assert [r["path"] for r in records] == ["net"]
    # int_infer writes its int8 program by default, and it gives the predictor's answers
    program = load_quantized_model(root / "work" / "int_infer-model.pt2")
    images = torch.nn.functional.interpolate(torch.rand(4, 1, 8, 8), size=(32, 32)).expand(-1, 3, -1, -1)
    assert program(dict(img=images)).shape == (4, 10)


def test_a_retinanet_shaped_detector_keeps_its_f1_through_every_stage_and_hats_deploy_stage(tmp_path):
    root = _project(tmp_path)
    for stage in ("float", "calibration", "qat", "int_infer"):
        _run(root, "hat-train", "retinanet.py", stage)
    _run(root, "hat-predict", "retinanet.py", "int_infer")

    _assert_int8_keeps(root, "det_f1", float_floor=0.7)

    ckpts = root / "tmp_models" / "shapes_retinanet"
    # backbone, FPN and the head shared by every level are prepared; targets, losses and NMS stay in Python
    records = load_checkpoint(ckpts / "qat-checkpoint-best.pth.tar")["prepared_modules"]
    assert sorted(r["path"] for r in records) == ["backbone", "head", "neck"]
    # HAT's export-only stage: the deploy model (no targets or losses) loads the QAT checkpoint
    saved = load_checkpoint(ckpts / "int_infer-checkpoint-last.pth.tar")
    assert {r["stage"] for r in saved["prepared_modules"]} == {"quantized"}
    deploy = load_quantized_model(ckpts / "deploy-checkpoint-last.pt2")
    outs = deploy(dict(img=torch.rand(1, 1, 64, 64)))  # HAT deploy models take one image (deploy_inputs)
    assert outs["cls_scores"].shape == (1, 64 + 16 + 4, 5) and outs["bbox_preds"].shape == (1, 84, 4)
