"""FuseBN, FreezeModule and FreezeBNStatistics during real training of a conv+BN net on digits."""

from __future__ import annotations

import pytest
import torch
from control_helpers import AtStep, ConvBNNet, LossLog, clone_state, digits_loader, digits_tensors, make_trainer
from torch import nn

from hat_ignite.callbacks import ExponentialMovingAverage, FreezeBNStatistics, FreezeModule, FuseBN
from hat_ignite.callbacks.fuse_bn import fuse_conv_bn_pairs

BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _eval_outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    modes = {m: m.training for m in model.modules()}
    model.eval()
    with torch.no_grad():
        out = model(x)
    for m, training in modes.items():
        m.training = training
    return out


# -- FuseBN ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("inplace", [False, True])
def test_fuse_bn_keeps_eval_outputs_and_training_goes_on(inplace):
    x, _ = digits_tensors("val", n=64)
    seen: dict[str, object] = {}

    def before(loop):
        seen["out"] = _eval_outputs(loop.model, x)
        seen["params"] = sum(len(g["params"]) for g in loop.optimizer.param_groups)

    def after(loop):
        seen["fused_out"] = _eval_outputs(loop.model, x)
        seen["fused_weight"] = loop.model.backbone[0].weight.detach().clone()
        seen["fused_bias"] = loop.model.backbone[0].bias.detach().clone()
        seen["ema_out"] = _eval_outputs(loop.ema_model, x)

    losses = LossLog()
    ema = ExponentialMovingAverage(decay=0.9, decay_base=2)
    fuse = FuseBN(modules=[["backbone"], ["head"]], step_or_epoch=[6, 6], update_by="step", inplace=inplace)
    trainer = make_trainer([ema, AtStep(6, before), fuse, AtStep(6, after), losses], num_epochs=5, lr=0.05)
    trainer.fit()
    model = trainer.model
    torch.testing.assert_close(seen["fused_out"], seen["out"], rtol=0, atol=1e-5)
    # every conv/linear+BN pair became conv/linear with bias + Identity, in the EMA copy too
    for net in (model, trainer.ema_model):
        assert not any(isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d) for m in net.modules())
        assert isinstance(net.backbone[1], nn.Identity) and isinstance(net.head[2], nn.Identity)
    # the optimizer trains the fused layers: 3 BN pairs (6 params) left, 1 new bias came
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in model.parameters()} == in_optimizer
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == seen["params"] - 6 + 1
    assert not torch.equal(model.backbone[0].weight, seen["fused_weight"])
    assert not torch.equal(model.backbone[0].bias, seen["fused_bias"])
    # the loss keeps going down after the fusion (epochs 2..5, 6 steps each)
    per_epoch = [sum(losses.values[i:i + 6]) / 6 for i in range(6, 30, 6)]
    assert per_epoch[-1] < per_epoch[0] and per_epoch == sorted(per_epoch, reverse=True)
    assert ema.updates == 30


def test_fuse_bn_by_epoch_and_the_function_on_nested_containers():
    stamp = {}
    fuse = FuseBN(modules=[["head"]], step_or_epoch=[1], update_by="epoch")
    trainer = make_trainer([fuse, AtStep(1, lambda loop: stamp.update(step=loop.state.iteration), epoch=True)], num_epochs=2)
    trainer.fit()
    assert isinstance(trainer.model.head[2], nn.Identity) and isinstance(trainer.model.backbone[1], nn.BatchNorm2d)
    assert stamp["step"] == 6  # fused at the begin of epoch 1, before its first step
    torch.manual_seed(0)
    nested = nn.Sequential(
        nn.ModuleList([nn.Conv1d(2, 3, 1), nn.BatchNorm1d(3)]),
        nn.Sequential(nn.Sequential(nn.ConvTranspose2d(2, 3, 2), nn.BatchNorm2d(3))),
        nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, affine=False)),
    ).eval()
    for m in nested.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    inputs = [torch.randn(5, 2, 7), torch.randn(5, 2, 4, 4), torch.randn(5, 4)]
    outs = [nested[0][1](nested[0][0](inputs[0])), nested[1](inputs[1]), nested[2](inputs[2])]
    assert fuse_conv_bn_pairs(nested, prefix="net") == [("net.0.0", "net.0.1"), ("net.1.0.0", "net.1.0.1"), ("net.2.0", "net.2.1")]
    fused = [nested[0][1](nested[0][0](inputs[0])), nested[1](inputs[1]), nested[2](inputs[2])]
    for a, b in zip(outs, fused):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_fuse_bn_finds_every_conv_bn_pair_of_the_shipped_resnet():
    from hat_ignite.models import ResNetClassifier

    torch.manual_seed(0)
    model = ResNetClassifier(stem_channels=4, widths=(4, 8), blocks=1).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2)
    x = torch.rand(3, 1, 8, 8)
    before = model(x)
    pairs = FuseBN(modules=[["net"]], step_or_epoch=[0], update_by="step").process(model, "net", inplace=True)
    assert len(pairs) == 6 and ("net.layer2.0.shortcut.0", "net.layer2.0.shortcut.1") in pairs
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)


