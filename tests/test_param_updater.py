"""The three OptimParamUpdaters against HAT's own figures, every param group at every step.

``tests/data/hat_param_figures.json`` holds values measured with HAT's own
``StepDecayOptimParamUpdater`` / ``CosOptimParamUpdater`` / ``CyclicOptimParamUpdater`` driven as
HAT's loop drives its callbacks (its ``header`` says how): 5 epochs of 4 steps, two param groups,
an SGD's ``weight_decay`` (4e-5, 1e-4) and an AdamW's ``betas`` (first elements 0.95, 0.9). Here
each case runs on our real Trainer with the updater as the only callback; the optimizer records
the scheduled entry of each group inside ``step()``, where it is used, and every value must
equal HAT's to a relative 1e-9.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from hat_ignite.callbacks.param_updater import (
    CosOptimParamUpdater,
    CyclicOptimParamUpdater,
    StepDecayOptimParamUpdater,
)
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.registry import build_from_cfg

FIGURES = json.loads((Path(__file__).parent / "data" / "hat_param_figures.json").read_text())
SPE, EPOCHS = FIGURES["header"]["steps_per_epoch"], FIGURES["header"]["num_epochs"]

#: The cases HAT's figures were measured for (the same arguments for both optimizers).
CASES = {
    "stepdecay-epoch-warmup-epoch": lambda p, kind: StepDecayOptimParamUpdater(
        p, update_by="epoch", warmup_by="epoch", warmup_len=1, param_decay_id=[2, 4], param_decay_factor=0.1),
    "stepdecay-epoch-warmup-step": lambda p, kind: StepDecayOptimParamUpdater(
        p, update_by="epoch", warmup_by="step", warmup_len=6, param_decay_id=[2, 4], param_decay_factor=0.5),
    "stepdecay-step-ratio": lambda p, kind: StepDecayOptimParamUpdater(
        p, update_by="step", warmup_by="step", warmup_len=3, warmup_param_ratio=0.5, param_decay_id=[5, 12]),
    "stepdecay-step-constant": lambda p, kind: StepDecayOptimParamUpdater(
        p, update_by="step", warmup_by="step", warmup_len=3, warmup_mode="constant", param_decay_id=[5, 12]),
    "cos-warmup-step": lambda p, kind: CosOptimParamUpdater(
        p, warmup_by="step", warmup_len=3, stop_param=1e-5 if kind == "sgd" else 0.5),
    "cos-warmup-epoch-max_steps": lambda p, kind: CosOptimParamUpdater(
        p, warmup_by="epoch", warmup_len=1, max_steps=16),
    "cos-decay-only": lambda p, kind: CosOptimParamUpdater(
        p, decay_only=True, stop_param=6e-5 if kind == "sgd" else 0.92),
    "cyclic": lambda p, kind: CyclicOptimParamUpdater(p, target_ratio=(1.05, 0.5), cyclic_times=2, step_ratio_up=0.4),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.head(torch.tanh(self.body(x))), y),)


def recording(base: type) -> type:
    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, param_name: str, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.param_name, self.seen = param_name, []

        def step(self, closure=None):
            values = [group[self.param_name] for group in self.param_groups]
            self.seen.append([float(v[0] if isinstance(v, tuple) else v) for v in values])
            return super().step(closure)

    return Recording


def make_optimizer(kind: str, model: Net):
    if kind == "sgd":
        groups = [{"params": model.body.parameters(), "weight_decay": 4e-5},
                  {"params": model.head.parameters(), "weight_decay": 1e-4}]
        return recording(torch.optim.SGD)(groups, lr=0.1, momentum=0.9, param_name="weight_decay"), "weight_decay"
    groups = [{"params": model.body.parameters(), "betas": (0.95, 0.99)},
              {"params": model.head.parameters(), "betas": (0.9, 0.999)}]
    return recording(torch.optim.AdamW)(groups, lr=0.001, param_name="betas"), "betas"


def make_data() -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g)) for _ in range(SPE)]


def fit(updater, optimizer, model, **loop) -> list[list[float]]:
    loop = {"num_epochs": EPOCHS, **loop}
    Trainer(
        model=model, data_loader=make_data(), optimizer=optimizer, device=None, callbacks=[updater],
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        **loop,
    ).fit()
    return optimizer.seen


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name", list(CASES))
def test_values_equal_hats_at_every_step_and_group(name, kind):
    torch.manual_seed(0)
    model = Net()
    optimizer, param = make_optimizer(kind, model)
    got = fit(CASES[name](param, kind), optimizer, model)
    want = FIGURES["cases"][f"{name}/{kind}"]
    assert len(got) == len(want) == SPE * EPOCHS
    for step, (ours, hats) in enumerate(zip(got, want)):
        for group, (a, b) in enumerate(zip(ours, hats)):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (step, group, a, b)
    if param == "betas":  # the second element of each tuple is left alone
        assert [g["betas"][1] for g in optimizer.param_groups] == [0.99, 0.999]
    assert [g[f"initial_{param}"] for g in optimizer.param_groups] == hats_first_row_bases(kind)


def hats_first_row_bases(kind: str) -> list[float]:
    return [4e-5, 1e-4] if kind == "sgd" else [0.95, 0.9]


def test_hooks_take_hats_keywords_and_expose_hats_attributes():
    """HAT's unit tests call the hooks with only the keywords they need and read these attributes."""
    model = Net()
    optimizer, _ = make_optimizer("adamw", model)
    loader = torch.utils.data.DataLoader(range(2), batch_size=1)
    cos = CosOptimParamUpdater("betas", warmup_by="epoch", warmup_len=1)
    cos.on_loop_begin(optimizer=optimizer, data_loader=loader, num_epochs=4)
    assert (cos.warmup_steps, cos.max_steps, cos._per_group_init_param) == (2, 6, [0.95, 0.9])
    cos.on_step_begin(optimizer=optimizer, epoch_id=1, step_id=1, global_step_id=3)
    # measured with HAT's CosOptimParamUpdater on the same calls
    assert math.isclose(optimizer.param_groups[0]["betas"][0], 0.8863620667976084, rel_tol=1e-12)

    step = StepDecayOptimParamUpdater("betas", update_by="step", warmup_by="step", warmup_len=3)
    step.on_loop_begin(optimizer=optimizer, data_loader=loader)
    step.on_step_begin(optimizer=optimizer, epoch_id=0, step_id=1, global_step_id=1)
    assert math.isclose(optimizer.param_groups[1]["betas"][0], 0.3, rel_tol=1e-12)
    assert CyclicOptimParamUpdater.annealing_cos(1.0, 0.0, 0.5) == pytest.approx(0.5)


