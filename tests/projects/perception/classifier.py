"""A torchvision-shaped classifier through every stage, written as HAT configs are.

``PERCEPTION_NET`` chooses the net (``resnet18``, ``resnet50``, ``mobilenet_v2``; see
``perception_models.ImageClassifier``); the digits are 32x32 three-channel images.

    hat-train -c classifier.py -s float | calibration | qat
    hat-predict -c classifier.py -s int_infer
"""

import os

import torch
import perception_models  # noqa: F401  (beside this config: registers the model and the transform)
from hat.engine.processors.loss_collector import collect_loss_by_index
from hat.utils.config import ConfigVersion

VERSION = ConfigVersion.v2
net = os.environ.get("PERCEPTION_NET", "resnet18")
task_name = "digits_%s" % net
training_step = os.environ.get("HAT_TRAINING_STEP", "float")
seed = 0
ckpt_dir = "./tmp_models/%s" % task_name
qat_mode = "fuse_bn"
convert_mode = "fx"

model = dict(type="ImageClassifier", net=net, width=16)


def loader(split, batch_size, shuffle):
    return dict(
        type=torch.utils.data.DataLoader,
        dataset=dict(type="DigitsImageDataset", split=split, size=32),
        batch_size=batch_size, shuffle=shuffle, num_workers=0,
    )


data_loader = loader("train", 64, True)
val_data_loader = loader("val", 360, False)
batch_processor = dict(
    type="MultiBatchProcessor", need_grad_update=True, batch_transforms=[dict(type="ThreeChannels")],
    loss_collector=collect_loss_by_index(1),
)
val_batch_processor = dict(type="MultiBatchProcessor", need_grad_update=False, batch_transforms=[dict(type="ThreeChannels")])


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


val_callback = dict(
    type="Validation", data_loader=val_data_loader, batch_processor=val_batch_processor,
    callbacks=[dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=0,
                    log_prefix="Validation " + task_name)],
)
ckpt_callback = dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix=training_step + "-", strict_match=True, mode="max")


def checkpoint(stage):
    return os.path.join(ckpt_dir, "%s-checkpoint-best.pth.tar" % stage)


float_trainer = dict(
    type="Trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.1, momentum=0.9),
    batch_processor=batch_processor,
    num_epochs=3,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=0),
        dict(type="CosLrUpdater", warmup_len=1, warmup_by="epoch", step_log_interval=1000),
        val_callback,
        ckpt_callback,
    ],
    val_metrics=[dict(type="Accuracy")],
)

calibration_trainer = dict(
    type="Calibrator",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        converters=[
            dict(type="LoadCheckpoint", checkpoint_path=checkpoint("float")),
            dict(type="Float2Calibration", convert_mode=convert_mode),
        ],
    ),
    data_loader=data_loader,
    batch_processor=val_batch_processor,
    num_steps=4,
    device=None,
    callbacks=[val_callback, ckpt_callback],
    val_metrics=[dict(type="Accuracy")],
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
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.001, momentum=0.9),
    batch_processor=batch_processor,
    stop_by="step",
    num_steps=8,
    device=None,
    callbacks=[dict(type="StatsMonitor", log_freq=0), val_callback, ckpt_callback],
    val_metrics=[dict(type="Accuracy")],
)

int_infer_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        converters=[
            dict(type="Float2QAT", convert_mode=convert_mode),
            dict(type="LoadCheckpoint", checkpoint_path=checkpoint("qat")),
            dict(type="QAT2Quantize", convert_mode=convert_mode),
        ],
    ),
    data_loader=[val_data_loader],
    batch_processor=val_batch_processor,
    device=None,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=0, log_prefix="Predict " + task_name)],
)
