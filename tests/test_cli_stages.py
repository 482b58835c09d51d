"""The real CLI path: float -> calibration -> qat -> int_infer on digits, lineage, fail-fast inputs."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DIGITS_CONFIG, run_tool, time_limit

STALE = [".int_infer-model.pt2.1a2b3c4d.tmp", ".int_infer-model.pt2.k3j_x9q2.tmp.pt2"]
FLOAT_OPTS = ["float_trainer.num_epochs=8", "float_trainer.callbacks[1].lr_decay_id=[5,7]"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    work = tmp_path_factory.mktemp("stages") / "work"
    runs = {}
    for tool, stage, opts in (
        ("hat-train", "float", FLOAT_OPTS), ("hat-train", "calibration", []),
        ("hat-train", "qat", []), ("hat-predict", "int_infer", []),
    ):
        extra = ["--opts", *opts] if opts else []
        if stage == "int_infer":  # what a kill during an earlier export left (this and older releases' names)
            for name in STALE:
                (work / "checkpoints" / name).write_bytes(b"PK\x03\x04 half an archive")
        out = run_tool(tool, DIGITS_CONFIG, "--stage", stage, "--work-dir", work, *extra, cwd=work.parent, timeout=300)
        assert out.returncode == 0, f"{stage}: {out.stderr[-3000:]}"
        runs[stage] = out
    metrics = json.loads((work / "metrics.json").read_text())
    lineage = json.loads((work / "lineage.json").read_text())
    return work, metrics, lineage, runs


def test_int8_stages_keep_the_float_accuracy(chain):
    _, metrics, _, _ = chain
    float_acc = metrics["float_train"]["best"]["value"]
    calibration_acc = metrics["calibration_train"]["val_metrics"]["accuracy"]
    qat_acc = metrics["qat_train"]["best"]["value"]
    int8_acc = metrics["int_infer_predict"]["metrics"]["accuracy"]
    assert float_acc >= 0.95
    assert calibration_acc >= float_acc - 0.01
    assert qat_acc >= float_acc - 0.005
    assert int8_acc >= float_acc - 0.01


def test_each_stage_records_its_lineage(chain):
    work, _, lineage, _ = chain
    assert list(lineage) == ["calibration", "float", "int_infer", "qat"]
    for prev, stage in (("float", "calibration"), ("calibration", "qat"), ("qat", "int_infer")):
        assert lineage[stage]["inputs"] == lineage[prev]["outputs"], stage  # path and sha256 of the file
        assert lineage[stage]["resolved_config"]["sha256"]
    assert lineage["int_infer"]["outputs"][0]["path"] == str(work / "checkpoints" / "int_infer-model.pt2")


def test_saved_int8_model_reloads_with_the_reported_accuracy(chain):
    from hat_ignite.data import DigitsDataset
    from hat_ignite.quantization import load_quantized_model

    work, metrics, _, _ = chain
    model = load_quantized_model(work / "checkpoints" / "int_infer-model.pt2")
    data = DigitsDataset(split="val")
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        acc = (model(batch).argmax(1) == batch["labels"]).float().mean().item()
    assert acc == pytest.approx(metrics["int_infer_predict"]["metrics"]["accuracy"], abs=1e-6)


def test_the_next_export_removes_what_a_killed_export_left(chain):
    work, _, _, runs = chain
    left = sorted(p.name for p in (work / "checkpoints").iterdir() if p.name.startswith("."))
    assert left == []
    assert f"Removed 2 temporary file(s) of an interrupted write of {work / 'checkpoints' / 'int_infer-model.pt2'}: " \
           f"{', '.join(sorted(STALE))}" in runs["int_infer"].stderr


def test_a_stage_whose_input_is_missing_fails_fast(tmp_path):
    """Refused by the launching process, once, before any of the two ranks starts."""
    work = tmp_path / "fresh"
    out = run_tool("hat-train", DIGITS_CONFIG, "--stage", "qat", "--work-dir", work, "--nproc", "2", cwd=tmp_path)
    assert out.returncode == 1
    assert f"needs {work / 'checkpoints' / 'calibration-checkpoint-best.pth.tar'}, which does not exist" in out.stderr
    assert out.stderr.count("which does not exist") == 1 and "(rank" not in out.stderr
    assert "stage 'calibration'" in out.stderr and "--stage calibration" in out.stderr
    assert not work.exists()


def test_int_infer_runs_int8_through_inductor_or_says_why_not(chain, tmp_path):
    """The stage's int8 graph goes to inductor by default; here inductor finds no C++ compiler
    (``CXX`` names none, the inductor cache is empty), so it runs as converted after one warning."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    work, metrics, _, _ = chain
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    env = dict(os.environ, HAT_IGNITE_INT8_INDUCTOR="1", CXX=str(tmp_path / "no-such-c++"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-predict"), DIGITS_CONFIG, "--stage", "int_infer", "--work-dir", copy],
        cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(300), env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compiling the int8 module 'net' with inductor for inputs of shape 256x64 " in out.stderr
    warnings = [ln for ln in out.stderr.splitlines() if "runs as saved" in ln]
    assert len(warnings) == 1 and "the int8 module 'net' runs as saved" in warnings[0], out.stderr[-3000:]
    assert "InvalidCxxCompiler" in warnings[0] and "HAT_IGNITE_INT8_INDUCTOR=0" in warnings[0]
    again = json.loads((copy / "metrics.json").read_text())["int_infer_predict"]["metrics"]["accuracy"]
    assert again == metrics["int_infer_predict"]["metrics"]["accuracy"]  # the graph as converted, as before
