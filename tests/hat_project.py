"""A small HAT project written to a folder, run through ``hat-train`` / ``hat-predict`` as HAT's tools run it.

:func:`write_hat_project` writes, under ``root``:

* ``my_project/`` — the user's own package (on ``PYTHONPATH``, as a HAT project is): ``models.py``
  registers, through ``from hat.registry import OBJECT_REGISTRY``, a conv-BN classifier whose
  ``forward`` computes its loss in training and returns predictions in eval (HAT's convention), a
  uint8 image dataset (8x8 sklearn digits) and a batch transform turning the images into floats;
* ``configs/classification/conv_bn.py`` — a config importing ``hat.*`` with HAT's stages and
  HAT's converter lines as HAT's configs write them: ``float_trainer``
  (``distributed_data_parallel_trainer``), ``calibration_trainer`` (``Calibrator``),
  ``qat_trainer`` (with ``convert_submodule_list=["backbone", "head"]``), ``int_infer_trainer`` (export only:
  no data, ``num_epochs=0``) and ``int_infer_predictor``.

Every stage is a few steps, with ``num_workers=2`` data loaders. :func:`project_env` is the
environment to run the tools in.
"""

from __future__ import annotations

import os
import pathlib
import textwrap

from conftest import ROOT

__all__ = ["write_hat_project", "project_env", "CONFIG_PATH"]

#: The config's path relative to the project root.
CONFIG_PATH = pathlib.Path("configs") / "classification" / "conv_bn.py"

MODELS = '''
"""The user's model, dataset and batch transform, registered with HAT's registry."""

import torch
from torch import nn

from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class DigitsUint8(torch.utils.data.Dataset):
    """The first ``length`` 8x8 digits as ``dict(img=uint8 [1, 8, 8], labels=int)``, as an image pipeline gives them."""

    def __init__(self, start=0, length=128):
        from sklearn.datasets import load_digits  # here, not at import: the DataLoader workers import this module

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x[start:start + length] * 15.9, dtype=torch.float32).round().to(torch.uint8)
        self.img = x.view(-1, 1, 8, 8)
        self.labels = torch.tensor(y[start:start + length])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return dict(img=self.img[i], labels=self.labels[i])


@OBJECT_REGISTRY.register
class ImgToFloat:
    """A batch transform: uint8 images to floats in [0, 1] (HAT configs convert on the device)."""

    def __call__(self, batch):
        return dict(batch, img=batch["img"].float() / 255.0)


@OBJECT_REGISTRY.register
class ConvBNClassifier(nn.Module):
    """HAT's model convention: ``(preds, losses)`` in training, ``preds`` in eval."""

    def __init__(self, num_classes=10, width=8):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * 16, num_classes))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, data):
        preds = self.head(self.backbone(data["img"]))
        if not self.training:
            return preds
        return preds, dict(ce=self.loss(preds, data["labels"]))
'''

