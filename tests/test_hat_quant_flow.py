"""HAT's converter lines as HAT configs write them (no example inputs, no module names), on HAT-style
models that compute their loss in ``forward``: calibration -> QAT -> export-only int_infer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hat_ignite.callbacks import Checkpoint, SaveTraced
from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.engine import (
    BasicBatchProcessor,
    Calibrator,
    MultiBatchProcessor,
    Trainer,
    collect_loss_by_index,
    collect_loss_by_regex,
)
from hat_ignite.errors import QuantizationError
from hat_ignite.quantization import (
    Float2Calibration,
    Float2QAT,
    ModelConvertPipeline,
    QAT2Quantize,
    prepared_modules,
)

from conftest import ROOT, time_limit


class HatNet(nn.Module):
    """HAT's convention: ``(preds, losses)`` in training, ``preds`` in eval; takes a dict batch only."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 64, 10))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, data):
        assert isinstance(data, dict), type(data)  # as HAT models index their batch
        preds = self.head(self.backbone(data["img"]))
        return (preds, {"ce": self.loss(preds, data["labels"])}) if self.training else preds


def images(n: int = 32, seed: int = 0, uint8: bool = False) -> list[dict]:
    """``n`` samples ``dict(img=[1, 8, 8], labels=int)``: uint8 images, as an image pipeline gives them,
    or float ones (which the uint8 -> float batch transform only rescales)."""
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)
    img = img if uint8 else img.float()
    labels = torch.randint(0, 10, (n,), generator=g)
    return [{"img": img[i], "labels": labels[i]} for i in range(n)]


def to_float(batch: dict) -> dict:
    return dict(batch, img=batch["img"].float() / 255)


def calibrate(tmp_path, uint8: bool = False) -> Calibrator:
    """HAT's calibration stage: Float2Calibration(convert_mode="fx") with nothing else, a Checkpoint."""
    engine = Calibrator(
        model=HatNet(), data_loader=DataLoader(images(uint8=uint8), batch_size=8),
        model_convert_pipeline=dict(type="ModelConvertPipeline", qat_mode="fuse_bn",
                                    converters=[dict(type="Float2Calibration", convert_mode="fx")]),
        batch_processor=BasicBatchProcessor(need_grad_update=False, batch_transforms=[to_float]),
        device=None, num_steps=2, callbacks=[Checkpoint(str(tmp_path), name_prefix="calibration-")],
    )
    engine.fit()
    return engine


def activation_ranges(model: nn.Module) -> dict[str, tuple[float, float]]:
    """The range each activation observer holds, by prepared module and observer (weights excluded:
    their per-channel observers take the weights' ranges when the model is prepared)."""
    return {f"{m.qname}.{name}": (float(fq.activation_post_process.min_val), float(fq.activation_post_process.max_val))
            for m in prepared_modules(model) for name, fq in m.named_modules()
            if hasattr(fq, "activation_post_process") and fq.activation_post_process.min_val.numel() == 1}


def parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_converters_trace_with_the_batch_as_the_model_receives_it(tmp_path):
    """A uint8 image pipeline converted by the batch processor's batch_transforms, and a
    MultiBatchProcessor step of several batches (a tuple): the converter traces with each batch as
    the model gets it in that stage."""
    engine = calibrate(tmp_path, uint8=True)
    assert sorted(m.qname for m in prepared_modules(engine.model)) == ["backbone", "head"]

    def two_batches(items):  # each step: a tuple of two batches, as a MultiBatchProcessor takes them
        return tuple(torch.utils.data.default_collate(list(part)) for part in zip(*items))

    pairs = list(zip(images(16, 1, uint8=True), images(16, 2, uint8=True)))
    multi = Calibrator(
        model=HatNet(), data_loader=DataLoader(pairs, batch_size=4, collate_fn=two_batches),
        model_convert_pipeline=[Float2Calibration(convert_mode="fx")],
        batch_processor=MultiBatchProcessor(need_grad_update=False, batch_transforms=[to_float]),
        device=None, num_steps=2,
    )
    multi.fit()
    assert sorted(m.qname for m in prepared_modules(multi.model)) == ["backbone", "head"]


