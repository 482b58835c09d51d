"""A multitask project shaped like HAT's toy multitask config, run unchanged through hat-train / hat-predict.

The project lives in a temporary folder as a HAT user's would: ``base.py`` and one config per
task (``cls_task1.py``, ``cls_task2.py``) read with ``Config.fromfile``, a ``multitask.py`` that
imports ``hat.*`` and the user's own module, which registers its model and dataset through
``hat.registry``. The model answers ``model(batch, task)`` with a tuple of namedtuples, as HAT's
GraphModel does, so the losses are found under names like ``0_task1_toy_ToyLoss``.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import textwrap

from conftest import ROOT, time_limit

TOY_MODULES = '''
import json
import os
from collections import namedtuple

import torch
from sklearn.datasets import load_digits
from torch import nn

from hat.callbacks import CallbackMixin
from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class TaskDigits(torch.utils.data.Dataset):
    """Digits as {"img", "<task>_label"}; task2's label is 9 - digit."""

    def __init__(self, label_name, start, stop, flip=False):
        x, y = load_digits(return_X_y=True)
        self.x = torch.tensor(x[start:stop] / 16.0, dtype=torch.float32)
        self.y = torch.tensor(9 - y[start:stop] if flip else y[start:stop])
        self.label_name = label_name

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"img": self.x[i], self.label_name: self.y[i]}


@OBJECT_REGISTRY.register
class ToyMultitaskNet(nn.Module):
    """A shared trunk and one head per task; ``model(batch, task)`` returns what HAT's GraphModel
    returns for one output name: a tuple holding one namedtuple of flattened outputs."""

    def __init__(self, tasks, hidden=64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(64, hidden), nn.ReLU())
        self.heads = nn.ModuleDict({t: nn.Linear(hidden, 10) for t in tasks})
        self.loss = nn.CrossEntropyLoss()

    def forward(self, batch, task):
        pred = self.heads[task](self.trunk(batch["img"]))
        label = batch[task + "_label"]
        fields = {task + "_toy_ToyLoss": self.loss(pred, label), task + "_toy_predict": pred,
                  task + "_toy_target": label}
        return (namedtuple("OrderedOutput", fields)(**fields),)


@OBJECT_REGISTRY.register
class TaskCounter(CallbackMixin):
    """Counts the sub-batches of each task (the task is the second item of a (batch, task) pair)."""

    def __init__(self, out_file):
        self.out_file = out_file
        self.counts = {}

    def on_batch_end(self, batch, **kwargs):
        data, task = batch
        self.counts.setdefault(task, []).append(len(data["img"]))

    def on_loop_end(self, **kwargs):
        runs = json.load(open(self.out_file)) if os.path.exists(self.out_file) else []
        json.dump(runs + [self.counts], open(self.out_file, "w"))
        self.counts = {}
'''

BASE = '''
import os

training_step = os.environ.get("HAT_TRAINING_STEP", "float")
out_dir = os.environ.get("HAT_TEST_OUT", ".")
'''

# One task's config; TASK, LABEL and the data ranges are filled in per task.
TASK = '''
import copy
import os

import torch

from hat.callbacks.metric_updater import update_metric_using_regex
from hat.utils.config import Config

cfg_dir = os.path.dirname(__file__)
BASE_CFG = Config.fromfile(os.path.join(cfg_dir, "base.py"))

task_name = "TASK"
label_name = "TASK_label"
batch_size_per_gpu = 40

data_loader = dict(
    type=torch.utils.data.DataLoader,
    dataset=dict(type="TaskDigits", label_name=label_name, start=0, stop=TRAIN_STOP, flip=FLIP),
    sampler=dict(type=torch.utils.data.DistributedSampler),
    batch_size=batch_size_per_gpu,
    shuffle=True,
    num_workers=0,
)
val_data_loader = dict(
    type=torch.utils.data.DataLoader,
    dataset=dict(type="TaskDigits", label_name=label_name, start=1500, stop=VAL_STOP, flip=FLIP),
    sampler=dict(type=torch.utils.data.DistributedSampler, shuffle=False),
    batch_size=60,
    shuffle=False,
    num_workers=0,
)

label_pattern = "^.*%s.*" % label_name
pred_pattern = "^.*%s.*predict" % task_name
metric_updater = dict(
    type="MetricUpdater",
    metrics=[dict(type="Accuracy"), dict(type="TopKAccuracy", top_k=5)],
    metric_update_func=update_metric_using_regex(
        per_metric_patterns=[
            dict(label_pattern=label_pattern, pred_pattern=pred_pattern),
            dict(label_pattern=label_pattern, pred_pattern=pred_pattern),
        ]
    ),
    filter_condition=lambda x: x[1] == task_name,
    step_log_freq=10,
    epoch_log_freq=1,
    log_prefix=task_name,
)
val_metric_updater = copy.deepcopy(metric_updater)
val_metric_updater["log_prefix"] = "Validation " + task_name
'''

MULTITASK = '''
import os

import torch

from hat.core.task_sampler import TaskSampler
from hat.engine.processors.loss_collector import collect_loss_by_regex
from hat.utils.config import Config, ConfigVersion
from my_pkg.toy_modules import *  # noqa: F403,F401

cfg_dir = os.path.dirname(__file__)
BASE_CFG = Config.fromfile(os.path.join(cfg_dir, "base.py"))
training_step = BASE_CFG.training_step
VERSION = ConfigVersion.v2
task_name = "toy_multitask"
ckpt_dir = "./tmp_models/%s" % task_name
seed = 0

