"""Modules called more than once prepare for int8: each call of a torch.nn layer is quantized on
its own, and a prepared module called on inputs of several shapes takes them all.

torchvision's ``BasicBlock`` applies its one ``self.relu`` twice; a detection head runs its convs
on every FPN level. A non-strict ``torch.export`` (what the converters use) used to merge the calls
of such a layer into one quantization partition, and the X86 quantizer refused it ("Input
partition has more than one output node"). Plain torchao's own flow on the same model is the
reference: its strict export + ``prepare_qat_pt2e`` + ``convert_pt2e`` gives the same int8 model.
"""

from __future__ import annotations

import torch
from torch import nn

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.quantization import (
    Float2Calibration, Float2QAT, ModelConvertPipeline, QAT2Quantize, default_quantizer, observing,
)


class SharedReluBlock(nn.Module):
    """torchvision's BasicBlock: one ReLU module, called twice."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), SharedReluBlock(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )


def _fake_quantizers(prepared):
    return [m for m in prepared.graph.modules() if hasattr(m, "observer_enabled")]


def test_a_block_calling_its_relu_twice_prepares_and_each_call_gets_its_own_observer():
    """qat_mode="fuse_bn" here; "with_bn" (torchao's own QAT recipe) in the next test."""
    x = torch.randn(4, 3, 12, 12)
    model = Float2Calibration(example_inputs=x, qat_mode="fuse_bn")(_net())
    with observing(model):
        model.eval()(x)
    # each ReLU call ends its own fused pattern and is observed on its own: the second call's output
    # (after the residual add) has another range than the first's
    relu_outputs = [n for n in model.graph.graph.nodes if n.op == "call_function" and "relu" in str(n.target)]
    assert len(relu_outputs) == 2
    observers = [model.graph.get_submodule(u.target) for n in relu_outputs for u in n.users if u.op == "call_module"]
    assert len({id(o) for o in observers}) == 2
    assert len({float(o.scale) for o in observers}) == 2
    quantized = QAT2Quantize()(model)
    assert (quantized(x) - _net().eval()(x)).abs().max() < 0.05


def test_the_int8_model_is_the_one_plain_torchaos_flow_makes_from_a_strict_export():
    """with_bn is torchao's QAT recipe as it is: export in training form, prepare, train, convert."""
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    batches = [torch.randn(4, 3, 12, 12) for _ in range(3)]
    reference = prepare_qat_pt2e(torch.export.export(_net().train(), (batches[0],), strict=True).module(),
                                 default_quantizer())
    move_exported_model_to_train(reference)
    ours = Float2QAT(example_inputs=batches[0], qat_mode="with_bn")(_net()).train()
    with torch.no_grad():
        for x in batches:
            reference(x)
            ours(x)
    move_exported_model_to_eval(reference)
    reference = convert_pt2e(reference)
    ours = QAT2Quantize()(ours)
    test = torch.randn(4, 3, 12, 12)  # the strict export has a static batch size
    assert torch.equal(ours(test), reference(test))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(8, 3, 1)

    def forward(self, x):
        return self.cls(self.tower(x))


class LevelsDetector(nn.Module):
    """A loss in training (so its forward is not exported whole), the head called once per level."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = Head()

    def forward(self, x):
        p3 = self.stem(x)
        p4 = self.down(p3)
        outs = [self.head(p) for p in (p3, p4, self.down(p4))]
        if self.training:
            return sum(o.square().mean() for o in outs)
        return outs


def test_a_head_called_on_every_level_takes_each_levels_size_also_when_prepared_from_a_checkpoint(tmp_path):
    x = torch.randn(2, 3, 32, 32)
    float_outs = LevelsDetector().eval()(x)
    model = Float2Calibration(example_inputs=x)(LevelsDetector())
    assert sorted(m.qname for m in model.modules() if hasattr(m, "qname")) == ["down", "head", "stem"]
    with observing(model):
        model.eval()(x)
    outs = model(x)
    assert [o.shape[-1] for o in outs] == [32, 16, 8]
    assert all((o - f).abs().max() < 0.1 for o, f in zip(outs, float_outs))

    # the export-only stage: no data, the inputs (and which of their dims vary) from the checkpoint
    records = [m.export_record() for m in model.modules() if hasattr(m, "export_record")]
    path = atomic_save(with_content_hash({"state_dict": model.state_dict(), "prepared_modules": records}),
                       str(tmp_path / "calibration.pth.tar"))
    pipeline = ModelConvertPipeline([Float2Calibration(), LoadCheckpoint(path), QAT2Quantize()])
    int8 = pipeline(LevelsDetector())
    assert [o.shape[-1] for o in int8(torch.randn(3, 3, 32, 32))] == [32, 16, 8]
    assert all((o - f).abs().max() < 0.1 for o, f in zip(int8(x), float_outs))
