"""A small ResNet on the shipped 8x8 digits as 16x16 images: float -> calibration -> QAT -> int8.

Written the way HAT configs are: stage dicts ``float_trainer``, ``calibration_trainer``,
``qat_trainer``, ``int_infer_predictor``, each stage's ``model_convert_pipeline`` loading the
previous stage's best checkpoint, HAT's quantization arguments (``qat_mode``, ``qconfig_params``,
``convert_mode``), and HAT's import lines: ``hat-train``/``hat-predict`` serve ``hat.*`` from
hat-ignite (see docs/hat-migration.md).

    python bin/hat-train   configs/classification/digits_resnet.py --stage float
    python bin/hat-train   configs/classification/digits_resnet.py --stage calibration
    python bin/hat-train   configs/classification/digits_resnet.py --stage qat
    python bin/hat-predict configs/classification/digits_resnet.py --stage int_infer

The float stage reaches 99.7 % validation accuracy (360 held-out images) in 16 epochs: about
8 s on two idle CPU cores (minutes when they are heavily shared); the int8 model keeps it
(bench/convnet_report.py measures every stage). The model is a conv-BN-ReLU stem and three
residual stages (16, 32, 64 channels), trained with random affine augmentation of each training
batch.
"""

import os

import torch
from digits_resnet_model import DigitsResNet  # noqa: F401  (registers the model type below)
from hat.engine.processors.loss_collector import collect_loss_by_index
from hat.utils.config import ConfigVersion

VERSION = ConfigVersion.v2

task_name = "digits_resnet"
seed = 0
work_dir = os.path.join(".", "work_dirs", task_name)
ckpt_dir = os.path.join(work_dir, "checkpoints")
device = None  # CPU; an int is a CUDA device id
num_epochs = 16
batch_size = 64
image_size = 16
# HAT's quantization settings, used by every stage's ModelConvertPipeline
qat_mode = "fuse_bn"  # BatchNorm folded into the convs before calibration / QAT
convert_mode = "fx"  # HAT's modes ("eager", "fx", "jit", "jit-strip") all map to torch.export

# -------------------------- model --------------------------
# In training the model returns ({"cls_loss": loss}, logits), in eval the logits.
model = dict(type="DigitsResNet", num_classes=10, widths=(16, 32, 64), blocks=1)  # digits_resnet_model.py

# -------------------------- data --------------------------
train_dataset = dict(type="DigitsImageDataset", split="train", val_ratio=0.2, seed=0, size=image_size)
val_dataset = dict(type="DigitsImageDataset", split="val", val_ratio=0.2, seed=0, size=image_size)
data_loader = dict(
    type=torch.utils.data.DataLoader, dataset=train_dataset, batch_size=batch_size, shuffle=True,
    num_workers=0, drop_last=True,
)
val_data_loader = dict(
    type=torch.utils.data.DataLoader, dataset=val_dataset, batch_size=256, shuffle=False, num_workers=0,
)

# -------------------------- batch processors --------------------------
# Augmentation on the batch tensor, training only: one random rotation / zoom / shift per image.
batch_processor = dict(
    type="BasicBatchProcessor",
    need_grad_update=True,
    batch_transforms=[dict(type="RandomAffineBatch", key="img", degrees=12, scale=(0.9, 1.1), translate=0.1)],
    loss_collector=collect_loss_by_index(0),
)
val_batch_processor = dict(type="BasicBatchProcessor", need_grad_update=False)


# -------------------------- callbacks --------------------------
def update_train_metrics(metrics, batch, model_outs):
    losses, logits = model_outs
    loss_show, accuracy = metrics
    loss_show.update(losses)
    accuracy.update(batch["labels"], logits)


def update_val_metrics(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


# Training metrics under their own key: "accuracy" in storage["monitor_obj"] (filled by
# Validation, monitored by Checkpoint) is always the validation accuracy.
metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_train_metrics, step_log_freq=0, epoch_log_freq=4,
    log_prefix="Train " + task_name + " ", storage_key="train_monitor_obj",
)
val_metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_val_metrics, step_log_freq=0, epoch_log_freq=1,
    log_prefix="Validation " + task_name + " ",
)
stat_callback = dict(type="StatsMonitor", log_freq=0)
val_callback = dict(
    type="Validation",
    data_loader=val_data_loader,
    batch_processor=val_batch_processor,
    callbacks=[val_metric_updater],
    val_interval=1,
    log_interval=0,
)
ckpt_callback = dict(
    type="Checkpoint",
    save_dir=ckpt_dir,
    name_prefix="float-",
    save_interval=1,
    interval_by="epoch",
    mode="max",
    monitor_metric_key="accuracy",
    keep_n=1,
)
train_metrics = [dict(type="LossShow"), dict(type="Accuracy")]
val_metrics = [dict(type="Accuracy")]