def test_a_model_computing_its_loss_in_forward_trains_in_qat_after_hat_converter_lines(tmp_path):
    """HAT's Float2Calibration + Float2QAT + LoadCheckpoint, no module names: the network is
    prepared, calibration records the activations' ranges, QAT starts from them, and the loss and
    the model's own forward stay in Python, so QAT trains the weights on the losses the model
    returns in training."""
    calibrated = calibrate(tmp_path)
    ranges = activation_ranges(calibrated.model)
    assert sorted(ranges) == ["backbone.graph.activation_post_process_0", "head.graph.activation_post_process_0"]
    # the backbone's input is the data scaled to [0, 1], the head's the backbone's ReLU output
    (low, high), (head_low, head_high) = ranges.values()
    assert low == 0.0 and 0.99 < high <= 1.0 and head_low == 0.0 and 0.1 < head_high < 10.0
    qat = Trainer(
        model=HatNet(), data_loader=DataLoader(images(), batch_size=8, shuffle=True),
        model_convert_pipeline=ModelConvertPipeline(qat_mode="fuse_bn", converters=[
            Float2QAT(convert_mode="fx"), LoadCheckpoint(str(tmp_path / "calibration-checkpoint-last.pth.tar"))]),
        optimizer=dict(type="torch.optim.SGD", lr=0.01),
        batch_processor=BasicBatchProcessor(need_grad_update=True, batch_transforms=[to_float],
                                            loss_collector=collect_loss_by_index(1)),
        device=None, num_epochs=1,
    )
    assert {m.qname: m.stage for m in prepared_modules(qat.model)} == {"backbone": "qat", "head": "qat"}
    assert type(qat.model.loss) is nn.CrossEntropyLoss
    assert activation_ranges(qat.model) == ranges  # QAT starts from the calibrated ranges
    before = parameters(qat.model)
    # the conv (its BatchNorm folded in: qat_mode="fuse_bn") and the linear layer
    assert sorted(before) == ["backbone.graph.0.weight", "backbone.graph.0.weight_bias", "head.graph.1.bias",
                              "head.graph.1.weight"]
    qat.fit()
    assert qat.state.iteration == 4 and torch.isfinite(qat.state.losses[0])
    after = parameters(qat.model)
    assert all(not torch.equal(after[name], before[name]) for name in before), "QAT left a weight unchanged"


