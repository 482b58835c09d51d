"""hat-train / hat-predict end to end on the shipped digits config, and their errors."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys

import pytest
import torch
from conftest import DIGITS_CONFIG, ROOT, run_tool, time_limit

from hat_ignite.cli import predict as predict_cli
from hat_ignite.cli import train as train_cli
from hat_ignite.cli.common import CliError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real training run of the digits config (a subprocess of bin/hat-train)."""
    cwd = tmp_path_factory.mktemp("cwd")
    work_dir = tmp_path_factory.mktemp("runs") / "digits"
    proc = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, cwd=cwd, timeout=180)
    return proc, work_dir, cwd


def _metrics(work_dir: pathlib.Path) -> dict:
    return json.loads((work_dir / "metrics.json").read_text())


def test_train_reaches_095_validation_accuracy_and_writes_its_outputs(trained):
    proc, work_dir, cwd = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    record = _metrics(work_dir)["float_train"]
    assert record["epochs"] == 20 and record["steps"] == 20 * 23
    assert record["val_metrics"]["accuracy"] >= 0.95
    assert record["best"]["metric"] == "accuracy" and record["best"]["value"] >= record["val_metrics"]["accuracy"]
    ckpt_dir = work_dir / "checkpoints"
    assert (ckpt_dir / "float-checkpoint-best.pth.tar").is_file()
    assert (ckpt_dir / "float-checkpoint-last.pth.tar").is_file()
    assert record["best"]["checkpoint"] == str(ckpt_dir / "float-checkpoint-best.pth.tar")
    log = (work_dir / "float_train.log").read_text()
    assert "seed: 0" in log and "Validation Epoch[0] accuracy=" in log  # early lines are kept too
    assert f"work_dir = '{work_dir}'" in (work_dir / "float_train_config.py").read_text()
    assert not (cwd / "work_dirs").exists()  # every path followed --work-dir


