"""Two stages of a HAT project (float, then calibration) through hat-train: each keeps its own numbers,
history and curves, with HAT's habits: MetricUpdaters carrying their own ``metrics=[...]``, one
TensorBoard folder ``ckpt_dir/tensorboard`` for every stage, ``log_interval=calibration_step / 10``
and a calibration loader shorter than ``num_steps``."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_tool

from hat_ignite.visualize.event_file import event_files, read_scalars

HAT_PROJECT = '''
import os

import torch

from hat.engine.processors.loss_collector import collect_loss_by_index

task_name = "two_stages"
seed = 0
ckpt_dir = os.path.join(@ROOT@, "tmp_models", task_name)
tensorboard_log_path = os.path.join(ckpt_dir, "tensorboard")
calibration_step = 5

model = dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10)
train_dataset = dict(type="DigitsDataset", split="train", val_ratio=0.2, seed=0)
val_dataset = dict(type="DigitsDataset", split="val", val_ratio=0.2, seed=0)
data_loader = dict(type=torch.utils.data.DataLoader, dataset=train_dataset, batch_size=128, shuffle=True)
val_data_loader = dict(type=torch.utils.data.DataLoader, dataset=val_dataset, batch_size=128, shuffle=False)
# 360 digits in 2 batches: calibration_step = 5 runs 3 epochs, as HAT does
calibration_data_loader = dict(type=torch.utils.data.DataLoader, dataset=val_dataset, batch_size=256)


def update_train(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs[1])


def update_val(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


def val_callback(prefix):
    return dict(
        type="Validation",
        data_loader=val_data_loader,
        batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
        callbacks=[dict(type="MetricUpdater", metrics=[dict(type="Accuracy")], metric_update_func=update_val,
                        step_log_freq=0, epoch_log_freq=1, log_prefix="Validation " + prefix)],
        val_interval=1,
        log_interval=0,
    )


tb_callback = dict(type="TensorBoard", save_dir=tensorboard_log_path, update_freq=2)
float_trainer = dict(
    type="Trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, lr=0.1, momentum=0.9),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True, loss_collector=collect_loss_by_index(0)),
    device=None,
    num_epochs=2,
    callbacks=[
        dict(type="MetricUpdater", metrics=[dict(type="Accuracy")], metric_update_func=update_train,
             step_log_freq=0, epoch_log_freq=1, log_prefix="Train", storage_key="train_monitor_obj"),
        val_callback("float"),
        dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix="float-"),
        tb_callback,
    ],
    val_metrics=[dict(type="Accuracy")],  # never updated: the updaters carry their own
)
float_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(type="ModelConvertPipeline", converters=[
        dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "float-checkpoint-last.pth.tar")),
    ]),
    data_loader=[val_data_loader],
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    device=None,
    callbacks=[dict(type="MetricUpdater", metrics=[dict(type="Accuracy")], metric_update_func=update_val,
                    step_log_freq=0, epoch_log_freq=1, log_prefix="Predict")],
)
calibration_trainer = dict(
    type="Calibrator",
    model=model,
    data_loader=calibration_data_loader,
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[
            dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "float-checkpoint-last.pth.tar")),
            dict(type="Float2Calibration", modules=["net"]),
        ],
    ),
    num_steps=calibration_step,
    device=None,
    callbacks=[val_callback("calibration"), dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix="calibration-"),
               tb_callback],
    val_metrics=[dict(type="Accuracy")],
    log_interval=calibration_step / 10,
)
'''


def _logged(log: str, prefix: str) -> list[float]:
    """The accuracies of the ``<prefix> Epoch[n] accuracy=...`` lines of a stage's log."""
    return [float(v) for v in re.findall(rf"{prefix} Epoch\[\d+\] accuracy=(\S+)", log)]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    (root / "cfg.py").write_text(HAT_PROJECT.replace("@ROOT@", repr(str(root))))
    work_dir, board = root / "work", root / "tmp_models" / "two_stages" / "tensorboard"
    float_run = run_tool("hat-train", "-c", root / "cfg.py", "-s", "float", "--work-dir", work_dir, cwd=root,
                         timeout=300)
    assert float_run.returncode == 0, float_run.stderr[-3000:]
    after_float = {
        "history": read_scalars(board),
        "png": (work_dir / "float_training_curves.png").read_bytes(),
        "files": event_files(board),
    }
    predict_run = run_tool("hat-predict", "-c", root / "cfg.py", "-s", "float", "--work-dir", work_dir, cwd=root,
                           timeout=300)
    assert predict_run.returncode == 0, predict_run.stderr[-3000:]
    calibration_run = run_tool("hat-train", "-c", root / "cfg.py", "-s", "calibration", "--work-dir", work_dir,
                               cwd=root, timeout=300)
    assert calibration_run.returncode == 0, calibration_run.stderr[-3000:]
    return work_dir, board, after_float


