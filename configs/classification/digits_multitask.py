"""Multitask training on the 8x8 digits: digit class (10-way) and digit parity (even/odd).

One shared MLP trunk, one head per task, one data loader and one loss per task. Each step a
TaskSampler picks the tasks whose batches the MultiBatchProcessor forwards and backwards before
the single optimizer update; with delay_sync=True, DDP all-reduces the gradients once per step.
GradScale scales the parity task's gradient into the shared trunk.

Train (1 process):  python bin/hat-train configs/classification/digits_multitask.py
Train (2 CPU procs): python bin/hat-train configs/classification/digits_multitask.py --nproc 2
Under torchrun:      torchrun --nproc-per-node 2 bin/hat-train configs/classification/digits_multitask.py

The data loaders' batch size is per process (batch_size_per_gpu, as in HAT configs): two processes
train with a global batch twice as large. Both heads reach well above chance (10 % and 50 %) in a
few epochs on a CPU.
"""

import os

task_name = "digits_multitask"
seed = 0
work_dir = os.path.join(".", "work_dirs", task_name)
ckpt_dir = os.path.join(work_dir, "checkpoints")
device = None  # CPU; hat-train --device-ids / --nproc set it per process
num_epochs = 8
batch_size_per_gpu = 32
tasks = dict(digits=10, parity=2)

model = dict(type="MultiTaskMLP", tasks=tasks, in_features=64, hidden_features=128)


def task_loader(dataset_type, split, shuffle, batch_size):
    return dict(
        type="torch.utils.data.DataLoader",
        dataset=dict(type=dataset_type, split=split, val_ratio=0.2, seed=0),
        batch_size=batch_size,
        shuffle=shuffle,
    )


# Every step trains both tasks, digits first. "sample_one" alternates them, "sample_random"
# draws one by weight; every rank draws the same tasks (the sampler is seeded).
task_sampler = dict(type="TaskSampler", task_config=dict(digits=1, parity=1), method="sample_all")
data_loader = dict(
    type="MultitaskLoader",
    loaders=dict(
        digits=task_loader("DigitsDataset", "train", True, batch_size_per_gpu),
        parity=task_loader("DigitsParityDataset", "train", True, batch_size_per_gpu),
    ),
    task_sampler=task_sampler,
    mode="max_size",  # an epoch: the longer task loader once; the shorter one starts again
    return_task=True,  # each step: ((digits_batch, "digits"), (parity_batch, "parity"))
)
val_data_loader = dict(
    type="MultitaskLoader",
    loaders=dict(
        digits=task_loader("DigitsDataset", "val", False, 256),
        parity=task_loader("DigitsParityDataset", "val", False, 256),
    ),
    mode="validation",  # each task's validation set read once
    return_task=True,
)


# Each sub-batch is a (batch, task) pair, batch = {"img", "labels"}; the model, called as
# model(batch, task), returns ({f"{task}_loss"}, {task: logits}) in training and {task: logits} in
# eval mode. Metrics are per task: [digits, parity].
def _update_task_metrics(metrics, batch, logits):
    data, task = batch
    dict(zip(tasks, metrics))[task].update(data["labels"], logits[task])


def update_train_metrics(metrics, batch, model_outs):
    losses, logits = model_outs
    metrics[0].update(losses)
    _update_task_metrics(metrics[1:], batch, logits)


def update_val_metrics(metrics, batch, model_outs):
    _update_task_metrics(metrics, batch, model_outs)


train_metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_train_metrics, step_log_freq=0, epoch_log_freq=1,
    log_prefix="Train ", storage_key="train_monitor_obj",
)
val_metric_updater = dict(
    type="MetricUpdater", metric_update_func=update_val_metrics, step_log_freq=0, epoch_log_freq=1,
    log_prefix="Validation ",
)
val_metrics = [dict(type="Accuracy", name="digits_accuracy"), dict(type="Accuracy", name="parity_accuracy")]
val_callback = dict(
    type="Validation",
    data_loader=val_data_loader,
    batch_processor=dict(type="MultiBatchProcessor", need_grad_update=False),
    callbacks=[val_metric_updater],
    val_interval=1,
    log_interval=0,
)
lr_callback = dict(type="StepDecayLrUpdater", warmup_by="epoch", warmup_len=1, lr_decay_id=[6], lr_decay_factor=0.1)
# The parity task is easy: its gradient into the shared trunk is halved, and its head trains at
# full rate. Each entry applies to the batches of its task only (HAT's GradScale).
grad_scale_callback = dict(
    type="GradScale",
    module_and_scale=[("trunk", 0.5, "parity"), ("heads.parity", 1.0, "parity")],
    clip_grad_norm=None,
)
ckpt_callback = dict(
    type="Checkpoint",
    save_dir=ckpt_dir,
    name_prefix="float-",
    save_interval=1,
    interval_by="epoch",
    mode="max",
    monitor_metric_key="digits_accuracy",
    keep_n=1,
)

float_trainer = dict(
    type="Trainer",  # run in several processes (--nproc / --device-ids / torchrun), it trains as DDP
    model=model,
    data_loader=data_loader,
    optimizer=dict(type="torch.optim.SGD", lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True),
    batch_processor=dict(
        type="MultiBatchProcessor", need_grad_update=True, delay_sync=True,
        loss_collector=dict(type="collect_loss_by_index", indexes=0),
    ),
    device=device,
    num_epochs=num_epochs,
    callbacks=[grad_scale_callback, lr_callback, train_metric_updater, val_callback, ckpt_callback],
    train_metrics=[
        dict(type="LossShow"), dict(type="Accuracy", name="digits_accuracy"), dict(type="Accuracy", name="parity_accuracy"),
    ],
    val_metrics=val_metrics,
)

float_predictor = dict(
    type="Predictor",
    model=model,
    data_loader=val_data_loader,
    batch_processor=dict(type="MultiBatchProcessor", need_grad_update=False),
    device=device,
    metrics=val_metrics,
    callbacks=[dict(val_metric_updater, log_prefix="Predict ")],
)
float_checkpoint = os.path.join(ckpt_dir, "float-checkpoint-best.pth.tar")
