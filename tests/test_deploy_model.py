"""HAT's export-only ``int_infer`` stage when the deploy model differs from the trained one.

The QAT checkpoint of the *training* model is loaded into the *deploy* model prepared without
data. The deploy model may compute more (post-processing after the head), less (a head it builds
but does not call) or call a module otherwise (without its labels). Every saved range goes to the
observer that observes the same tensor, whatever its number; a range that follows from its
input's is taken from it; a range the checkpoint truly lacks is refused by name. HAT's
``QuantStub`` / ``DeQuantStub`` bound the int8 part, as in HAT's eager mode.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import DeQuantStub, QuantStub

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.errors import CheckpointError, QuantizationError
from hat_ignite.quantization import Float2Calibration, Float2QAT, ModelConvertPipeline, QAT2Quantize, prepared_modules


def _trained_checkpoint(model: nn.Module, batches, path) -> str:
    """QAT-train ``model`` a few steps on ``batches`` (observers move) and save it as the Checkpoint callback does."""
    model.train()
    for x in batches:
        out = model(*x) if isinstance(x, tuple) else model(x)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    model.eval()
    records = [m.export_record() for m in prepared_modules(model)]
    return atomic_save(with_content_hash({"state_dict": model.state_dict(), "prepared_modules": records}), str(path))


def _scales(model: nn.Module) -> dict[str, float]:
    """Each observer's scale by what it observes."""
    (prepared,) = prepared_modules(model)
    return {identity.split(" -> ")[0]: float(prepared.graph.get_submodule(name).scale)
            for name, identity in prepared.observers.items() if "attr:" not in identity}


class Net(nn.Module):
    """Training: two convs, a head and an extra training-only head. Deploy: a max pool between the
    convs (mid-graph: every later observer's number shifts) and no training head."""

    def __init__(self, deploy: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)
        self.aux = nn.Linear(8, 3)  # built by both, called in training only
        self.deploy = deploy

    def forward(self, x):
        y = F.relu(self.c1(x))
        if self.deploy:
            y = F.max_pool2d(y, 2)
        y = F.adaptive_avg_pool2d(F.relu(self.c2(y)), 1).flatten(1)
        return self.fc(y) if self.deploy else (self.fc(y), self.aux(y))


def test_each_saved_range_goes_to_the_observer_of_the_same_tensor_in_a_deploy_model(tmp_path, caplog):
    x = torch.randn(4, 3, 16, 16)
    trained = Float2QAT(example_inputs=x)(Net())
    path = _trained_checkpoint(trained, [torch.randn(4, 3, 16, 16) for _ in range(3)], tmp_path / "qat.pth.tar")
    saved = _scales(trained)

    with caplog.at_level(logging.INFO):
        deploy = ModelConvertPipeline([Float2QAT(), LoadCheckpoint(path)])(Net(deploy=True))
    loaded = _scales(deploy)
    # the deploy graph numbers its observers otherwise (one more op mid-graph), yet every range it
    # shares with the trained graph is the trained one, and the pooled tensor takes the range of
    # the ReLU output it pools
    assert loaded["/max_pool2d#0"] == saved["/relu#0"]
    assert {k: v for k, v in loaded.items() if k != "/max_pool2d#0"} == {k: v for k, v in saved.items() if k != "/relu#0"}
    assert "/max_pool2d#0 takes the range of /relu#0" in caplog.text
    assert "does not compute what 1 saved observer(s) observed (attr:aux.weight)" in caplog.text

    int8 = QAT2Quantize()(deploy)
    assert int8(x).shape == (4, 4)


def test_a_range_the_checkpoint_truly_lacks_is_refused_by_name(tmp_path):
    class Wider(Net):
        def forward(self, x):  # the deploy model quantizes a conv the training model never ran
            return super().forward(x) + self.fc(self.extra(x).mean((2, 3)))

        def __init__(self):
            super().__init__(deploy=True)
            self.extra = nn.Conv2d(3, 8, 1)

    x = torch.randn(4, 3, 16, 16)
    path = _trained_checkpoint(Float2QAT(example_inputs=x)(Net()), [x], tmp_path / "qat.pth.tar")
    with pytest.raises(CheckpointError, match=r"no quantization range for 2 tensor.*attr:extra.weight -> extra/conv2d#0; .*/mean#0 -> fc@1/linear#0"):
        ModelConvertPipeline([Float2QAT(), LoadCheckpoint(path)])(Wider())


class ToyHead(nn.Module):
    """HAT's toy head: conv, pool, a 1x1 conv, then a DeQuantStub; training reshapes for the loss."""

    def __init__(self, reshape_output: bool = True) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.pool = nn.AvgPool2d(4)
        self.fc = nn.Conv2d(16, 10, 1, bias=False)
        self.dequant = DeQuantStub()
        self.reshape_output = reshape_output

    def forward(self, x, *args):
        x = self.dequant(self.fc(self.pool(self.conv(x))))
        return x.reshape(-1, 10) if self.reshape_output else x


