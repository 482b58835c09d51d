"""HAT arguments of the loops and callbacks: each does what HAT's does, on real training.

``resume_dataloader``, ``LoadCheckpoint(ignore_tensor_shape=...)``, ``StatsMonitor(log_profiler=...)``,
``Validation(use_ema_model=...)``, the export-only stage (``batch_processor=None, num_epochs=0``) and
the HAT arguments we cannot honour, which are refused by name. ``compiler`` is in test_compile.py.
"""

from __future__ import annotations

import logging

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.callbacks.ema import ExponentialMovingAverage
from hat_ignite.callbacks.save_traced import SaveTraced
from hat_ignite.callbacks.stats_monitor import StatsMonitor
from hat_ignite.callbacks.validation import Validation
from hat_ignite.engine import BasicBatchProcessor, Calibrator, Trainer, collect_loss_by_index
from hat_ignite.errors import CheckpointError
from hat_ignite.profiler import SimpleProfiler
from hat_ignite.registry import build_from_cfg
from conftest import time_limit

X, Y = load_digits(return_X_y=True)


def digits_loader(n: int = 200, batch_size: int = 40) -> DataLoader:
    ds = TensorDataset(torch.tensor(X[:n] / 16.0, dtype=torch.float32), torch.tensor(Y[:n]), torch.arange(n))
    return DataLoader(ds, batch_size=batch_size, shuffle=False)


class DigitNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, num_classes)

    def forward(self, x, y, index=None):
        logits = self.head(self.backbone(x))
        return nn.functional.cross_entropy(logits, y), logits


