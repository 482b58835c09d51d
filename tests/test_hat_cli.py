"""HAT's config style and HAT's command line, run unchanged by hat-train / hat-predict."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT, run_tool, time_limit

from hat_ignite.cli import train as train_cli
from hat_ignite.cli.common import make_parser, parse_arguments
from hat_ignite.hat_alias import hat_alias_installed

# A model file next to the config, imported relatively; it registers its class through hat.registry.
MY_MODELS = '''
import torch
from torch import nn

from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class HatStyleNet(nn.Module):
    """HAT's model convention: (preds, losses) in training, preds in eval."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, data):
        logits = self.net(data["img"])
        if not self.training:
            return logits
        return logits, {"ce": nn.functional.cross_entropy(logits, data["labels"])}
'''

# A callback in a package next to the config, imported absolutely; registered with register_module.
MY_CALLBACKS = '''
import json
import os

from hat.callbacks import CallbackMixin
from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register_module
class StepCounter(CallbackMixin):
    def __init__(self, out_file):
        self.out_file = out_file
        self.steps = 0

    def on_step_end(self, **kwargs):
        self.steps += 1

    def on_loop_end(self, model=None, **kwargs):
        with open(self.out_file, "w") as f:
            json.dump({"steps": self.steps, "model": type(model).__name__}, f)
'''

HAT_CONFIG = '''
import os

import torch

import my_pkg.callbacks  # noqa: F401  (registers StepCounter)
from hat.engine.processors.loss_collector import collect_loss_by_index
from hat.utils.config import ConfigVersion

from .my_models import HatStyleNet  # noqa: F401  (registers HatStyleNet)

VERSION = ConfigVersion.v2
task_name = "hat_style_digits"
seed = 0
ckpt_dir = "./tmp_models/%s" % task_name
device_ids = [0]
cudnn_benchmark = True
batch_size_per_gpu = 64

model = dict(type="HatStyleNet", hidden=32)
data_loader = dict(
    type=torch.utils.data.DataLoader,
    dataset=dict(type="DigitsDataset", split="train"),
    sampler=dict(type=torch.utils.data.DistributedSampler),
    batch_size=batch_size_per_gpu,
    shuffle=True,
    num_workers=0,
)
training_step = os.environ.get("HAT_TRAINING_STEP", "float")


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


batch_processor = dict(
    type="MultiBatchProcessor",
    need_grad_update=True,
    loss_collector=collect_loss_by_index(1),
)
float_trainer = dict(
    type="distributed_data_parallel_trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type=torch.optim.SGD, params={"weight": dict(weight_decay=4e-5)}, lr=0.1, momentum=0.9),
    batch_processor=batch_processor,
    num_epochs=30,
    device=None,
    callbacks=[
        dict(type="StatsMonitor", log_freq=0),
        dict(type="StepCounter", out_file=os.path.join(os.environ.get("HAT_TEST_OUT", "."), "steps.json")),
        dict(type="Checkpoint", save_dir=ckpt_dir, name_prefix=training_step + "-"),
    ],
)