CONFIGS = [
    Config.fromfile(os.path.join(cfg_dir, "cls_task1.py")),
    Config.fromfile(os.path.join(cfg_dir, "cls_task2.py")),
]
model = dict(type="ToyMultitaskNet", tasks=[i.task_name for i in CONFIGS])

task_sampler = TaskSampler(
    task_config={i.task_name: dict(sampling_factor=1) for i in CONFIGS},
    method="sample_all",
)
data_loader = dict(
    type="MultitaskLoader",
    loaders={i.task_name: i.data_loader for i in CONFIGS},
    task_sampler=task_sampler,
    mode="max_size",
    return_task=True,
)
val_data_loader = dict(
    type="MultitaskLoader",
    loaders={i.task_name: i.val_data_loader for i in CONFIGS},
    task_sampler=task_sampler,
    mode="validation",
    return_task=True,
)
batch_processor = dict(
    type="MultiBatchProcessor",
    delay_sync=False,
    grad_accumulation_step=1,
    need_grad_update=True,
    loss_collector=collect_loss_by_regex("^.*loss.*"),
)
val_batch_processor = dict(
    type="MultiBatchProcessor",
    need_grad_update=False,
    loss_collector=collect_loss_by_regex("^.*loss.*"),
)
metric_updaters = [i.metric_updater for i in CONFIGS]
val_metric_updaters = [i.val_metric_updater for i in CONFIGS]
counter = dict(type="TaskCounter", out_file=os.path.join(BASE_CFG.out_dir, "val_counts.json"))

float_trainer = dict(
    type="distributed_data_parallel_trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.2, momentum=0.9),
    batch_processor=batch_processor,
    num_epochs=3,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=0),
        dict(type="TaskCounter", out_file=os.path.join(BASE_CFG.out_dir, "train_counts.json")),
        dict(
            type="Validation",
            data_loader=val_data_loader,
            batch_processor=val_batch_processor,
            callbacks=val_metric_updaters + [counter],
            val_model=None,
        ),
        dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix=training_step + "-", strict_match=True),
    ]
    + metric_updaters,
)
float_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        converters=[
            dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "float-checkpoint-last.pth.tar")),
        ],
    ),
    data_loader=[val_data_loader],
    batch_processor=val_batch_processor,
    device=None,
    callbacks=val_metric_updaters + [counter],
    log_interval=50,
)
'''

# task1: 240 training digits (6 batches of 40), 120 validation digits (2 batches of 60);
# task2: 160 training digits (4 batches), 60 validation digits (1 batch).
TASKS = {"task1": dict(TRAIN_STOP="240", VAL_STOP="1620", FLIP="False"),
         "task2": dict(TRAIN_STOP="160", VAL_STOP="1560", FLIP="True")}


def _write_project(root: pathlib.Path) -> pathlib.Path:
    configs = root / "configs" / "toy_multitask"
    configs.mkdir(parents=True)
    (root / "my_pkg").mkdir()
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "toy_modules.py").write_text(textwrap.dedent(TOY_MODULES))
    (configs / "base.py").write_text(BASE)
    for name, fill in TASKS.items():
        text = TASK.replace("TASK", name)
        for key, value in fill.items():
            text = text.replace(key, value)
        (configs / f"cls_{name}.py").write_text(text)
    (configs / "multitask.py").write_text(MULTITASK)
    return configs / "multitask.py"


def _run(tool: str, config: pathlib.Path, root: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HAT_TEST_OUT": str(root), "PYTHONPATH": f"{ROOT}:{root}"}
    return subprocess.run([sys.executable, str(ROOT / "bin" / tool), "-c", str(config), "-s", "float",
                           "--work-dir", str(root / "work"), *args],
                          cwd=root, capture_output=True, text=True, timeout=time_limit(300), env=env)


def _accuracies(log: str, prefix: str) -> dict[str, float]:
    found = re.findall(rf"{prefix}(task\d) Epoch\[\d+\] accuracy=([0-9.e-]+) top_k_accuracy=([0-9.e-]+)", log)
    return {task: float(acc) for task, acc, _ in found}  # the last line of each task wins


def test_hat_toy_multitask_shaped_project_trains_and_predicts(tmp_path):
    config = _write_project(tmp_path)
    proc = _run("hat-train", config, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((tmp_path / "work" / "metrics.json").read_text())["float_train"]
    # max_size over (6, 4) batches: 6 steps an epoch, task2's loader starting again for the last 2
    assert record["epochs"] == 3 and record["steps"] == 18
    train_counts = json.loads((tmp_path / "train_counts.json").read_text())
    assert train_counts == [{"task1": [40] * 18, "task2": [40] * 18}]
    # validation mode: each task's validation set once; task2 (1 batch) sits out the 2nd step
    val_counts = json.loads((tmp_path / "val_counts.json").read_text())
    assert val_counts == [{"task1": [60, 60], "task2": [60]}] * 3
    train_acc = _accuracies(proc.stderr, "")
    val_acc = _accuracies(proc.stderr, "Validation ")
    assert set(train_acc) == set(val_acc) == {"task1", "task2"}, proc.stderr[-3000:]
    assert min(val_acc.values()) > 0.5, val_acc  # chance: 0.1; each head learnt its own labels

    proc = _run("hat-predict", config, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _accuracies(proc.stderr, "Validation ") == val_acc  # the last checkpoint, the same val data
    assert json.loads((tmp_path / "val_counts.json").read_text())[-1] == {"task1": [60, 60], "task2": [60]}