class SeenSamples(CallbackMixin):
    """Records the sample indices of each step's batch, and the epoch of each step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[int]]] = []

    def on_step_end(self, batch, epoch_id, **kwargs):
        self.steps.append((epoch_id, batch[2].tolist()))


def trainer(callbacks=(), num_steps: int | None = None, num_epochs: int | None = 2, pipeline=None, **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = DigitNet()
    return Trainer(
        model=model, data_loader=digits_loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, stop_by="step" if num_steps is not None else "epoch", num_steps=num_steps,
        num_epochs=None if num_steps is not None else num_epochs, callbacks=list(callbacks),
        model_convert_pipeline=pipeline, **kwargs,
    )


# -- resume_dataloader ------------------------------------------------------------------------
@pytest.mark.parametrize("resume_dataloader", [None, True, False])
def test_resume_dataloader_continues_or_restarts_the_epochs_data(tmp_path, resume_dataloader):
    """5 batches per epoch; a checkpoint after step 2 of epoch 0; the resumed run goes on to step 8."""
    trainer([Checkpoint(save_dir=str(tmp_path), interval_by="step", save_interval=1)], num_steps=2).fit()
    seen = SeenSamples()
    resumed = trainer(
        [seen], num_steps=8, pipeline=[LoadCheckpoint(str(tmp_path / "checkpoint-last.pth.tar"))],
        resume_optimizer=True, resume_epoch_or_step=True, resume_dataloader=resume_dataloader,
    )
    resumed.fit()
    batches = [list(range(i, i + 40)) for i in range(0, 200, 40)]
    if resume_dataloader is False:
        # HAT without resume_dataloader: the loader starts a fresh pass; the epoch still ends
        # after its 5th step, so epoch 0 gets the first 3 batches of that pass
        expected = [(0, b) for b in batches[:3]] + [(1, b) for b in batches[:3]]
    else:
        # the epoch's data goes on exactly where the checkpoint was written
        expected = [(0, b) for b in batches[2:]] + [(1, b) for b in batches[:3]]
    assert seen.steps == expected
    assert resumed.state.iteration == 8


def test_resume_dataloader_must_be_a_bool():
    with pytest.raises(TypeError, match="resume_dataloader must be None, True or False"):
        trainer(resume_dataloader="yes")


# -- LoadCheckpoint(ignore_tensor_shape) ------------------------------------------------------
def _saved(tmp_path, model: nn.Module, name: str = "src.pth.tar") -> str:
    return atomic_save(with_content_hash({"state_dict": model.state_dict()}), str(tmp_path / name))


def test_ignore_tensor_shape_loads_the_backbone_and_keeps_the_new_head(tmp_path, caplog):
    torch.manual_seed(1)
    path = _saved(tmp_path, DigitNet(num_classes=10))
    source = torch.load(path, weights_only=True)["state_dict"]
    torch.manual_seed(2)
    model = DigitNet(num_classes=3)
    head_before = {k: v.clone() for k, v in model.head.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"2 shape mismatch.*head\.weight.*ignore_tensor_shape=True"):
        LoadCheckpoint(path)(DigitNet(num_classes=3))
    with caplog.at_level(logging.WARNING, logger="hat_ignite.checkpoint.restore"):
        LoadCheckpoint(path, ignore_tensor_shape=True)(model)
    assert torch.equal(model.backbone[0].weight, source["backbone.0.weight"])
    assert torch.equal(model.backbone[0].bias, source["backbone.0.bias"])
    assert all(torch.equal(model.head.state_dict()[k], v) for k, v in head_before.items())
    assert "2 tensor(s) of another shape skipped" in caplog.text and "head.weight: checkpoint (10, 32)" in caplog.text


def test_ignore_tensor_shape_combines_with_allow_miss_and_ignore_extra(tmp_path):
    class Wider(DigitNet):
        def __init__(self) -> None:
            super().__init__(num_classes=4)
            self.extra = nn.Linear(2, 2)

    path = _saved(tmp_path, Wider())  # head of another shape + a key the target lacks
    target = DigitNet(num_classes=10)
    with pytest.raises(CheckpointError, match="checkpoint key\\(s\\) the model does not have \\[extra.weight"):
        LoadCheckpoint(path, ignore_tensor_shape=True)(target)
    LoadCheckpoint(path, ignore_tensor_shape=True, ignore_extra=True)(target)
    del_backbone = {k: v for k, v in DigitNet(num_classes=4).state_dict().items() if not k.startswith("backbone.0.w")}
    path2 = atomic_save(with_content_hash({"state_dict": del_backbone}), str(tmp_path / "miss.pth.tar"))
    with pytest.raises(CheckpointError, match="missing from the checkpoint \\[backbone.0.weight"):
        LoadCheckpoint(path2, ignore_tensor_shape=True)(DigitNet())
    LoadCheckpoint(path2, ignore_tensor_shape=True, allow_miss=True)(DigitNet())


def test_load_checkpoint_with_no_path_loads_nothing_and_tracking_is_refused():
    model = DigitNet()
    before = model.head.weight.clone()
    assert LoadCheckpoint(None)(model) is model and torch.equal(model.head.weight, before)
    with pytest.raises(ValueError, match="enable_tracking=True.*AIDI"):
        LoadCheckpoint("x.pth.tar", enable_tracking=True)


# -- StatsMonitor(log_profiler) ---------------------------------------------------------------
def test_log_profiler_logs_the_most_costly_sections(caplog):
    monitor = StatsMonitor(log_freq=2, log_profiler=True)
    loop = trainer([monitor], num_epochs=1)
    assert isinstance(loop.profiler, SimpleProfiler)  # the loop had none: the monitor gave it one
    with caplog.at_level(logging.INFO, logger="hat_ignite.callbacks.stats_monitor"):
        stats = loop.fit().storage["stats"]
    top = stats["profiler_top"]
    assert len(top) == 3 and all(isinstance(n, str) and s > 0 for n, s in top)
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    assert top[0][0] in {r["name"] for r in loop.profiler.results[:3]}  # among the run's biggest at the end
    lines = [r.getMessage() for r in caplog.records if "most time so far" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("Epoch[0] Step[1] most time so far: ")
    assert top[0][0] in lines[-1]


def test_log_profiler_uses_the_loops_own_profiler_and_warns_without_running_totals(caplog):
    own = SimpleProfiler(log=False)
    loop = trainer([StatsMonitor(log_freq=5, log_profiler=True)], num_epochs=1, profiler=own)
    assert loop.profiler is own
    assert len(loop.fit().storage["stats"]["profiler_top"]) == 3

    class Silent:  # a profiler object that keeps no running section times
        pass

    loop = trainer([StatsMonitor(log_freq=5, log_profiler=True)], num_epochs=1, profiler=Silent())
    with caplog.at_level(logging.WARNING, logger="hat_ignite.callbacks.stats_monitor"):
        stats = loop.fit().storage["stats"]
    assert "profiler_top" not in stats and "keeps no running section times" in caplog.text
    quiet = trainer([StatsMonitor(log_freq=5)], num_epochs=1)
    assert quiet.profiler is None and "profiler_top" not in quiet.fit().storage["stats"]


# -- Validation(use_ema_model) ----------------------------------------------------------------
@pytest.mark.parametrize("use_ema_model", [True, False])
def test_validation_use_ema_model_chooses_the_validated_weights(use_ema_model):
    validated = []

    class Grab(CallbackMixin):
        def on_loop_begin(self, model, **kwargs):
            validated.append({k: v.clone() for k, v in model.state_dict().items()})

    val = Validation(data_loader=digits_loader(80), batch_processor=BasicBatchProcessor(need_grad_update=False),
                     callbacks=[Grab()], val_on_train_end=False, use_ema_model=use_ema_model, log_interval=0)
    loop = trainer([ExponentialMovingAverage(decay=0.5), val], num_epochs=1)
    loop.fit()
    chosen = loop.ema_model if use_ema_model else loop.model
    other = loop.model if use_ema_model else loop.ema_model
    assert all(torch.equal(v, chosen.state_dict()[k]) for k, v in validated[0].items())
    assert not torch.equal(validated[0]["head.weight"], other.state_dict()["head.weight"])


# -- export-only stage ------------------------------------------------------------------------
def test_export_only_stage_runs_the_pipeline_and_the_loop_hooks(tmp_path):
    torch.manual_seed(3)
    path = _saved(tmp_path, DigitNet())
    hooks = []

    class Hooks(CallbackMixin):
        def on_loop_begin(self, model, **kwargs):
            hooks.append(("loop_begin", model.training))

        def on_epoch_begin(self, **kwargs):
            hooks.append("epoch_begin")

        def on_loop_end(self, **kwargs):
            hooks.append("loop_end")

    converted = []

    def mark(model):
        converted.append(type(model).__name__)
        return model

    stage = Trainer(
        model=dict(type=f"{__name__}.DigitNet"), data_loader=None, optimizer=None, batch_processor=None,
        num_epochs=0, device=None, model_convert_pipeline=[LoadCheckpoint(path), mark],
        callbacks=[Hooks(), SaveTraced(save_dir=str(tmp_path / "deploy"),
                                       trace_inputs=(torch.randn(2, 64), torch.tensor([0, 1])))],
    )
    stage.fit()
    assert converted == ["DigitNet"] and hooks == [("loop_begin", True), "loop_end"]
    assert torch.equal(stage.model.head.weight, torch.load(path, weights_only=True)["state_dict"]["head.weight"])
    (saved_pt,) = (tmp_path / "deploy").glob("deploy-checkpoint-last-*.pt")
    traced = torch.jit.load(str(saved_pt))
    x, y = torch.randn(3, 64), torch.tensor([1, 2, 3])
    torch.testing.assert_close(traced(x, y)[1], stage.model.eval()(x, y)[1])


def test_a_loop_without_batch_processor_or_data_that_has_steps_to_run_is_refused():
    model = DigitNet()
    with pytest.raises(ValueError, match=r"batch_processor is None, but num_epochs=1 asks for steps.*num_epochs=0"):
        Trainer(model=model, data_loader=digits_loader(), optimizer=None, batch_processor=None, device=None,
                num_epochs=1)
    with pytest.raises(ValueError, match=r"batch_processor and data_loader are None, but num_steps=3.*num_steps=0"):
        Trainer(model=model, data_loader=None, optimizer=None, batch_processor=None, device=None,
                stop_by="step", num_steps=3)


# -- HAT arguments we cannot honour -----------------------------------------------------------
def test_unknown_or_unsupported_hat_arguments_are_named():
    with pytest.raises(TypeError, match="unexpected keyword argument 'resume_data_loader'"):
        trainer(resume_data_loader=True)
    with pytest.raises(Exception, match="log_profilers"):
        build_from_cfg({"type": "StatsMonitor", "log_profilers": True}, key_path="callbacks[0]")
    processor = BasicBatchProcessor(need_grad_update=False)
    for name in ("auto_calibration", "weight_reconstruction"):
        with pytest.raises(NotImplementedError, match=f"{name}=True.*{name}=False"):
            Calibrator(model=DigitNet(), data_loader=digits_loader(), batch_processor=processor, num_steps=1,
                       **{name: True})


EXPORT_CONFIG = '''
import torch

seed = 0
work_dir = "./work"
model = dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10)
# HAT's "just for saving" stage: no data, no optimizer, no batch processor, num_epochs=0
int_infer_trainer = dict(
    type="Trainer",
    model=model,
    model_convert_pipeline=dict(
        type="ModelConvertPipeline", converters=[dict(type="LoadCheckpoint", checkpoint_path={ckpt!r})],
    ),
    data_loader=None,
    optimizer=None,
    batch_processor=None,
    num_epochs=0,
    device=None,
    callbacks=[dict(type="SaveTraced", save_dir="./deploy", trace_inputs=dict(img=torch.zeros(2, 64)),
                    save_hash=False)],
)
'''


def test_hat_train_runs_an_export_only_stage(tmp_path):
    from conftest import run_tool

    from hat_ignite.models.mlp import MLPClassifier

    torch.manual_seed(4)
    source = MLPClassifier(in_features=64, hidden_features=16, num_classes=10)
    ckpt = _saved(tmp_path, source, "float-best.pth.tar")
    config = tmp_path / "export.py"
    config.write_text(EXPORT_CONFIG.format(ckpt=ckpt))
    proc = run_tool("hat-train", config, "--stage", "int_infer", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traced = torch.jit.load(str(tmp_path / "deploy" / "deploy-checkpoint-last.pt"))
    x = torch.randn(5, 64)
    torch.testing.assert_close(traced(dict(img=x)), source.eval()(dict(img=x)))


# -- SaveTraced(save_gpu_pt) ------------------------------------------------------------------
def test_save_gpu_pt_traces_on_the_gpu_or_says_it_needs_one(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="save_gpu_pt=True.*no usable CUDA.*save_gpu_pt=False"):
            SaveTraced(save_dir=str(tmp_path), trace_inputs=(torch.zeros(1, 64),), save_gpu_pt=True)
        return
    saver = SaveTraced(save_dir=str(tmp_path), trace_inputs=(torch.zeros(1, 64), torch.tensor([0])),
                       save_gpu_pt=True, save_exported=False)
    traced = torch.jit.load(saver.save(DigitNet()))
    assert all(p.is_cuda for p in traced.parameters())


# -- Checkpoint(only_save_ddp) and submodule DDP keys ----------------------------------------
DDP_SCRIPT = '''
import os, sys, torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, {tests!r})
from test_hat_args import DigitNet
from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.engine import BasicBatchProcessor, DistributedDataParallelTrainer, collect_loss_by_index

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
x, y = load_digits(return_X_y=True)
data = DataLoader(TensorDataset(torch.tensor(x[:80] / 16.0, dtype=torch.float32), torch.tensor(y[:80])), batch_size=40)
for only in (False, True):
    out = os.path.join({out!r}, str(only))
    model = DigitNet()
    trainer = DistributedDataParallelTrainer(
        model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=1, convert_submodule_list=["backbone"] if only else "backbone",  # HAT's bare name too
        callbacks=[Checkpoint(save_dir=out, only_save_ddp=only)])
    trainer.fit()
    print(only, sorted(load_checkpoint(os.path.join(out, "checkpoint-last.pth.tar"))["state_dict"]))
# a compiled model inside DDP: the forward goes through dynamo, the gradients are all-reduced
graphs = []
def backend(gm, example_inputs):
    graphs.append(gm)
    return gm.forward
model = DigitNet()
before = model.head.weight.detach().clone()
trainer = DistributedDataParallelTrainer(
    model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
    device=None, num_epochs=1, compiler=dict(type="Torch2Compile", backend=backend))
trainer.fit()
print("compiled", type(trainer.model).__name__, bool(graphs), not torch.equal(before, model.head.weight))
torch.distributed.destroy_process_group()
'''


def test_only_save_ddp_saves_the_ddp_submodules_with_plain_keys_and_ddp_takes_a_compiler(tmp_path):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = DDP_SCRIPT.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script, str(port)], capture_output=True, text=True, timeout=time_limit(120))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("False", "True"))]
    assert lines == [
        "False ['backbone.0.bias', 'backbone.0.weight', 'head.bias', 'head.weight']",
        "True ['backbone.0.bias', 'backbone.0.weight']",
    ]
    assert "compiled DistributedDataParallel True True" in proc.stdout