val_data_loader = dict(
    type=torch.utils.data.DataLoader,
    dataset=dict(type="DigitsDataset", split="val"),
    sampler=dict(type=torch.utils.data.DistributedSampler, shuffle=False),
    batch_size=batch_size_per_gpu,
    shuffle=False,
)
float_predictor = dict(
    type="Predictor",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline",
        qat_mode="fuse_bn",
        qconfig_params=dict(activation_calibration_observer="min_max", activation_calibration_qkwargs=dict(averaging_constant=0.01)),
        converters=[
            dict(
                type="LoadCheckpoint",
                checkpoint_path=os.path.join(ckpt_dir, "float-checkpoint-last.pth.tar"),
                allow_miss=False,
                ignore_extra=False,
                ignore_tensor_shape=False,
                verbose=True,
            ),
        ],
    ),
    data_loader=[val_data_loader],
    batch_processor=dict(type="MultiBatchProcessor", need_grad_update=False),
    device=None,
    metrics=[dict(type="Accuracy")],
    callbacks=[dict(type="MetricUpdater", metric_update_func=update_metric, step_log_freq=0, log_prefix="Predict ")],
)
'''


def _write_project(root: pathlib.Path) -> pathlib.Path:
    """A HAT-style project: configs/cfg.py, configs/my_models.py, configs/my_pkg/callbacks.py."""
    configs = root / "configs"
    (configs / "my_pkg").mkdir(parents=True)
    (configs / "my_models.py").write_text(textwrap.dedent(MY_MODELS))
    (configs / "my_pkg" / "__init__.py").write_text("")
    (configs / "my_pkg" / "callbacks.py").write_text(textwrap.dedent(MY_CALLBACKS))
    config = configs / "hat_style.py"
    config.write_text(textwrap.dedent(HAT_CONFIG))
    return config


def test_hat_command_line_trains_a_hat_style_config(tmp_path):
    """``hat-train -c FILE -s float --opts float_trainer.num_epochs 1``, in a subprocess."""
    config = _write_project(tmp_path)
    work_dir = tmp_path / "work"
    env = {"PATH": "/usr/bin:/bin", "HAT_TEST_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), "-c", str(config), "-s", "float",
         "--work-dir", str(work_dir), "--opts", "float_trainer.num_epochs", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(300), env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "hat.* imports are served by hat-ignite" in proc.stderr
    record = json.loads((work_dir / "metrics.json").read_text())["float_train"]
    steps_per_epoch = -(-1437 // 64)  # the digits train split, every sample once per epoch (one replica)
    assert record["epochs"] == 1 and record["steps"] == steps_per_epoch
    assert record["last_loss"] < 2.0  # cross entropy of 10 classes starts at ~2.3 and falls
    counted = json.loads((tmp_path / "steps.json").read_text())
    assert counted["steps"] == steps_per_epoch
    assert counted["model"] == "DistributedDataParallel"  # built as HAT's distributed_data_parallel_trainer
    resolved = (work_dir / "float_train_config.py").read_text()
    assert "# --opts float_trainer.num_epochs 1" in resolved and "'num_epochs': 1" in resolved
    assert (tmp_path / "tmp_models" / "hat_style_digits" / "float-checkpoint-last.pth.tar").is_file()

    # HAT's tools/predict.py spelling; the predictor loads the checkpoint through its convert pipeline
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-predict"), "--stage", "float", "--config", str(config),
         "--work-dir", str(work_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(300), env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    predicted = json.loads((work_dir / "metrics.json").read_text())["float_predict"]
    assert predicted["steps"] == -(-360 // 64) and predicted["metrics"]["accuracy"] > 0.5


DIGITS_TRAINER = '''
from hat.engine.processors.loss_collector import collect_loss_by_index