def test_each_stage_reports_what_its_validation_logged(stages):
    work_dir, _, _ = stages
    record = json.loads((work_dir / "metrics.json").read_text())
    float_log = (work_dir / "float_train.log").read_text()
    calibration_log = (work_dir / "calibration_train.log").read_text()
    float_val, train = _logged(float_log, "Validation float"), _logged(float_log, "Train")
    calibration_val = _logged(calibration_log, "Validation calibration")
    assert len(float_val) == len(train) == 2 and len(calibration_val) == 3  # a validation per calibration epoch
    assert float_val[-1] > 0.5  # it learned: a real number, not the nan of the unused val_metrics
    # metrics.json holds the values the updaters logged (printed to 6 digits)
    assert record["float_train"]["val_metrics"]["accuracy"] == pytest.approx(float_val[-1], abs=5e-7)
    assert record["float_train"]["train_metrics"]["accuracy"] == pytest.approx(train[-1], abs=5e-7)
    assert record["calibration_train"]["val_metrics"]["accuracy"] == pytest.approx(calibration_val[-1], abs=5e-7)
    predicted = _logged((work_dir / "float_predict.log").read_text(), "Predict")
    assert predicted == [float_val[-1]]  # the float stage's last checkpoint on the same data
    assert record["float_predict"]["metrics"]["accuracy"] == pytest.approx(predicted[-1], abs=5e-7)
    assert "done in " in float_log and f"val accuracy={float_val[-1]:.6g}" in float_log
    assert f"val accuracy={calibration_val[-1]:.6g}" in calibration_log


def test_the_calibrator_runs_hat_epochs_and_logs_at_hat_s_float_interval(stages):
    work_dir, _, _ = stages
    record = json.loads((work_dir / "metrics.json").read_text())["calibration_train"]
    assert record["steps"] == 5 and record["epochs"] == 3
    log = (work_dir / "calibration_train.log").read_text()
    # log_interval = 5 / 10 = 0.5: HAT's step_id % 0.5 == 0 holds at every step of its 2-batch epochs
    lines = re.findall(r"hat_ignite\.engine\.Calibrator: Epoch\[(\d+)\] Step\[(\d+)\] GlobalStep\[(\d+)\]", log)
    assert [tuple(map(int, line)) for line in lines] == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3), (2, 0, 4)]


def test_stages_sharing_a_tensorboard_folder_keep_their_own_history_and_curves(stages):
    work_dir, board, after_float = stages
    assert len(event_files(board)) == 2 and event_files(board, "float") == after_float["files"]
    # the float stage's history is what it was when the float stage ended
    assert read_scalars(board, stage="float") == after_float["history"]
    assert [s for s, _ in after_float["history"]["val/accuracy"]] == [12, 24]  # steps done at each epoch end
    calibration = read_scalars(board, stage="calibration")
    assert sorted(calibration) == ["val/accuracy"]
    assert [s for s, _ in calibration["val/accuracy"]] == [2, 4, 5]  # after each calibration epoch
    # each stage has its own PNG; the calibration stage left the float one as it was
    assert (work_dir / "float_training_curves.png").read_bytes() == after_float["png"]
    assert (work_dir / "calibration_training_curves.png").stat().st_size > 5_000
    assert not (work_dir / "training_curves.png").exists()


def test_hat_curves_draws_one_stage_of_a_shared_folder(stages, tmp_path):
    _, board, _ = stages
    out = tmp_path / "calibration.png"
    proc = run_tool("hat-curves", board, "--stage", "calibration", "--out", out, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"{out} (accuracy; from {board})") and out.stat().st_size > 5_000
    # without --stage, the folder's latest stage alone (calibration: no loss or lr panels), not a splice
    proc = run_tool("hat-curves", board, "--out", tmp_path / "latest.png", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"{tmp_path / 'latest.png'} (accuracy; from {board})")
    assert "drawing the latest, 'calibration' (choose one with --stage)" in proc.stderr


def test_overwrite_and_a_resume_purge_touch_only_their_own_stage(tmp_path):
    from hat_ignite.callbacks.tensorboard_history import prepare_save_dir
    from hat_ignite.callbacks.tensorboard_scalars import StepScalars
    from hat_ignite.visualize.event_file import stage_suffix

    for stage in ("float", "calibration"):
        scalars = StepScalars(str(tmp_path), filename_suffix=stage_suffix(stage))
        for step in range(6):
            scalars.add("val/accuracy", 0.1 * step, step)
        scalars.close()
    float_history = read_scalars(tmp_path, stage="float")
    prepare_save_dir(str(tmp_path), overwrite=False, resume_step=2, stage="calibration")  # a resumed calibration
    assert [s for s, _ in read_scalars(tmp_path, stage="calibration")["val/accuracy"]] == [0, 1, 2]
    assert read_scalars(tmp_path, stage="float") == float_history
    prepare_save_dir(str(tmp_path), overwrite=True, resume_step=None, stage="calibration")  # a fresh one
    assert event_files(tmp_path, "calibration") == [] and read_scalars(tmp_path, stage="float") == float_history