def test_registered_under_hats_names():
    for name in ("StepDecayOptimParamUpdater", "CosOptimParamUpdater", "CyclicOptimParamUpdater"):
        up = build_from_cfg({"type": name, "param_name": "weight_decay"})
        assert type(up).__name__ == name and up.param_name == "weight_decay"


def test_a_missing_entry_or_length_is_named():
    model = Net()
    optimizer, _ = make_optimizer("sgd", model)
    with pytest.raises(ValueError, match=r"param_name='betas'\): param group 0 of .* has no 'betas'.*weight_decay"):
        CosOptimParamUpdater("betas").on_loop_begin(optimizer=optimizer, data_loader=[1, 2], num_epochs=1)
    gen = (i for i in range(3))  # no len(): an epoch warmup cannot be sized
    with pytest.raises(ValueError, match="steps per epoch"):
        StepDecayOptimParamUpdater("weight_decay", warmup_len=1).on_loop_begin(optimizer=optimizer, data_loader=gen)
    with pytest.raises(ValueError, match=r"param_decay_id=\[3, 1\]"):
        StepDecayOptimParamUpdater("weight_decay", param_decay_id=[3, 1])
    with pytest.raises(ValueError, match=r"warmup_param_ratio=2"):
        CosOptimParamUpdater("weight_decay", warmup_param_ratio=2)