num_epochs = 9
float_trainer = dict(
    type="Trainer",
    model=dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10),
    data_loader=dict(
        type="torch.utils.data.DataLoader", dataset=dict(type="DigitsDataset", split="val"), batch_size=120,
    ),
    optimizer=dict(type="torch.optim.SGD", lr=0.1),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True, loss_collector=collect_loss_by_index(0)),
    device=None,
    num_epochs=num_epochs,
    num_steps=None,
)
'''


def test_cfg_options_and_mixed_override_forms_in_process(tmp_path, write_config):
    config = write_config(DIGITS_TRAINER)
    work_dir = tmp_path / "w"
    argv = ["--config", str(config), "--stage", "float", "--work-dir", str(work_dir),
            "--cfg-options", "float_trainer.num_epochs", "2", "float_trainer.optimizer.lr=0.05",
            "--opts", "float_trainer.stop_by", "'step'", "float_trainer.num_steps=4"]
    assert not hat_alias_installed()
    assert train_cli.main(argv) == 0
    assert not hat_alias_installed()  # the command removes the import hook it installed
    record = json.loads((work_dir / "metrics.json").read_text())["float_train"]
    assert record["steps"] == 4 and record["epochs"] == 2  # stop_by step: 4 steps of 3 per epoch
    resolved = (work_dir / "float_train_config.py").read_text()
    assert "'lr': 0.05" in resolved and "'stop_by': 'step'" in resolved


@pytest.mark.parametrize("argv, expected", [
    (["-c", "a.py", "-s", "qat"], ("a.py", "qat", [])),
    (["a.py", "--stage", "qat", "--opts", "x.y", "1", "z=2"], ("a.py", "qat", ["x.y", "1", "z=2"])),
    (["--config", "a.py", "--cfg-options", "x", "[1, 2]", "--opts", "y=3"], ("a.py", "float", ["x", "[1, 2]", "y=3"])),
    (["a.py", "-c", "a.py"], ("a.py", "float", [])),
    (["a.py", "--opts", "lr", "-0.5", "-s", "qat"], ("a.py", "qat", ["lr", "-0.5"])),
])
def test_hat_spellings_of_the_arguments(argv, expected):
    args = parse_arguments(make_parser("hat-train", "d", argv), argv)
    assert (args.config, args.stage, args.opts) == expected


@pytest.mark.parametrize("argv, message", [
    ([], "the config is required: give CONFIG or -c/--config CONFIG"),
    (["a.py", "-c", "b.py"], "two configs given: a.py and -c/--config b.py"),
])
def test_config_argument_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_arguments(make_parser("hat-train", "d", argv), argv)
    assert message in capsys.readouterr().err


def test_help_shows_both_spellings_and_lists_stages_of_a_hat_config(tmp_path):
    config = _write_project(tmp_path)
    proc = run_tool("hat-train", "-c", config, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "-c CONFIG, --config CONFIG" in out and "-s STAGE, --stage STAGE" in out
    assert "--cfg-options" in out and "KEY VALUE" in out and "--no-hat-alias" in out
    assert "Stages in " in out and "float (float_trainer, float_predictor)" in out


def test_without_the_alias_a_hat_import_names_the_flag(tmp_path, write_config):
    config = write_config(DIGITS_TRAINER)
    proc = run_tool("hat-train", config, "--no-hat-alias", "--work-dir", tmp_path / "w", cwd=tmp_path)
    assert proc.returncode == 1
    assert "No module named 'hat'. The config (or a module it imports) imports from HAT" in proc.stderr
    assert "unless --no-hat-alias" in proc.stderr and not (tmp_path / "w").exists()


def test_hat_environment_and_opts_overwrite_false(tmp_path, write_config, monkeypatch):
    """As HAT's tools: the stage and --pipeline-test reach the config through the environment."""
    from hat_ignite.cli.common import export_hat_environment, load_config

    for var in ("HAT_TRAINING_STEP", "HAT_INFERENCE_STEP", "HAT_PIPELINE_TEST"):
        monkeypatch.delenv(var, raising=False)
    config = write_config(
        """
        import os
        training_step = os.environ.get("HAT_TRAINING_STEP", "float")
        pipeline_test = bool(int(os.environ.get("HAT_PIPELINE_TEST", "0")))
        num_epochs = 30 if not pipeline_test else 1
        model = dict(width=8)
        """
    )
    argv = ["-c", str(config), "-s", "qat", "--pipeline-test", "--opts-overwrite", "False",
            "--opts", "model.width", "16", "model.depth", "3"]
    args = parse_arguments(make_parser("hat-train", "d", argv), argv)
    export_hat_environment(args)
    cfg, _ = load_config(args.config, args.opts, str(tmp_path / "w"), hat_alias=False, overwrite=args.opts_overwrite)
    assert (cfg["training_step"], cfg["pipeline_test"], cfg["num_epochs"]) == ("qat", True, 1)
    assert cfg["model"] == {"width": 8, "depth": 3}  # an existing key is kept, a new one is added
    assert cfg.overrides == ["model.depth 3"]


def test_the_config_device_ids_pick_the_gpus_as_in_hat(write_config, caplog):
    from hat_ignite.cli.common import CliError
    from hat_ignite.cli.distributed import device_ids_of
    from hat_ignite.config import Config

    cfg = Config({"device_ids": [0, 1]}, filename="c.py")
    assert device_ids_of(cfg, None, None, cuda_available=True) == [0, 1]
    assert device_ids_of(cfg, [2], None, cuda_available=True) == [2]  # --device-ids wins
    assert device_ids_of(cfg, None, 2, cuda_available=True) is None  # --nproc asks for CPU processes
    assert device_ids_of(Config({"device_ids": -1}), None, None, cuda_available=True) is None
    assert device_ids_of(Config({"device_ids": 3}), None, None, cuda_available=True) == [3]
    with caplog.at_level("WARNING"):
        assert device_ids_of(cfg, None, None, cuda_available=False) is None
    assert "c.py: device_ids=[0, 1] ignored: no CUDA device here, running on the CPU" in caplog.text
    with pytest.raises(CliError, match=r"c\.py: device_ids must be a list of GPU ids such as \[0, 1\]"):
        device_ids_of(Config({"device_ids": "0,1"}, filename="c.py"), None, None, cuda_available=True)