CONFIG = '''
import os

import torch

import my_project.models  # noqa: F401  (registers the model, the dataset and the transform)
from hat.engine.processors.loss_collector import collect_loss_by_index
from hat.utils.config import ConfigVersion

VERSION = ConfigVersion.v2
task_name = "conv_bn_digits"
seed = 0
ckpt_dir = "./tmp_models/%s" % task_name
training_step = os.environ.get("HAT_TRAINING_STEP", "float")
batch_size_per_gpu = 32
qat_mode = "fuse_bn"
convert_mode = "fx"

model = dict(type="ConvBNClassifier", num_classes=10, width=8)


def loader(start, length, shuffle):
    return dict(
        type=torch.utils.data.DataLoader,
        dataset=dict(type="DigitsUint8", start=start, length=length),
        sampler=dict(type=torch.utils.data.DistributedSampler),
        batch_size=batch_size_per_gpu,
        shuffle=shuffle,
        num_workers=2,
        persistent_workers=False,
    )


data_loader = loader(0, 512, True)  # 8 steps per process and epoch
val_data_loader = loader(1000, 128, False)
batch_processor = dict(
    type="MultiBatchProcessor",
    need_grad_update=True,
    batch_transforms=[dict(type="ImgToFloat")],
    loss_collector=collect_loss_by_index(1),
)
val_batch_processor = dict(
    type="MultiBatchProcessor",
    need_grad_update=False,
    batch_transforms=[dict(type="ImgToFloat")],
)


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


val_callback = dict(
    type="Validation",
    data_loader=val_data_loader,
    batch_processor=val_batch_processor,
    callbacks=[dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=0,
                    log_prefix="Validation " + task_name)],
)
ckpt_callback = dict(
    type="Checkpoint",
    save_dir=ckpt_dir,
    name_prefix=training_step + "-",
    strict_match=True,
    mode="max",
)

float_trainer = dict(
    type="distributed_data_parallel_trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.1, momentum=0.9),
    batch_processor=batch_processor,
    num_epochs=1,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=0),
        val_callback,
        ckpt_callback,
    ],
    val_metrics=[dict(type="Accuracy")],
)

calibration_data_loader = dict(data_loader)
del calibration_data_loader["sampler"]
calibration_trainer = dict(
    type="Calibrator",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        converters=[
            dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "float-checkpoint-best.pth.tar")),
            dict(type="Float2Calibration", convert_mode=convert_mode),
        ],
    ),
    data_loader=calibration_data_loader,
    batch_processor=val_batch_processor,
    num_steps=4,
    device=None,
    callbacks=[val_callback, ckpt_callback],
    val_metrics=[dict(type="Accuracy")],
    log_interval=1,
)

qat_trainer = dict(
    type="distributed_data_parallel_trainer",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode=qat_mode,
        qconfig_params=dict(
            activation_qat_qkwargs=dict(averaging_constant=0.0),
            weight_qat_qkwargs=dict(averaging_constant=1.0),
        ),
        converters=[
            dict(type="Float2QAT", convert_mode=convert_mode),
            dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "calibration-checkpoint-best.pth.tar")),
        ],
    ),
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.01, momentum=0.9),
    batch_processor=batch_processor,
    num_epochs=1,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=0),
        val_callback,
        ckpt_callback,
    ],
    val_metrics=[dict(type="Accuracy")],
    convert_submodule_list=["backbone", "head"],
)

int_infer_pipeline = dict(
    type="ModelConvertPipeline",
    qat_mode=qat_mode,
    converters=[
        dict(type="Float2QAT", convert_mode=convert_mode),
        dict(type="LoadCheckpoint", checkpoint_path=os.path.join(ckpt_dir, "qat-checkpoint-best.pth.tar")),
        dict(type="QAT2Quantize", convert_mode=convert_mode),
    ],
)
# just for saving the int_infer checkpoint: no data, no training
int_infer_trainer = dict(
    type="Trainer",
    model=model,
    model_convert_pipeline=int_infer_pipeline,
    data_loader=None,
    optimizer=None,
    batch_processor=None,
    num_epochs=0,
    device=None,
    callbacks=[ckpt_callback],
)

int_infer_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=int_infer_pipeline,
    data_loader=[val_data_loader],
    batch_processor=val_batch_processor,
    device=None,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=0,
                    log_prefix="Predict " + task_name)],
)
'''


def write_hat_project(root: pathlib.Path) -> pathlib.Path:
    """Write the project under ``root``; return the config's path."""
    package = root / "my_project"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(textwrap.dedent(MODELS).lstrip())
    config = root / CONFIG_PATH
    config.parent.mkdir(parents=True)
    config.write_text(textwrap.dedent(CONFIG).lstrip())
    return config


def project_env(root: pathlib.Path, stage: str) -> dict[str, str]:
    """The environment HAT's tools run a stage in: the project and hat-ignite importable, the stage named."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HAT_TRAINING_STEP")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT)])
    env["HAT_TRAINING_STEP"] = stage
    env["OMP_NUM_THREADS"] = "1"
    return env