# -------------------------- step float --------------------------
float_trainer = dict(
    type="Trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(
        type=torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=5e-4, fused=True,  # NaN/Inf skip on the device
        params={r"\.bias$|\.1\.weight$": dict(weight_decay=0.0)},  # no decay on biases and BN scales
    ),
    batch_processor=batch_processor,
    device=device,
    num_epochs=num_epochs,
    callbacks=[
        stat_callback,
        dict(type="CosLrUpdater", warmup_by="epoch", warmup_len=1, step_log_interval=200),
        metric_updater,
        val_callback,
        ckpt_callback,
    ],
    train_metrics=train_metrics,
    val_metrics=val_metrics,
)

float_checkpoint = os.path.join(ckpt_dir, "float-checkpoint-best.pth.tar")
float_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[dict(type="LoadCheckpoint", checkpoint_path=float_checkpoint)],
    ),
    data_loader=val_data_loader,
    batch_processor=val_batch_processor,
    device=device,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(val_metric_updater, log_prefix="Predict " + task_name + " ")],
)

# -------------------------- int8: calibration -> qat -> int_infer --------------------------
calibration_checkpoint = os.path.join(ckpt_dir, "calibration-checkpoint-best.pth.tar")
qat_checkpoint = os.path.join(ckpt_dir, "qat-checkpoint-best.pth.tar")
int_infer_model = os.path.join(ckpt_dir, "int_infer-model.pt2")  # torch.export program, int8
calibration_steps = 10
qat_epochs = 3

calibration_data_loader = dict(data_loader, shuffle=True, drop_last=False)
# torch.export traces the network ("net": the loss stays float) on what it receives for the first
# calibration batch; any batch size works afterwards.
float2calibration = dict(
    type="Float2Calibration", convert_mode=convert_mode, example_data_loader=calibration_data_loader, modules=["net"],
)
float2qat = dict(float2calibration, type="Float2QAT")

calibration_trainer = dict(
    type="Calibrator",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        qconfig_params=dict(activation_calibration_observer="min_max"),
        converters=[dict(type="LoadCheckpoint", checkpoint_path=float_checkpoint), float2calibration],
    ),
    data_loader=calibration_data_loader,
    batch_processor=val_batch_processor,
    device=device,
    num_steps=calibration_steps,
    callbacks=[val_callback, dict(ckpt_callback, name_prefix="calibration-")],
    val_metrics=val_metrics,
)

qat_trainer = dict(
    type="Trainer",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        qconfig_params=dict(
            activation_qat_qkwargs=dict(averaging_constant=0.0),  # keep the calibrated activation ranges
            weight_qat_qkwargs=dict(averaging_constant=1.0),  # weight ranges follow the weights
        ),
        converters=[float2qat, dict(type="LoadCheckpoint", checkpoint_path=calibration_checkpoint)],
    ),
    data_loader=data_loader,
    optimizer=dict(float_trainer["optimizer"], lr=0.005),
    batch_processor=batch_processor,
    device=device,
    num_epochs=qat_epochs,
    callbacks=[
        stat_callback,
        dict(type="CosLrUpdater", step_log_interval=200),
        metric_updater,
        val_callback,
        dict(ckpt_callback, name_prefix="qat-"),
    ],
    train_metrics=train_metrics,
    val_metrics=val_metrics,
)

int_infer_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        converters=[
            float2qat,
            dict(type="LoadCheckpoint", checkpoint_path=qat_checkpoint),
            dict(type="QAT2Quantize", convert_mode=convert_mode),
        ],
    ),
    data_loader=val_data_loader,
    batch_processor=val_batch_processor,
    device=device,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(val_metric_updater, log_prefix="Int8 " + task_name + " ")],
)
