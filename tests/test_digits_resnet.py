"""The conv-net config through the real CLI: float -> calibration -> qat -> int_infer, cut down."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import ROOT, run_tool

CONFIG = ROOT / "configs" / "classification" / "digits_resnet.py"
VAL = 180  # the first 180 validation images
# Short schedules on part of the data: the config's stages, structure and arguments unchanged.
OPTS = {
    "float": [
        "float_trainer.num_epochs=2", "float_trainer.callbacks[1].warmup_len=0",
        f"float_trainer.callbacks[3].data_loader.dataset.limit={VAL}",
    ],
    "calibration": [
        "calibration_trainer.num_steps=4", f"calibration_trainer.callbacks[0].data_loader.dataset.limit={VAL}",
    ],
    "qat": [
        "qat_trainer.num_epochs=1", "qat_trainer.data_loader.dataset.limit=256",
        f"qat_trainer.callbacks[3].data_loader.dataset.limit={VAL}",
    ],
    "int_infer": [f"int_infer_predictor.data_loader.dataset.limit={VAL}"],
}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    work = tmp_path_factory.mktemp("resnet") / "work"
    for tool, stage in (("hat-train", "float"), ("hat-train", "calibration"), ("hat-train", "qat"), ("hat-predict", "int_infer")):
        out = run_tool(tool, CONFIG, "--stage", stage, "--work-dir", work, "--opts", *OPTS[stage], cwd=work.parent, timeout=300)
        assert out.returncode == 0, f"{stage}: {out.stderr[-3000:]}"
    metrics = json.loads((work / "metrics.json").read_text())
    lineage = json.loads((work / "lineage.json").read_text())
    return work, metrics, lineage


def test_each_stage_loads_the_previous_stages_checkpoint(chain):
    work, _, lineage = chain
    for prev, stage in (("float", "calibration"), ("calibration", "qat"), ("qat", "int_infer")):
        assert lineage[stage]["inputs"] == lineage[prev]["outputs"], stage  # same path, same sha256
    assert lineage["qat"]["inputs"][0]["path"].endswith("calibration-checkpoint-best.pth.tar")
    assert lineage["int_infer"]["outputs"][0]["path"] == str(work / "checkpoints" / "int_infer-model.pt2")


def test_int8_accuracy_is_close_to_float(chain):
    _, metrics, _ = chain
    float_acc = metrics["float_train"]["best"]["value"]
    calibration_acc = metrics["calibration_train"]["val_metrics"]["accuracy"]
    qat_acc = metrics["qat_train"]["best"]["value"]
    int8_acc = metrics["int_infer_predict"]["metrics"]["accuracy"]
    assert float_acc >= 0.9, metrics["float_train"]
    assert calibration_acc >= float_acc - 0.03
    assert qat_acc >= float_acc - 0.03
    assert int8_acc >= qat_acc - 0.02


def test_saved_int8_program_is_the_fused_conv_net_and_reproduces_the_reported_accuracy(chain):
    from hat_ignite.data import DigitsImageDataset
    from hat_ignite.quantization import load_quantized_model

    work, metrics, _ = chain
    path = work / "checkpoints" / "int_infer-model.pt2"
    model = load_quantized_model(path)
    targets = [str(node.target) for node in model.graph.nodes if node.op == "call_function"]
    assert sum("conv2d" in t for t in targets) == 9  # stem, 2 + 3 + 3 in the stages
    assert not any("batch_norm" in t for t in targets)  # qat_mode="fuse_bn": folded into the convs
    assert any("quantize_per_tensor" in t for t in targets)
    data = DigitsImageDataset(split="val", size=16, limit=VAL)
    with torch.no_grad():
        logits = model({"img": data.images, "labels": data.labels})  # the batch as the predictor gave it
    acc = (logits.argmax(1) == data.labels).float().mean().item()
    assert acc == pytest.approx(metrics["int_infer_predict"]["metrics"]["accuracy"], abs=1e-6)
