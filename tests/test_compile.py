"""HAT's ``compiler`` argument: ``Torch2Compile`` compiles the model in place, on real training."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import flat_digits_loader
from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.callbacks.ema import ExponentialMovingAverage
from hat_ignite.engine import BasicBatchProcessor, DataParallelTrainer, Predictor, Trainer, collect_loss_by_index
from hat_ignite.engine.compile import Torch2Compile, build_compiler, is_compiled, remove_compiled_forward


def digits_loader(n: int = 160, batch_size: int = 40):
    return flat_digits_loader(n, batch_size)


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x, y):
        logits = self.head(self.backbone(x))
        return nn.functional.cross_entropy(logits, y), logits


class CountingBackend:
    """A torch.compile backend that records the graphs dynamo hands it and runs them as they are."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(gm)
        return gm.forward


def train(compiler=None, callbacks=(), num_epochs: int = 2, model: nn.Module | None = None) -> Trainer:
    torch.manual_seed(0)
    model = model if model is not None else DigitNet()
    trainer = Trainer(
        model=model, data_loader=digits_loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=num_epochs, callbacks=list(callbacks), compiler=compiler,
    )
    trainer.fit()
    return trainer


def test_compiler_config_compiles_the_model_and_trains_to_the_eager_weights(tmp_path):
    backend = CountingBackend()
    eager = train()
    compiled = train(compiler=dict(type="Torch2Compile", backend=backend),
                     callbacks=[Checkpoint(save_dir=str(tmp_path), save_interval=1)])
    # the forward went through dynamo: graphs were captured, and the model is still a DigitNet
    assert backend.graphs and any(n.op == "call_function" for n in backend.graphs[0].graph.nodes)
    assert type(compiled.model) is DigitNet and is_compiled(compiled.model)
    assert isinstance(compiled.compiler, dict)
    # the eager backend runs the captured graph as is: the same weights as the eager run
    for (name, a), (_, b) in zip(eager.model.state_dict().items(), compiled.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    # the checkpoint holds the plain module's keys and loads into an uncompiled model
    saved = load_checkpoint(tmp_path / "checkpoint-last.pth.tar")["state_dict"]
    assert sorted(saved) == sorted(DigitNet().state_dict())
    restored = LoadCheckpoint(str(tmp_path / "checkpoint-last.pth.tar"))(DigitNet())
    assert torch.equal(restored.head.weight, compiled.model.head.weight)


def test_inductor_compiles_and_trains_on_the_cpu():
    eager = train(num_epochs=1)
    compiled = train(compiler=dict(type="Torch2Compile", backend="inductor", dynamic=False), num_epochs=1)
    assert is_compiled(compiled.model)
    for (name, a), (_, b) in zip(eager.model.state_dict().items(), compiled.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_compile_submodules_and_skip_modules_choose_what_runs_in_the_graph():
    seen: dict[str, bool] = {}

    class Probe(nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name, self.fc = name, nn.Linear(4, 4)

        def forward(self, x):
            seen[self.name] = torch.compiler.is_compiling()
            return self.fc(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.neck, self.head = Probe("backbone"), Probe("neck"), Probe("head")

        def forward(self, x):
            return self.head(self.neck(self.backbone(x)))

    x = torch.randn(2, 4)
    net = Torch2Compile(skip_modules=["head"], backend="eager")(Net())
    net(x)
    assert seen == {"backbone": True, "neck": True, "head": False}
    seen.clear()
    net = Torch2Compile(compile_submodules=["neck"], regex=False, backend="eager")(Net())
    net(x)
    assert seen == {"backbone": False, "neck": True, "head": False}
    seen.clear()
    net = Torch2Compile(compile_submodules=["^(back|ne)"], backend="eager")(Net())
    net(x)
    assert seen == {"backbone": True, "neck": True, "head": False}
    # deep copies (EMA, validation) compile their own module; a plain copy runs eagerly
    seen.clear()
    twin = copy.deepcopy(net)
    twin.backbone.fc.weight.data.zero_()
    twin.backbone.fc.bias.data.zero_()
    assert torch.equal(twin.backbone(x), torch.zeros(2, 4))
    seen.clear()
    remove_compiled_forward(twin)(x)
    assert seen == {"backbone": False, "neck": False, "head": False} and not is_compiled(twin)


def test_torch2compile_refuses_what_it_cannot_do():
    with pytest.raises(TypeError, match="'modee'.*torch.compile"):
        Torch2Compile(modee="max-autotune")
    with pytest.raises(ValueError, match="compile_submodules and skip_modules"):
        Torch2Compile(compile_submodules=["a"], skip_modules=["b"])
    with pytest.raises(ValueError, match="'nope' matches no submodule"):
        Torch2Compile(compile_submodules=["nope"], strict=True)(DigitNet())
    with pytest.raises(TypeError, match="compiler must be None"):
        build_compiler(3)
    with pytest.raises(TypeError, match="returned a str"):
        Trainer(model=DigitNet(), data_loader=digits_loader(), optimizer=None,
                batch_processor=BasicBatchProcessor(need_grad_update=False), device=None, num_epochs=1,
                compiler=lambda m: "not a module")
    with pytest.raises(ValueError, match="DataParallel"):
        DataParallelTrainer(model=DigitNet(), data_loader=digits_loader(), optimizer=None,
                            batch_processor=BasicBatchProcessor(need_grad_update=False), device=[0, 1],
                            num_epochs=1, compiler=True)


def test_an_optimized_module_from_a_user_compiler_saves_plain_keys_and_ema_follows(tmp_path):
    backend = CountingBackend()
    trainer = train(compiler=lambda m: torch.compile(m, backend=backend),
                    callbacks=[ExponentialMovingAverage(), Checkpoint(save_dir=str(tmp_path), save_interval=1)])
    assert type(trainer.model).__name__ == "OptimizedModule" and backend.graphs
    checkpoint = load_checkpoint(tmp_path / "checkpoint-last.pth.tar")
    plain = sorted(DigitNet().state_dict())
    assert sorted(checkpoint["state_dict"]) == plain and sorted(checkpoint["ema_state_dict"]) == plain
    # HAT-era checkpoints of torch.compile'd models carry "_orig_mod." keys: they load too
    prefixed = {"state_dict": {f"_orig_mod.{k}": v for k, v in checkpoint["state_dict"].items()}}
    torch.save(prefixed, tmp_path / "prefixed.pth.tar")
    restored = LoadCheckpoint(str(tmp_path / "prefixed.pth.tar"), check_hash=False)(DigitNet())
    assert torch.equal(restored.head.bias, trainer.model.head.bias)


def test_predictor_takes_the_compiler_and_other_loop_arguments():
    backend = CountingBackend()
    predictor = Predictor(DigitNet(), digits_loader(), BasicBatchProcessor(need_grad_update=False),
                          compiler={"backend": backend}, resume_dataloader=False)
    predictor.fit()
    assert backend.graphs and predictor.resume_dataloader is False
    with pytest.raises(TypeError, match="stop_by"):
        Predictor(DigitNet(), digits_loader(), BasicBatchProcessor(need_grad_update=False), stop_by="step")
