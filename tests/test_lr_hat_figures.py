"""The seven LR updaters against HAT's own figures, every param group at every step.

``tests/data/hat_lr_figures.json`` holds lrs measured with HAT's own LR updater classes driven
as HAT's loop drives its callbacks (its ``header`` says how). Here each case runs on our real
Trainer: a real model, a real SGD with two param groups (lr 0.1 and 0.01), 20 real batches per
epoch, the updater as the only callback. The optimizer records each group's lr inside
``step()``, where the lr is used, and every recorded lr must equal HAT's to a relative 1e-9.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from hat_ignite.callbacks import lr_updater
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

FIGURES = json.loads((Path(__file__).parent / "data" / "hat_lr_figures.json").read_text())
CASES = {case["name"]: case for case in FIGURES["cases"]}
SPE = FIGURES["header"]["steps_per_epoch"]
LRS = (0.1, 0.01)
TOL = 1e-9

#: Cases where we deliberately differ from HAT after a point: name -> (first differing global
#: step, what our lr is from there on, as a function of the group's base lr).
OUR_FIX = {
    # HAT's cosine goes back up after max_steps (cos of an angle past pi); ours stays at stop_lr.
    "cos-past-max_steps": (10 + 30, lambda base: 0.0),
}


class RecordingSGD(torch.optim.SGD):
    """SGD that records each param group's lr as it steps."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[list[float]] = []

    def step(self, closure=None):
        self.seen.append([float(group["lr"]) for group in self.param_groups])
        return super().step(closure)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(torch.tanh(self.head(torch.tanh(self.body(x)))), y),)


def make_data() -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g)) for _ in range(SPE)]


def build_updater(case: dict):
    return getattr(lr_updater, case["updater"])(**case["kwargs"])


def make_optimizer(model: Net) -> RecordingSGD:
    return RecordingSGD(
        [{"params": model.body.parameters(), "lr": LRS[0]}, {"params": model.head.parameters(), "lr": LRS[1]}],
        lr=LRS[0], momentum=0.9,
    )


def fit(case: dict, updater, optimizer: RecordingSGD, model: Net, **loop) -> list[list[float]]:
    loop = {**case["loop"], **loop}
    Trainer(
        model=model, data_loader=make_data(), optimizer=optimizer, device=None, callbacks=[updater],
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        **loop,
    ).fit()
    return optimizer.seen


def expected_rows(case: dict) -> list[tuple[int, list[float]]]:
    """HAT's (global_step_id, lrs) rows, with our deliberate fixes applied."""
    rows = [(g, lrs) for _, g, lrs in case["rows"]]
    fix = OUR_FIX.get(case["name"])
    if fix is not None:
        first, ours = fix
        rows = [(g, lrs if g < first else [ours(base) for base in LRS]) for g, lrs in rows]
    return rows


def assert_same(got: list[list[float]], want: list[tuple[int, list[float]]]) -> None:
    assert len(got) == len(want)
    for lrs, (g, hat_lrs) in zip(got, want):
        assert len(lrs) == len(hat_lrs) == 2
        for group, (ours, hat) in enumerate(zip(lrs, hat_lrs)):
            assert math.isclose(ours, hat, rel_tol=TOL, abs_tol=1e-15), (g, group, ours, hat)


@pytest.mark.parametrize("name", list(CASES))
def test_lrs_equal_hats_at_every_step_and_group(name):
    case = CASES[name]
    torch.manual_seed(0)
    model = Net()
    got = fit(case, build_updater(case), make_optimizer(model), model)
    assert_same(got, expected_rows(case))


def test_the_fix_cases_do_differ_from_hat():
    """The deliberate differences above are real: HAT's figures there are not ours."""
    rows = CASES["cos-past-max_steps"]["rows"]
    assert max(lrs[0] for _, g, lrs in rows if g > 40) > 0.05  # HAT's lr climbs back up


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if "resume_at" in case])
def test_resumed_mid_schedule_gives_the_same_lrs(name):
    """Stop after ``resume_at`` steps, restore the optimizer's and the updater's state into new
    ones (whose lrs are stale), start again there: the lrs are HAT's straight run's."""
    case = CASES[name]
    at = case["resume_at"]
    torch.manual_seed(0)
    model = Net()
    first_opt, first_up = make_optimizer(model), build_updater(case)
    first = fit(case, first_up, first_opt, model, stop_by="step", num_steps=at)
    want = expected_rows(case)
    assert_same(first, want[:at])

    model = Net()
    optimizer = make_optimizer(model)
    for group in optimizer.param_groups:
        group["lr"] = 0.5
    optimizer.load_state_dict(first_opt.state_dict())
    updater = build_updater(case)
    updater.load_state_dict(first_up.state_dict())
    got = fit(case, updater, optimizer, model, start_epoch=at // SPE, start_step=at)
    assert_same(got, want[at:])


def test_resume_with_the_updater_state_only_keeps_the_base_lrs():
    """A fresh optimizer at other lrs plus the updater's saved state: the saved base lrs rule."""
    case = CASES["cos-resume"]
    at = case["resume_at"]
    first_up = build_updater(case)
    torch.manual_seed(0)
    model = Net()
    fit(case, first_up, make_optimizer(model), model, stop_by="step", num_steps=at)
    assert first_up.state_dict() == {"base_lrs": list(LRS)}
    model = Net()
    optimizer = RecordingSGD([{"params": model.body.parameters(), "lr": 0.7},
                              {"params": model.head.parameters(), "lr": 0.3}], lr=0.7)
    updater = build_updater(case)
    updater.load_state_dict(first_up.state_dict())
    got = fit(case, updater, optimizer, model, start_epoch=at // SPE, start_step=at)
    assert_same(got, expected_rows(case)[at:])