class TwoFaced(nn.Module):
    """Every submodule with weights runs differently in training: nothing can be exported on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 2)

    def forward(self, x):
        return self.inner(x) if not self.training else (self.inner(x), self.inner(x))


def test_a_model_no_part_of_which_runs_alike_in_both_modes_is_refused_at_build_time():
    with pytest.raises(QuantizationError, match=r"runs differently in training and in eval mode.*modules=\["):
        Float2QAT(example_inputs=torch.rand(3, 4))(nn.Sequential(TwoFaced()))


def test_the_export_only_int_infer_stage_prepares_from_the_qat_checkpoint(tmp_path):
    """HAT's int_infer_trainer: no data, num_epochs=0, Float2QAT -> LoadCheckpoint(qat) -> QAT2Quantize.
    The QAT checkpoint records what the export needs; the int8 model equals the QAT model converted."""
    calibrate(tmp_path)
    qat = Trainer(
        model=HatNet(), data_loader=DataLoader(images(), batch_size=8),
        model_convert_pipeline=[Float2QAT(), LoadCheckpoint(str(tmp_path / "calibration-checkpoint-last.pth.tar"))],
        optimizer=dict(type="torch.optim.SGD", lr=0.01),
        batch_processor=BasicBatchProcessor(need_grad_update=True, batch_transforms=[to_float],
                                            loss_collector=collect_loss_by_index(1)),
        device=None, num_epochs=1, callbacks=[Checkpoint(str(tmp_path), name_prefix="qat-")],
    )
    qat.fit()
    saved = load_checkpoint(tmp_path / "qat-checkpoint-last.pth.tar")
    record = {r["path"]: r for r in saved["prepared_modules"]}
    assert sorted(record) == ["backbone", "head"] and record["backbone"]["stage"] == "qat"
    assert record["backbone"]["args"] == {"tuple": [{"tensor": [8, 1, 8, 8], "dtype": "float32"}]}

    int_infer = Trainer(
        model=HatNet(), data_loader=None, optimizer=None, batch_processor=None, num_epochs=0, device=None,
        model_convert_pipeline=dict(type="ModelConvertPipeline", qat_mode="fuse_bn", converters=[
            dict(type="Float2QAT", convert_mode="fx"),
            dict(type="LoadCheckpoint", checkpoint_path=str(tmp_path / "qat-checkpoint-last.pth.tar")),
            dict(type="QAT2Quantize", convert_mode="fx"),
        ]),
        callbacks=[Checkpoint(str(tmp_path), name_prefix="int_infer-")],
    )
    int_infer.fit()
    assert {m.stage for m in prepared_modules(int_infer.model)} == {"quantized"}
    direct = QAT2Quantize()(qat.model)
    batch = to_float(torch.utils.data.default_collate(images(5, seed=9)))
    with torch.no_grad():
        assert torch.equal(int_infer.model.eval()(batch), direct.eval()(batch))
    assert (tmp_path / "int_infer-checkpoint-last.pth.tar").is_file()

    with pytest.raises(QuantizationError, match=r"Float2QAT: give example_inputs .* no data_loader .* LoadCheckpoint"):
        Trainer(model=HatNet(), data_loader=None, optimizer=None, batch_processor=None, num_epochs=0,
                device=None, model_convert_pipeline=[Float2QAT(), QAT2Quantize()])


DDP_SCRIPT = '''
import logging, os, sys
import torch
from torch import nn
sys.path.insert(0, {tests!r})
from test_hat_quant_flow import HatNet, images, to_float
from hat_ignite.engine import BasicBatchProcessor, DistributedDataParallelTrainer, collect_loss_by_index
from hat_ignite.quantization import Float2QAT

logging.basicConfig(level=logging.INFO, format="%(message)s")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
torch.distributed.init_process_group("gloo", rank=0, world_size=1)


class Stable(HatNet):
    """Predictions in both modes: the model is exported whole, as one graph."""

    def forward(self, data):
        return self.head(self.backbone(data["img"]))


def qat_trainer(model, processor_loss):
    return DistributedDataParallelTrainer(
        model=model, data_loader=torch.utils.data.DataLoader(images(16), batch_size=8),
        model_convert_pipeline=[Float2QAT(convert_mode="fx")], optimizer=dict(type="torch.optim.SGD", lr=0.01),
        batch_processor=BasicBatchProcessor(need_grad_update=True, batch_transforms=[to_float],
                                            loss_collector=processor_loss),
        device=None, num_epochs=1, convert_submodule_list=["backbone"],
    )


trainer = qat_trainer(HatNet(), collect_loss_by_index(1))
trainer.fit()
print("per-submodule", type(trainer.model).__name__, type(trainer.model.backbone).__name__,
      type(trainer.model.backbone.module).__name__, type(trainer.model.head).__name__)
trainer = qat_trainer(Stable(), lambda outs: [nn.functional.cross_entropy(outs, torch.zeros(len(outs), dtype=torch.long))])
trainer.fit()
print("whole", type(trainer.model).__name__, type(trainer.model.module).__name__, trainer.state.iteration)
torch.distributed.destroy_process_group()
'''


def test_convert_submodule_list_names_the_users_modules_after_qat_preparation(tmp_path):
    """HAT's ``convert_submodule_list=["backbone"]`` after ``Float2QAT``: a backbone prepared on its own
    is still ``model.backbone`` and is wrapped in DDP; in a model exported whole, the name lies
    inside the one graph, which is wrapped instead."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests")))
    proc = subprocess.run(
        [sys.executable, str(script), str(port)], capture_output=True, text=True, timeout=time_limit(240),
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == [
        "per-submodule HatNet DistributedDataParallel PreparedModule PreparedModule",
        "whole DistributedDataParallel PreparedModule 2",
    ]
    assert "'backbone' was exported for quantization inside the whole model's graph: wrapping that in DDP" in proc.stderr


class Classifier(nn.Module):
    """HAT's Classifier shape: ``(preds, loss)`` in both modes while it has a loss, so it is exported
    whole with its dict batch; the deploy model (``losses=None``) returns ``preds`` and only
    glances at ``labels`` (``data.get``), as HAT's structures do."""

    def __init__(self, losses: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.Flatten(), nn.Linear(4 * 64, 10))
        self.losses = nn.CrossEntropyLoss() if losses else None

    def forward(self, data):
        preds = self.backbone(data["img"])
        target = data.get("labels", None)
        if self.losses is None:
            return preds
        return preds, self.losses(preds, target)


def test_the_int_infer_deploy_model_takes_only_the_inputs_it_uses(tmp_path):
    """HAT's int_infer stage builds deploy_model (losses=None) from the QAT checkpoint, whose record
    holds the training batch ({img, labels}), and SaveTraced traces it with dict(img=...) alone:
    the graph takes only ``img``, and a whole batch is still accepted."""
    processor = BasicBatchProcessor(need_grad_update=True, batch_transforms=[to_float],
                                    loss_collector=collect_loss_by_index(1))
    qat = Trainer(
        model=Classifier(), data_loader=DataLoader(images(), batch_size=8),
        model_convert_pipeline=[Float2QAT(convert_mode="fx")], optimizer=dict(type="torch.optim.SGD", lr=0.01),
        batch_processor=processor, device=None, num_epochs=1, callbacks=[Checkpoint(str(tmp_path), name_prefix="qat-")],
    )
    qat.fit()
    (record,) = load_checkpoint(tmp_path / "qat-checkpoint-last.pth.tar")["prepared_modules"]
    assert record["path"] == "" and [k for k, _ in record["args"]["tuple"][0]["dict"]] == ["img", "labels"]

    deploy_inputs = dict(img=torch.randn(1, 1, 8, 8))
    int_infer = Trainer(
        model=Classifier(losses=False), data_loader=None, optimizer=None, batch_processor=None, num_epochs=0,
        device=None,
        model_convert_pipeline=dict(type="ModelConvertPipeline", qat_mode="fuse_bn", converters=[
            dict(type="Float2QAT", convert_mode="fx"),
            dict(type="LoadCheckpoint", checkpoint_path=str(tmp_path / "qat-checkpoint-last.pth.tar")),
            dict(type="QAT2Quantize", convert_mode="fx"),
        ]),
        callbacks=[SaveTraced(save_dir=str(tmp_path), trace_inputs=deploy_inputs)],
    )
    int_infer.fit()
    (prepared,) = prepared_modules(int_infer.model)
    assert prepared.input_keys == [frozenset({"img"})]
    traced = [p for p in tmp_path.iterdir() if p.suffix == ".pt" and "deploy" in p.name]
    assert traced, sorted(p.name for p in tmp_path.iterdir())
    batch = to_float(torch.utils.data.default_collate(images(4, seed=3)))
    direct = QAT2Quantize()(qat.model).eval()
    with torch.no_grad():
        assert torch.equal(int_infer.model.eval()(batch), direct(batch)[0])  # the whole batch is accepted
        assert torch.equal(torch.jit.load(str(traced[0]))(dict(img=batch["img"])), direct(batch)[0])


class TwoTasks(nn.Module):
    """A multitask model as HAT's toy multitask config builds it: a shared backbone, a head per task,
    and a forward that takes each task's batch its own way (its label key says the task)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.Flatten())
        self.task1 = nn.Linear(4 * 64, 10)
        self.task2 = nn.Linear(4 * 64, 2)

    def forward(self, data):
        feats = self.backbone(data["img"])
        task = "task1" if "task1_label" in data else "task2"
        preds = getattr(self, task)(feats)
        return {f"{task}_loss": nn.functional.cross_entropy(preds, data[f"{task}_label"]), f"{task}_preds": preds}


def test_a_multitask_model_prepares_its_backbone_and_each_task_head(tmp_path):
    """Each step holds one batch per task, whose keys differ: one graph exported from the first
    batch could not run the second, so the shared backbone and each head are prepared instead."""

    def task_batches(n, seed):
        items = images(n, seed)
        first = [{"img": x["img"], "task1_label": x["labels"]} for x in items]
        second = [{"img": x["img"], "task2_label": x["labels"] % 2} for x in items]
        return list(zip(first, second))

    def two_batches(items):
        return tuple(to_float(torch.utils.data.default_collate(list(part))) for part in zip(*items))

    qat = Trainer(
        model=TwoTasks(), data_loader=DataLoader(task_batches(16, 1), batch_size=4, collate_fn=two_batches),
        model_convert_pipeline=[Float2QAT(convert_mode="fx")], optimizer=dict(type="torch.optim.SGD", lr=0.01),
        batch_processor=MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_regex(".*loss")),
        device=None, num_epochs=1,
    )
    assert sorted(m.qname for m in prepared_modules(qat.model)) == ["backbone", "task1", "task2"]
    before = parameters(qat.model)
    assert {name.split(".")[0] for name in before} == {"backbone", "task1", "task2"}
    assert all(low > high for low, high in activation_ranges(qat.model).values())  # nothing observed yet
    qat.fit()
    assert qat.state.iteration == 4
    # every step trains the shared backbone and both heads, and each prepared part observed its input
    after = parameters(qat.model)
    assert all(not torch.equal(after[name], before[name]) for name in before), "QAT left a weight unchanged"
    ranges = activation_ranges(qat.model)
    assert {name.split(".")[0] for name in ranges} == {"backbone", "task1", "task2"}
    assert all(0.0 <= low < high for low, high in ranges.values())
