"""Float training of a small MLP on the 8x8 handwritten digits shipped with hat-ignite (real data, no download).

Train:    python bin/hat-train configs/classification/digits_mlp.py
Predict:  python bin/hat-predict configs/classification/digits_mlp.py
Override: python bin/hat-train configs/classification/digits_mlp.py --opts float_trainer.num_epochs=5

Reaches 97 % validation accuracy (75 % after the first epoch) in a few seconds on a CPU. The work
dir receives the log, the resolved config, the checkpoints (best by validation accuracy, and last),
metrics.json, the TensorBoard event file and float_training_curves.png.
"""

import os

task_name = "digits_mlp"
seed = 0
work_dir = os.path.join(".", "work_dirs", task_name)
ckpt_dir = os.path.join(work_dir, "checkpoints")
device = None  # CPU; an int is a CUDA device id
num_epochs = 20
batch_size = 64

model = dict(type="MLPClassifier", in_features=64, hidden_features=128, num_classes=10)

train_dataset = dict(type="DigitsDataset", split="train", val_ratio=0.2, seed=0)
val_dataset = dict(type="DigitsDataset", split="val", val_ratio=0.2, seed=0)
data_loader = dict(
    type="torch.utils.data.DataLoader", dataset=train_dataset, batch_size=batch_size, shuffle=True,
)
val_data_loader = dict(type="torch.utils.data.DataLoader", dataset=val_dataset, batch_size=256, shuffle=False)


# The model returns ({"cls_loss": loss}, logits) in training and logits in eval mode.
def update_train_metrics(metrics, batch, model_outs):
    losses, logits = model_outs
    loss_show, accuracy = metrics
    loss_show.update(losses)
    accuracy.update(batch["labels"], logits)


def update_val_metrics(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


# The training metrics are stored under their own key so that "accuracy" in storage["monitor_obj"]
# (which Validation fills and Checkpoint monitors) is always the validation accuracy.
train_metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_train_metrics, step_log_freq=0, epoch_log_freq=5,
    log_prefix="Train ", storage_key="train_monitor_obj",
)
val_metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_val_metrics, step_log_freq=0, epoch_log_freq=1,
    log_prefix="Validation ",
)
val_metrics = [dict(type="Accuracy")]
val_callback = dict(
    type="Validation",
    data_loader=val_data_loader,
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    callbacks=[val_metric_updater],
    val_interval=1,
    log_interval=0,
)

stat_callback = dict(type="StatsMonitor", log_freq=0)
# Warm up linearly over the first epoch, step by step as in HAT (0 at step 0, then lr * step /
# len(data_loader)), then decay the lr by 10x at epochs 12 and 17. The lr is logged at each epoch
# begin, and every step_log_interval steps while it changes per step.
lr_callback = dict(
    type="StepDecayLrUpdater", warmup_by="epoch", warmup_len=1, lr_decay_id=[12, 17], lr_decay_factor=0.1,
    step_log_interval=100,
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
# Losses, lr and train metrics every 5 steps, validation accuracy every epoch, into an event file
# (tensorboard --logdir work_dirs/digits_mlp/tensorboard); hat-train also draws them into
# work_dir/<stage>_training_curves.png at the end (redraw with hat-curves WORK_DIR --stage float).
tb_callback = dict(type="TensorBoard", save_dir=os.path.join(work_dir, "tensorboard"), overwrite=True, update_freq=5)

float_trainer = dict(
    type="Trainer",
    model=model,
    data_loader=data_loader,
    # params: parameters whose name matches a regex get that group's options (no decay on biases)
    optimizer=dict(
        type="torch.optim.SGD", lr=0.1, momentum=0.9, weight_decay=1e-4, params={r"\.bias$": dict(weight_decay=0.0)},
        fused=True,  # skips a NaN/Inf update on the device: no host read per step
    ),
    batch_processor=dict(
        type="BasicBatchProcessor", need_grad_update=True,
        loss_collector=dict(type="collect_loss_by_index", indexes=0),
    ),
    device=device,
    num_epochs=num_epochs,
    callbacks=[stat_callback, lr_callback, train_metric_updater, val_callback, ckpt_callback, tb_callback],
    train_metrics=[dict(type="LossShow"), dict(type="Accuracy")],
    val_metrics=val_metrics,
)

float_checkpoint = os.path.join(ckpt_dir, "float-checkpoint-best.pth.tar")
float_predictor = dict(
    type="Predictor",
    model=model,
    data_loader=val_data_loader,
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    device=device,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(val_metric_updater, log_prefix="Predict ")],
)

# -- int8: float -> calibration -> qat (optional) -> int_infer -------------------------------
# Each stage loads the previous stage's best checkpoint (LoadCheckpoint) and records its lineage
# (input/output hashes, resolved config) in work_dir/lineage.json:
#   hat-train   CONFIG --stage calibration   # Calibrator: observers see calibration_steps batches
#   hat-train   CONFIG --stage qat           # short quantization-aware training
#   hat-predict CONFIG --stage int_infer     # convert to int8, evaluate, save int_infer_model
# To quantize the calibration model without QAT, point int_infer's LoadCheckpoint at it:
#   --opts "int_infer_predictor.model_convert_pipeline.converters[1].checkpoint_path='<calibration_checkpoint>'"
calibration_checkpoint = os.path.join(ckpt_dir, "calibration-checkpoint-best.pth.tar")
qat_checkpoint = os.path.join(ckpt_dir, "qat-checkpoint-best.pth.tar")
int_infer_model = os.path.join(ckpt_dir, "int_infer-model.pt2")  # torch.export program, int8
calibration_steps = 10
qat_epochs = 3

calibration_data_loader = dict(
    type="torch.utils.data.DataLoader", dataset=train_dataset, batch_size=batch_size, shuffle=True,
)
# MLPClassifier computes its loss in forward: only its network ("net") is quantized; the traced
# inputs are those "net" receives on the first calibration batch (any batch size works later).
quant_prepare = dict(type="Float2Calibration", example_data_loader=calibration_data_loader, modules=["net"])

calibration_trainer = dict(
    type="Calibrator",
    model=model,
    data_loader=calibration_data_loader,
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    device=device,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[dict(type="LoadCheckpoint", checkpoint_path=float_checkpoint), quant_prepare],
    ),
    num_steps=calibration_steps,
    callbacks=[val_callback, dict(ckpt_callback, name_prefix="calibration-")],
    val_metrics=val_metrics,
)

qat_trainer = dict(
    float_trainer,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[
            quant_prepare,
            dict(type="LoadCheckpoint", checkpoint_path=calibration_checkpoint),
            dict(type="Calibration2QAT"),
        ],
    ),
    optimizer=dict(float_trainer["optimizer"], lr=0.002),
    num_epochs=qat_epochs,
    callbacks=[
        stat_callback, train_metric_updater, val_callback, dict(ckpt_callback, name_prefix="qat-"),
    ],
)

int_infer_predictor = dict(
    float_predictor,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[
            quant_prepare,
            dict(type="LoadCheckpoint", checkpoint_path=qat_checkpoint),
            dict(type="QAT2Quantize"),
        ],
    ),
    callbacks=[dict(val_metric_updater, log_prefix="Int8 ")],
)