def test_fuse_bn_names_a_wrong_module_at_loop_begin():
    with pytest.raises(ValueError, match="no sub-module 'neck'.*'backbone', 'head'"):
        make_trainer([FuseBN(modules=[["neck"]], step_or_epoch=[3], update_by="step")], num_epochs=1).fit()
    with pytest.raises(ValueError, match="one value per modules entry"):
        FuseBN(modules=[["backbone"], ["head"]], step_or_epoch=[3], update_by="step")
    with pytest.raises(ValueError, match="update_by"):
        FuseBN(modules=[["backbone"]], step_or_epoch=[3], update_by="iteration")


# -- FreezeModule ----------------------------------------------------------------------------------
def _bn_stats(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in clone_state(module).items() if k.rsplit(".", 1)[-1] in BN_STATS}


def _params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def _unchanged(a: dict, b: dict) -> list[str]:
    return [k for k in a if torch.equal(a[k], b[k])]


@pytest.mark.parametrize(("update_by", "at", "when"), [("step", 4, 4), ("epoch", 1, 1)])
def test_freeze_module_stops_the_named_module_from_then_on(update_by, at, when):
    snap = {}
    take = AtStep(when, lambda loop: snap.update(model=clone_state(loop.model)), epoch=update_by == "epoch")
    freeze = FreezeModule(modules=[["backbone"]], step_or_epoch=[at], update_by=update_by)
    trainer = make_trainer([take, freeze], num_epochs=3)
    trainer.fit()
    model, before = trainer.model, snap["model"]
    end = clone_state(model)
    backbone = [k for k in end if k.startswith("backbone.")]
    assert backbone and all(torch.equal(end[k], before[k]) for k in backbone)  # weights and BN statistics
    head_params = [k for k, _ in model.head.named_parameters()]
    assert head_params and not any(torch.equal(end[f"head.{k}"], before[f"head.{k}"]) for k in head_params)
    assert not torch.equal(end["head.2.running_mean"], before["head.2.running_mean"])
    assert not any(p.requires_grad for p in model.backbone.parameters()) and not model.backbone.training


def test_freeze_module_only_batchnorm_puts_the_module_in_eval_mode_and_keeps_training():
    snap = {}
    take = AtStep(4, lambda loop: snap.update(model=clone_state(loop.model)))
    freeze = FreezeModule(modules=[["backbone"]], step_or_epoch=[4], update_by="step", only_batchnorm=True)
    trainer = make_trainer([take, freeze], num_epochs=2)
    trainer.fit()
    model, before = trainer.model, snap["model"]
    end = clone_state(model)
    stats = [k for k in _bn_stats(model.backbone)]
    assert stats and all(torch.equal(end[f"backbone.{k}"], before[f"backbone.{k}"]) for k in stats)
    assert _unchanged({k: before[k] for k in _params(model)}, _params(model)) == []  # every weight still trains
    assert not torch.equal(end["head.2.running_var"], before["head.2.running_var"])  # other BN layers too
    # the whole backbone is in eval mode, as HAT's module.eval(): its dropout is off too
    assert not any(m.training for m in model.backbone.modules()) and model.head.training


def test_freeze_bn_statistics_keeps_every_running_statistic_constant():
    model = ConvBNNet()
    initial_stats, initial_params = _bn_stats(model), _params(model)
    trainer = make_trainer([FreezeBNStatistics()], model=model, num_epochs=2, loader=digits_loader(n=96))
    trainer.fit()
    assert _unchanged(initial_stats, _bn_stats(model)) == list(initial_stats)
    assert _unchanged(initial_params, _params(model)) == []
    assert model.training and all(not m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))
