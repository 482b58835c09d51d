"""What the int8 stages of the digits config print: only what the user needs (real CLI runs)."""

from __future__ import annotations

import re

import pytest
from conftest import DIGITS_CONFIG, run_tool


@pytest.fixture(scope="module")
def float_then_calibration(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    work_dir = cwd / "wd"
    float_run = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--opts", "float_trainer.num_epochs=1",
                         cwd=cwd, timeout=180)
    assert float_run.returncode == 0, float_run.stderr[-3000:]
    calibration = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--stage", "calibration",
                           "--opts", "calibration_steps=2", cwd=cwd, timeout=180)
    assert calibration.returncode == 0, calibration.stderr[-3000:]
    return work_dir, cwd, calibration.stderr


def test_calibration_says_what_it_loaded_once_and_no_import_noise(float_then_calibration):
    work_dir, _, err = float_then_calibration
    best = work_dir / "checkpoints" / "float-checkpoint-best.pth.tar"
    assert err.count(f"Loaded model weights from {best}.") == 1
    assert "Restored from" not in err and "Not restored" not in err  # the weights were loaded: nothing more to say
    for noise in ("_C_mxfp8", "cutlass", "triton", "_pytree", "WARNING", "Traceback"):
        assert noise not in err, noise
    done = [line for line in err.splitlines() if "hat_ignite.cli.train: done in" in line]
    assert len(done) == 1 and re.search(r"done in \S+ s: val accuracy=[0-9.]+ -> ", done[0]), done  # no "train {}"


def test_the_int8_dry_run_counts_the_int8_weights(float_then_calibration):
    work_dir, cwd, _ = float_then_calibration
    calibrated = work_dir / "checkpoints" / "calibration-checkpoint-best.pth.tar"
    point = f"int_infer_predictor.model_convert_pipeline.converters[1].checkpoint_path='{calibrated}'"
    proc = run_tool("hat-predict", DIGITS_CONFIG, "--work-dir", work_dir, "--stage", "int_infer", "--dry-run",
                    "--opts", point, cwd=cwd, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # MLPClassifier 64-128-10: 64*128 + 128*10 = 9,472 int8 weights; the 138 float biases stay parameters
    assert "model: MLPClassifier (138 parameters, " in proc.stdout and "; 9,472 int8 values)" in proc.stdout
    assert "WARNING" not in proc.stderr


def test_predict_loads_the_checkpoint_its_pipeline_loads_once(float_then_calibration):
    """``float_checkpoint`` (hat-predict's default --ckpt) is the file the stage's LoadCheckpoint loads."""
    work_dir, cwd, _ = float_then_calibration
    best = work_dir / "checkpoints" / "float-checkpoint-best.pth.tar"
    pipeline = {"type": "ModelConvertPipeline", "converters": [{"type": "LoadCheckpoint", "checkpoint_path": str(best)}]}
    proc = run_tool("hat-predict", DIGITS_CONFIG, "--work-dir", work_dir, "--dry-run",
                    "--opts", f"float_predictor.model_convert_pipeline={pipeline!r}", cwd=cwd, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"Loaded model weights from {best}.") == 1
    assert f"checkpoint: {best}" in proc.stdout
