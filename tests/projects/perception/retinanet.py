"""A RetinaNet-shaped detector through every stage, written as HAT's detection configs are.

A dict of losses in training, a dict metric, ``warmup_len=0.3`` epochs, a collate keeping each
image's boxes, the head's convs run on every FPN level, and HAT's export-only ``int_infer``
stage with a ``deploy_model`` that has no targets or losses.

    hat-train -c retinanet.py -s float | calibration | qat | int_infer
    hat-predict -c retinanet.py -s int_infer
"""

import os

import torch
from perception_models import collate_boxes  # beside this config: registers the model, data and metric
from hat.utils.config import ConfigVersion

VERSION = ConfigVersion.v2
task_name = "shapes_retinanet"
training_step = os.environ.get("HAT_TRAINING_STEP", "float")
seed = 0
ckpt_dir = "./tmp_models/%s" % task_name
qat_mode = "fuse_bn"
convert_mode = "fx"

model = dict(type="ShapeRetinaNet", num_classes=4, width=16, channels=32)
deploy_model = dict(model, deploy=True)
deploy_inputs = dict(img=torch.randn((1, 1, 64, 64)))


def loader(length, seed, shuffle, batch_size=32):
    return dict(
        type=torch.utils.data.DataLoader, dataset=dict(type="ShapeBoxes", length=length, seed=seed),
        batch_size=batch_size, shuffle=shuffle, num_workers=0, collate_fn=collate_boxes,
    )


data_loader = loader(800, 0, True)
val_data_loader = loader(200, 1, False, batch_size=100)


def loss_collector(outputs: dict):
    return list(outputs.values())


batch_processor = dict(type="MultiBatchProcessor", need_grad_update=True, loss_collector=loss_collector)
val_batch_processor = dict(type="MultiBatchProcessor", need_grad_update=False)


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch, model_outs)


def update_loss(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(model_outs)


val_metric_updater = dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=10000,
                          epoch_log_freq=1, log_prefix="Validation " + task_name)
loss_show_update = dict(type="MetricUpdater", metric_update_func=update_loss, step_log_freq=1000,
                        epoch_log_freq=1, log_prefix="loss " + task_name)
val_callback = dict(type="Validation", data_loader=val_data_loader, batch_processor=val_batch_processor,
                    callbacks=[val_metric_updater], val_model=None)
ckpt_callback = dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix=training_step + "-", strict_match=True,
                     mode="max", monitor_metric_key="det_f1")


def checkpoint(stage):
    return os.path.join(ckpt_dir, "%s-checkpoint-best.pth.tar" % stage)


float_trainer = dict(
    type="Trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.AdamW, params={"weight": dict(weight_decay=5e-5)}, lr=0.003),
    batch_processor=batch_processor,
    num_epochs=6,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=1000),
        loss_show_update,
        dict(type="StepDecayLrUpdater", warmup_len=0.3, lr_decay_id=[5, 7], step_log_interval=1000),
        val_callback,
        ckpt_callback,
    ],
    train_metrics=dict(type="LossShow"),
    val_metrics=dict(type="DetectionF1"),
)

calibration_trainer = dict(
    type="Calibrator",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        qconfig_params=dict(activation_calibration_observer="mix"),  # as HAT's detection configs
        converters=[
            dict(type="LoadCheckpoint", checkpoint_path=checkpoint("float")),
            dict(type="Float2Calibration", convert_mode=convert_mode),
        ],
    ),
    data_loader=loader(800, 0, False, batch_size=64),
    batch_processor=val_batch_processor,
    num_steps=6,
    device=None,
    callbacks=[val_callback, ckpt_callback],
    val_metrics=dict(type="DetectionF1"),
)

qat_trainer = dict(
    type="Trainer",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        qconfig_params=dict(activation_qat_qkwargs=dict(averaging_constant=0.0)),
        converters=[
            dict(type="Float2QAT", convert_mode=convert_mode),
            dict(type="LoadCheckpoint", checkpoint_path=checkpoint("calibration")),
        ],
    ),
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.AdamW, params={"weight": dict(weight_decay=5e-5)}, lr=1e-4),
    batch_processor=batch_processor,
    stop_by="step",
    num_steps=10,
    device=None,
    callbacks=[dict(type="StatsMonitor", log_freq=1000), loss_show_update, val_callback, ckpt_callback],
    train_metrics=dict(type="LossShow"),
    val_metrics=dict(type="DetectionF1"),
)

int_infer_pipeline = dict(
    type="ModelConvertPipeline",
    qat_mode=qat_mode,
    converters=[
        dict(type="Float2QAT", convert_mode=convert_mode),
        dict(type="LoadCheckpoint", checkpoint_path=checkpoint("qat")),
        dict(type="QAT2Quantize", convert_mode=convert_mode),
    ],
)
# just for saving the int_infer checkpoint and the traced deploy model: no data, no training
int_infer_trainer = dict(
    type="Trainer",
    model=deploy_model,
    model_convert_pipeline=int_infer_pipeline,
    data_loader=None,
    optimizer=None,
    batch_processor=None,
    num_epochs=0,
    device=None,
    callbacks=[ckpt_callback, dict(type="SaveTraced", save_dir=ckpt_dir, trace_inputs=deploy_inputs)],
)

int_infer_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=int_infer_pipeline,
    data_loader=[val_data_loader],
    batch_processor=val_batch_processor,
    device=None,
    metrics=dict(type="DetectionF1"),
    callbacks=[val_metric_updater],
)