def test_predict_on_the_saved_checkpoints_reproduces_the_accuracy(trained, capsys):
    proc, work_dir, cwd = trained
    assert proc.returncode == 0
    best = run_tool("hat-predict", DIGITS_CONFIG, "--work-dir", work_dir, cwd=cwd, timeout=120)
    assert best.returncode == 0, best.stderr[-3000:]
    metrics = _metrics(work_dir)
    assert metrics["float_predict"]["metrics"]["accuracy"] == pytest.approx(metrics["float_train"]["best"]["value"], abs=1e-6)
    assert metrics["float_predict"]["checkpoint"] == metrics["float_train"]["best"]["checkpoint"]
    last = str(work_dir / "checkpoints" / "float-checkpoint-last.pth.tar")
    assert predict_cli.main([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--ckpt", last]) == 0
    metrics = _metrics(work_dir)
    assert metrics["float_predict"]["metrics"]["accuracy"] == pytest.approx(
        metrics["float_train"]["val_metrics"]["accuracy"], abs=1e-6
    )
    assert (work_dir / "float_predict.log").is_file() and "float_train" in metrics  # both entries kept


def test_predict_loads_a_partial_ckpt_with_the_flags_its_refusal_names(trained, tmp_path, capsys):
    import torch

    proc, work_dir, cwd = trained
    assert proc.returncode == 0
    saved = torch.load(work_dir / "checkpoints" / "float-checkpoint-last.pth.tar", weights_only=True)
    weights = dict(saved["state_dict"])
    head = sorted(weights)[-1]
    partial = tmp_path / "partial.pth.tar"
    torch.save({"state_dict": {k: v for k, v in weights.items() if k != head}, "extra_thing": 1}, partial)
    with pytest.raises(CliError) as info:
        predict_cli._predict([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--ckpt", str(partial)])
    assert "1 model key(s) missing from the checkpoint" in str(info.value)
    assert str(info.value).endswith("From the command line: --ckpt-allow-miss / --ckpt-ignore-extra.")
    assert predict_cli.main([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--ckpt", str(partial),
                             "--ckpt-allow-miss"]) == 0


def test_help_lists_the_stages_of_the_given_config(tmp_path, capsys):
    proc = run_tool("hat-train", DIGITS_CONFIG, "--help", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"Stages in {DIGITS_CONFIG}: float (float_trainer, float_predictor); calibration (calibration_trainer); "
        f"qat (qat_trainer); int_infer (int_infer_predictor)." in " ".join(proc.stdout.split())
    )
    assert "--dry-run" in proc.stdout and "--opts" in proc.stdout
    assert predict_cli.main(["--help"]) == 0
    assert "give CONFIG before --help" in " ".join(capsys.readouterr().out.split())


def test_dry_run_prints_the_engine_and_handlers_and_creates_nothing(tmp_path):
    work_dir = tmp_path / "dry"
    proc = run_tool("hat-train", DIGITS_CONFIG, "--dry-run", "--work-dir", work_dir, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("float_trainer: hat_ignite.engine.trainer.Trainer\n")
    assert "model: MLPClassifier (9,610 parameters)" in out and "optimizer: SGD" in out
    events = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and line.strip().endswith(("):", ": -"))]
    assert events == ["LOOP_BEGIN", "EPOCH_BEGIN", "STEP_BEGIN", "BATCH_BEGIN", "FORWARD_BEGIN", "FORWARD_END",
                      "BACKWARD_BEGIN", "BACKWARD_END", "OPTIMIZER_STEP_BEGIN", "BATCH_END", "STEP_END", "EPOCH_END",
                      "LOOP_END"]
    epoch_end = out.split("EPOCH_END (on_epoch_end):\n", 1)[1].split("  LOOP_END", 1)[0]
    order = [line.split(". ", 1)[1].split(".")[0] for line in epoch_end.strip().splitlines()]
    assert order[-3:] == ["Validation", "Checkpoint", "TensorBoard"]  # config-list order: validate, save, log
    # only the LR updater is on STEP_BEGIN: its epoch warmup moves every step, as HAT's does
    assert "  STEP_BEGIN (on_step_begin):\n    1. StepDecayLrUpdater.on_step_begin\n  BATCH_BEGIN" in out
    assert not work_dir.exists()


def test_dry_run_of_a_ddp_stage_builds_it_in_its_launched_process(tmp_path):
    """HAT configs mostly use type="distributed_data_parallel_trainer": --dry-run checks them too."""
    config = tmp_path / "ddp.py"
    config.write_text(DIGITS_CONFIG.read_text().replace('type="Trainer"', 'type="distributed_data_parallel_trainer"', 1))
    work_dir = tmp_path / "dry"
    proc = run_tool("hat-train", "-c", config, "-s", "float", "--dry-run", "--work-dir", work_dir, cwd=tmp_path,
                    timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("float_trainer: hat_ignite.engine.ddp_trainer.DistributedDataParallelTrainer\n") == 1
    assert "model: DistributedDataParallel (9,610 parameters)" in proc.stdout
    assert "  LOOP_END (on_loop_end):" in proc.stdout and not work_dir.exists()


def test_an_error_in_a_ddp_stage_is_one_paragraph(tmp_path):
    """A DDP stage is built in its launched process: its errors still read as one paragraph."""
    config = tmp_path / "ddp.py"
    config.write_text(DIGITS_CONFIG.read_text().replace('type="Trainer"', 'type="distributed_data_parallel_trainer"', 1))
    proc = run_tool("hat-train", "-c", config, "--work-dir", tmp_path / "wd", "--opts",
                    "float_trainer.model.hiden_features", "3", cwd=tmp_path, timeout=180)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"hat-train: error: {config}: float_trainer.model: cannot build MLPClassifier: got an "
                      f"unexpected keyword argument 'hiden_features'. Did you mean 'hidden_features' for "
                      f"'hiden_features'? (run again with --debug for the traceback)"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ProcessRaisedException" not in proc.stderr


def test_unknown_stage_lists_the_existing_ones(tmp_path, capsys):
    work_dir = tmp_path / "wd"
    assert train_cli.main([str(DIGITS_CONFIG), "--stage", "int8", "--work-dir", str(work_dir)]) == 1
    err = capsys.readouterr().err
    assert "has no 'int8_trainer': stage 'int8' has no trainer. Stages with a trainer: float, calibration, qat." in err
    assert not work_dir.exists()


@pytest.mark.parametrize("tool, args, message", [
    (train_cli, ["{missing}"], "does not exist. Pass the path of a .py config file"),
    (train_cli, ["{broken}"], "broken.py:2: syntax error"),
    (train_cli, ["{config}", "--opts", "float_trainer.num_epochs"], "--opts item 'float_trainer.num_epochs' has no value"),
    (train_cli, ["{config}", "--opts", "float_trainer.callbacks[0].type=StatMonitor"],
     "float_trainer.callbacks[0].type: unknown type 'StatMonitor'"),
    (train_cli, ["{config}", "--opts", "float_trainer.num_epochs=-1"],
     "float_trainer: building Trainer failed: num_epochs must be a non-negative integer"),
    (train_cli, ["{config}", "--opts", "model.hiden_features=3"],
     "float_trainer.model: cannot build MLPClassifier: got an unexpected keyword argument 'hiden_features'"),
    (predict_cli, ["{config}", "--ckpt", "{missing}"], "is not a file. Train the stage first"),
    (predict_cli, ["{config}", "--ckpt", "{garbage}"], "Cannot load checkpoint"),
])
def test_bad_input_exits_non_zero_with_one_clear_error_and_no_work_dir(tmp_path, capsys, tool, args, message):
    (tmp_path / "broken.py").write_text("a = 1\nb = dict(\n")
    (tmp_path / "garbage.pth.tar").write_bytes(b"not a checkpoint")
    paths = {"missing": tmp_path / "missing.py", "broken": tmp_path / "broken.py", "config": DIGITS_CONFIG,
             "garbage": tmp_path / "garbage.pth.tar"}
    work_dir = tmp_path / "wd"
    argv = [a.format(**paths) for a in args] + ["--work-dir", str(work_dir)]
    assert tool.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err
    assert len(re.findall(r"^hat-(?:train|predict): error: ", err, re.M)) == 1
    assert "Traceback" not in err and "--debug" in err
    assert not work_dir.exists()


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert train_cli.main([str(tmp_path / "missing.py"), "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_a_failed_run_leaves_a_work_dir_the_next_run_can_use(tmp_path, capsys):
    work_dir = tmp_path / "wd"
    work_dir.mkdir()
    (work_dir / "notes.txt").write_text("kept")
    assert train_cli.main([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--opts", "float_trainer.type=Trainr"]) == 1
    assert "Did you mean 'Trainer'" in capsys.readouterr().err
    assert (work_dir / "notes.txt").read_text() == "kept"  # a work dir that existed is left alone

    torch.manual_seed(0)
    diverge = ["float_trainer.optimizer.lr=1e12", "float_trainer.optimizer.momentum=0.0"]
    assert train_cli.main([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--opts", *diverge]) == 1
    err = capsys.readouterr().err
    assert "training float_trainer failed at epoch_id=" in err and "NonFiniteLossError" in err

    quick = ["float_trainer.num_epochs=2"]
    assert train_cli.main([str(DIGITS_CONFIG), "--work-dir", str(work_dir), "--opts", *quick]) == 0
    record = _metrics(work_dir)["float_train"]
    assert record["epochs"] == 2 and record["val_metrics"]["accuracy"] > 0.8


def test_sigterm_stops_at_a_step_boundary_and_keeps_a_last_checkpoint(tmp_path):
    work_dir = tmp_path / "wd"
    cmd = [sys.executable, str(ROOT / "bin" / "hat-train"), str(DIGITS_CONFIG), "--work-dir", str(work_dir),
           "--opts", "float_trainer.num_epochs=100000"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # wait until training runs
            if "Epoch[1] last loss=" in line:
                break
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=time_limit(60))
    finally:
        proc.kill()
    assert proc.returncode == 143
    record = _metrics(work_dir)["float_train"]
    assert record["stopped_by_signal"] is True and 2 <= record["epochs"] < 100000
    from hat_ignite.callbacks.checkpoint_io import load_checkpoint

    last = load_checkpoint(work_dir / "checkpoints" / "float-checkpoint-last.pth.tar")
    assert last["progress"]["iteration"] == record["steps"]