class ToyTask(nn.Module):
    """HAT's OutputModule: the training one computes its loss from the labels; the deploy one
    post-processes (``cat`` then ``split``) and takes no labels."""

    def __init__(self, deploy: bool = False) -> None:
        super().__init__()
        self.head = ToyHead(reshape_output=not deploy)
        self.deploy = deploy

    def forward(self, feats, label=None):
        pred = self.head(feats)
        if self.deploy:
            first, second = torch.split(torch.cat([pred, pred], dim=1), 10, dim=1)
            return first, second
        return pred, F.cross_entropy(pred, label)


class ToyModel(nn.Module):
    def __init__(self, deploy: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.quant = QuantStub()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.task1 = ToyTask(deploy)
        self.deploy = deploy

    def forward(self, data):
        feats = self.backbone(self.quant(data["img"] - 0.5))
        return self.task1(feats) if self.deploy else self.task1(feats, data["label"])


def test_hats_toy_deploy_model_loads_the_qat_checkpoint_and_post_processes_in_float(tmp_path):
    batch = dict(img=torch.rand(4, 3, 8, 8), label=torch.randint(0, 10, (4,)))
    trained = Float2QAT(example_inputs=batch)(ToyModel())
    # the whole training model runs alike in both modes (its loss too): prepared whole, as HAT's toy
    assert [m.qname for m in prepared_modules(trained)] == [""]
    (prepared,) = prepared_modules(trained)
    # before the QuantStub (the shift: quantized where the stub is, on its output) and after the
    # DeQuantStub (reshape, loss): float
    observed = list(prepared.observers.values())
    assert "/sub#0 -> backbone.0/conv2d#0" in observed
    assert not [i for i in observed if "-> /sub" in i or "reshape" in i or "softmax" in i or "entropy" in i]
    path = _trained_checkpoint(trained, [batch], tmp_path / "qat.pth.tar")

    # the export-only stage: no data; the deploy model runs on a batch made as the checkpoint records
    deploy = ModelConvertPipeline([Float2QAT(), LoadCheckpoint(path), QAT2Quantize()])(ToyModel(deploy=True))
    first, second = deploy(dict(img=batch["img"]))
    reference = trained(batch)[0].reshape(4, 10, 1, 1)
    assert first.shape == (4, 10, 1, 1) and torch.equal(first, second)
    assert (first - reference).abs().max() < 0.1


class StrictInputsModel(ToyModel):
    """HAT's GraphModel checks its inputs: the deploy model takes exactly ``img``."""

    def forward(self, data):
        if set(data) != {"img"}:
            raise AssertionError(f"{set(data) - {'img'}} not in input names")
        return super().forward(data)


def test_the_export_only_stage_runs_a_deploy_model_on_what_save_traced_traces_it_with(tmp_path):
    from hat_ignite.callbacks.save_traced import SaveTraced
    from hat_ignite.engine.trainer import Trainer

    batch = dict(img=torch.rand(4, 3, 8, 8), label=torch.randint(0, 10, (4,)))
    trained = Float2QAT(example_inputs=batch)(ToyModel())
    path = _trained_checkpoint(trained, [batch], tmp_path / "qat.pth.tar")
    # HAT's int_infer_trainer: no data, no training, the deploy model traced with deploy_inputs
    trainer = Trainer(
        model=StrictInputsModel(deploy=True), data_loader=None, optimizer=None, batch_processor=None, num_epochs=0,
        device=None,
        model_convert_pipeline=ModelConvertPipeline([Float2QAT(), LoadCheckpoint(path), QAT2Quantize()]),
        callbacks=[SaveTraced(str(tmp_path / "deploy"), trace_inputs=dict(img=torch.rand(1, 3, 8, 8)),
                              save_exported=False)],
    )
    trainer.fit()
    traced = torch.jit.load(str(tmp_path / "deploy" / "deploy-checkpoint-last.pt"))
    first, _ = traced(dict(img=batch["img"][:1]))
    assert (first - trained(batch)[0][:1].reshape(1, 10, 1, 1)).abs().max() < 0.1


def test_a_functional_add_and_a_tensor_add_in_one_graph_prepare():
    """HAT's BasicResBlock adds with torch.add (FloatFunctional) and its label-smoothing loss with
    Tensor.add: torch counts both as ``add_1``, which must not make one partition of the two."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x, label):
            out = torch.relu(torch.add(self.conv(x), x))
            logits = out.mean((2, 3))
            smooth = 0.9 * F.one_hot(label, 4) + 0.1 / 4
            return logits, -(smooth * logits.log_softmax(1)).sum(1).mean()

    model = Float2Calibration(example_inputs=(torch.randn(2, 4, 6, 6), torch.tensor([1, 2])))(Block())
    assert [m.qname for m in prepared_modules(model)] == [""]


def test_a_model_that_keeps_its_own_references_to_its_modules_is_refused():
    """HAT's GraphModel calls the node modules it holds: replacing an attribute would leave QAT
    training the float module."""

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
            self.loss = nn.MSELoss()
            self._nodes = {"body": self.body}  # a plain dict: not a submodule

        def forward(self, x):
            out = self._nodes["body"](x)
            return (out, self.loss(out, out.detach() + 1)) if self.training else out

    with pytest.raises(QuantizationError, match=r"did not call the prepared \['body'\]"):
        Float2QAT(example_inputs=torch.randn(2, 3, 8, 8))(Held())
