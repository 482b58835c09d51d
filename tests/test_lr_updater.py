"""The LR updaters against closed forms written here and against torch's own schedulers.

Each test trains a real model with a real optimizer (two param groups with different lrs) and
records every group's lr at each step begin, after the updater has set it.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.callbacks.lr_updater import (
    CosineAnnealingLrUpdater,
    CosLrUpdater,
    CyclicLrUpdater,
    NoamLrUpdater,
    OneCycleUpdater,
    PolyLrUpdater,
    StepDecayLrUpdater,
)
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

BASE_LRS = (0.1, 0.025)
STEPS_PER_EPOCH = 4


class TwoLayerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.head(torch.relu(self.body(x))), y),)


class RecordLr(CallbackMixin):
    """Records (epoch_id, global_step_id, [lr of each group]) at every step begin."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, list[float]]] = []

    def on_step_begin(self, optimizer, epoch_id, global_step_id, **kwargs):
        self.rows.append((epoch_id, global_step_id, [g["lr"] for g in optimizer.param_groups]))


def make_data(n_batches: int = STEPS_PER_EPOCH) -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)) for _ in range(n_batches)]


def train(updater, num_epochs: int = 3, lrs=BASE_LRS, data=None, **trainer_kwargs) -> list:
    torch.manual_seed(0)
    model = TwoLayerNet()
    optimizer = torch.optim.SGD(
        [{"params": model.body.parameters(), "lr": lrs[0]}, {"params": model.head.parameters(), "lr": lrs[1]}],
        lr=lrs[0], momentum=0.9,
    )
    record = RecordLr()
    if "num_steps" in trainer_kwargs:
        trainer_kwargs.setdefault("stop_by", "step")
    else:
        trainer_kwargs["num_epochs"] = num_epochs
    trainer = Trainer(
        model=model, data_loader=data if data is not None else make_data(), optimizer=optimizer,
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, callbacks=[updater, record], **trainer_kwargs,
    )
    trainer.fit()
    return record.rows


def torch_schedule(make_scheduler, n_updates: int, lrs=BASE_LRS) -> list[list[float]]:
    """The lrs torch's scheduler gives each group at updates 0..n_updates-1."""
    params = [nn.Parameter(torch.zeros(1)) for _ in lrs]
    optimizer = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=lrs[0])
    scheduler = make_scheduler(optimizer)
    out = []
    for _ in range(n_updates):
        out.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return out


def check(rows, expected_fn) -> None:
    """Every recorded lr equals expected_fn(base_lr, epoch_id, global_step_id)."""
    assert rows, "the run recorded no steps"
    for epoch_id, step, got in rows:
        want = [expected_fn(base, epoch_id, step) for base in BASE_LRS]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (epoch_id, step)


def cos_anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) * (1 + math.cos(math.pi * pct)) / 2


# -- polynomial --------------------------------------------------------------------------------
def test_poly_by_step_matches_formula_and_torch_polynomial_lr():
    total = 3 * STEPS_PER_EPOCH
    rows = train(PolyLrUpdater(max_update=total, power=2.0))
    check(rows, lambda b, e, g: b * (1 - g / total) ** 2)
    poly = torch.optim.lr_scheduler.PolynomialLR
    torch_lrs = torch_schedule(lambda o: poly(o, total_iters=total, power=2.0), total)
    for (_, g, got), want in zip(rows, torch_lrs):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), g


def test_poly_with_linear_step_warmup_and_final_lr():
    up = PolyLrUpdater(max_update=6, power=1.0, final_lr=0.001, warmup_len=3, warmup_begin_lr=0.002,
                       warmup_lr_ratio=0.5)

    def expected(b, e, g):
        if g < 3:
            return 0.002 + (0.5 * b - 0.002) * g / 3
        done = min(g - 3, 6)
        return 0.001 + (b - 0.001) * (1 - done / 6)

    rows = train(up)
    check(rows, expected)
    assert rows[-1][2] == pytest.approx([0.001, 0.001])  # past max_update the lr stays at final_lr


def test_poly_by_epoch_after_step_warmup_changes_on_epoch_begin():
    # warmup 6 steps = ceil(6 / 4) = 2 epochs in update units; formal lr follows epoch_id from the
    # first epoch that begins after the warmup; steps 6 and 7 keep the last warmup lr
    up = PolyLrUpdater(max_update=3, update_by="epoch", power=1.0, warmup_len=6, warmup_mode="linear",
                       warmup_lr_ratio=0.25)

    def expected(b, e, g):
        if e * STEPS_PER_EPOCH < 6:
            return 0.25 * b * min(g, 5) / 6
        return b * (1 - max(e - 2, 0) / 3)

    check(train(up, num_epochs=4), expected)


# -- step decay --------------------------------------------------------------------------------
def test_step_decay_by_epoch_matches_formula_and_torch_multistep_lr():
    rows = train(StepDecayLrUpdater(lr_decay_id=[1, 3], lr_decay_factor=0.5), num_epochs=4)
    check(rows, lambda b, e, g: b * 0.5 ** sum(e >= m for m in (1, 3)))
    torch_lrs = torch_schedule(lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[1, 3], gamma=0.5), 4)
    for epoch_id, _, got in rows:
        assert got == pytest.approx(torch_lrs[epoch_id], rel=1e-12)


def test_step_decay_with_epoch_warmup_ramps_every_step():
    # as in HAT, a warmup of 2 epochs is a warmup of 2 * 4 steps, the lr rising at each step
    up = StepDecayLrUpdater(warmup_len=2, warmup_begin_lr=0.001, lr_decay_id=[3], lr_decay_factor=0.1)

    def expected(b, e, g):
        if g < 2 * STEPS_PER_EPOCH:
            return 0.001 + (b - 0.001) * g / (2 * STEPS_PER_EPOCH)
        return b * (0.1 if e >= 3 else 1.0)

    check(train(up, num_epochs=4), expected)


def test_step_decay_inside_warmup_is_refused():
    with pytest.raises(ValueError, match="inside the warmup"):
        train(StepDecayLrUpdater(warmup_len=2, lr_decay_id=[1]))


# -- cosine ------------------------------------------------------------------------------------
def test_cos_by_step_matches_formula_and_torch_cosine_annealing():
    total = 3 * STEPS_PER_EPOCH
    rows = train(CosLrUpdater(stop_lr=0.001))  # max_steps=-1: the whole run
    check(rows, lambda b, e, g: cos_anneal(b, 0.001, g / total))
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR
    torch_lrs = torch_schedule(lambda o: cosine(o, T_max=total, eta_min=0.001), total)
    for (_, g, got), want in zip(rows, torch_lrs):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), g


def test_cos_with_epoch_warmup_decays_over_the_remaining_steps():
    up = CosLrUpdater(stop_lr=0.0, warmup_by="epoch", warmup_len=1, warmup_mode="constant", warmup_lr_ratio=0.1)
    span = 3 * STEPS_PER_EPOCH - STEPS_PER_EPOCH

    def expected(b, e, g):
        return 0.1 * b if e < 1 else cos_anneal(b, 0.0, (g - STEPS_PER_EPOCH) / span)

    check(train(up), expected)


def test_cos_stop_by_step_uses_num_steps():
    rows = train(CosLrUpdater(stop_lr=0.0), num_steps=10)
    assert len(rows) == 10
    check(rows, lambda b, e, g: cos_anneal(b, 0.0, g / 10))


@pytest.mark.parametrize(
    "build",
    [
        lambda: CosLrUpdater(stop_lr=0.001, warmup_len=2),
        lambda: CosineAnnealingLrUpdater(stop_lr=0.001, warmup_len=2),
        lambda: OneCycleUpdater(lr_max=0.1, pct_start=0.3, stop_lr=0.001),
        lambda: CyclicLrUpdater(cyclic_times=2),
    ],
)
def test_stop_by_step_without_num_epochs_sizes_the_schedule_by_num_steps(build):
    # HAT needs num_epochs for these (it fails without); ours falls back to num_steps: a
    # 3-epoch run stopped by step gets the lrs of the same run stopped by epoch
    by_step = train(build(), num_steps=3 * STEPS_PER_EPOCH)
    by_epoch = train(build(), num_epochs=3)
    assert [r[:2] for r in by_step] == [r[:2] for r in by_epoch]
    for (_, g, got), (_, _, want) in zip(by_step, by_epoch):
        assert got == pytest.approx(want, rel=1e-12), g


def test_cosine_annealing_by_epoch_matches_formula_and_torch():
    rows = train(CosineAnnealingLrUpdater(stop_lr=0.002), num_epochs=4)
    check(rows, lambda b, e, g: cos_anneal(b, 0.002, e / 4))
    torch_lrs = torch_schedule(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.002), 4)
    for epoch_id, _, got in rows:
        assert got == pytest.approx(torch_lrs[epoch_id], rel=1e-9, abs=1e-12)


def test_cosine_annealing_keeps_the_warmup_lr_until_the_next_epoch():
    # the 5-step warmup ends inside epoch 1 (steps 4..7): steps 5..7 keep the lr of step 4
    up = CosineAnnealingLrUpdater(stop_lr=0.0, warmup_len=5, warmup_begin_lr=0.0)

    def expected(b, e, g):
        return b * min(g, 4) / 5 if e * STEPS_PER_EPOCH < 5 else cos_anneal(b, 0.0, e / 3)

    check(train(up), expected)


# -- one cycle ---------------------------------------------------------------------------------
def test_one_cycle_rises_from_lr_max_over_div_to_each_groups_lr():
    # as in HAT: every group starts at lr_max / div_factor and peaks at its own lr after
    # pct_start * total steps (fractional here: 3.6), then falls to stop_lr
    total, lr_max, div, pct, stop = 3 * STEPS_PER_EPOCH, 0.4, 8.0, 0.3, 0.0005
    rows = train(OneCycleUpdater(lr_max=lr_max, div_factor=div, pct_start=pct, stop_lr=stop))
    rise = pct * total

    def expected(b, e, g):
        if g < rise:
            return cos_anneal(lr_max / div, b, g / rise)
        return cos_anneal(b, stop, (g - rise) / (total - rise))

    check(rows, expected)
    assert rows[0][2] == pytest.approx([lr_max / div] * 2)


# -- cyclic and noam ---------------------------------------------------------------------------
def test_cyclic_two_cycles_follow_formula():
    up = CyclicLrUpdater(target_ratio=(5, 0.01), cyclic_times=2, step_ratio_up=0.4)
    cycle, rise = 3 * STEPS_PER_EPOCH // 2, int(0.4 * (3 * STEPS_PER_EPOCH // 2))

    def expected(b, e, g):
        n = g % cycle
        if n < rise:
            return cos_anneal(b, 5 * b, n / rise)
        return cos_anneal(5 * b, 0.01 * b, (n - rise) / (cycle - rise))

    rows = train(up)
    check(rows, expected)
    assert rows[0][2] == pytest.approx(list(BASE_LRS)) and rows[cycle][2] == pytest.approx(list(BASE_LRS))


def test_noam_follows_formula():
    rows = train(NoamLrUpdater(d_model=64, warmup_step=5))
    # d_model ** 0.5, as HAT's code computes it (its docstring says ** -0.5)
    check(rows, lambda b, e, g: b * 64 ** 0.5 * min((g + 1) ** -0.5, (g + 1) * 5 ** -1.5))


# -- resume and state --------------------------------------------------------------------------
def test_resumed_run_gets_the_same_lrs_from_the_saved_base_lrs():
    straight = train(CosLrUpdater(stop_lr=0.0, warmup_len=2), num_epochs=3)
    first = CosLrUpdater(stop_lr=0.0, warmup_len=2)
    train(first, num_epochs=3)
    resumed = CosLrUpdater(stop_lr=0.0, warmup_len=2)
    resumed.load_state_dict(first.state_dict())
    assert resumed.state_dict() == {"base_lrs": list(BASE_LRS)}
    # the new optimizer starts from other lrs, as one restored mid-schedule would
    rows = train(resumed, num_epochs=3, lrs=(0.7, 0.3), start_epoch=1)
    assert [r[:2] for r in rows] == [r[:2] for r in straight[STEPS_PER_EPOCH:]]
    for (_, g, got), (_, _, want) in zip(rows, straight[STEPS_PER_EPOCH:]):
        assert got == pytest.approx(want, rel=1e-12), g


def test_restored_base_lrs_must_match_the_param_groups():
    up = PolyLrUpdater(max_update=3)
    up.load_state_dict({"base_lrs": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match="3 base lr"):
        train(up)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: PolyLrUpdater(max_update=0), "max_update"),
        (lambda: PolyLrUpdater(max_update=3, update_by="iter"), "update_by"),
        (lambda: CosLrUpdater(warmup_mode="exp"), "warmup_mode"),
        (lambda: CosLrUpdater(warmup_lr_ratio=1.5), "warmup_lr_ratio"),
        (lambda: CosLrUpdater(warmup_len=-1), "warmup_len"),
        (lambda: CosLrUpdater(warmup_len="1"), "warmup_len"),
        (lambda: CosLrUpdater(max_epoch=1.5), "max_epoch"),
        (lambda: StepDecayLrUpdater(lr_decay_id=[3, 1]), "lr_decay_id"),
        (lambda: OneCycleUpdater(pct_start=1.0), "pct_start"),
        (lambda: CyclicLrUpdater(target_ratio=(10,)), "target_ratio"),
        (lambda: NoamLrUpdater(warmup_step=0), "warmup_step"),
    ],
)
def test_bad_arguments_are_refused_at_build_time(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_epoch_schedule_needs_a_loader_length():
    class Stream:
        def __iter__(self):
            return iter(make_data())

    with pytest.raises(ValueError, match="CosineAnnealingLrUpdater needs the run's number of epochs"):
        train(CosineAnnealingLrUpdater(), data=Stream(), num_steps=4)


@pytest.mark.parametrize(
    "updater",
    [PolyLrUpdater(max_update=4, warmup_by="epoch", warmup_len=1), StepDecayLrUpdater(lr_decay_id=[1], warmup_len=1),
     CosLrUpdater(warmup_by="epoch", warmup_len=1)],
)
def test_a_loader_without_length_fails_as_hats_assert(updater):
    # HAT asserts the loader has a length here: HAT code catching AssertionError still catches ours
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    stream = (i for i in range(3))  # no len()
    with pytest.raises(AssertionError, match="needs the steps per epoch") as caught:
        updater.on_loop_begin(optimizer=optimizer, data_loader=stream, num_epochs=2)
    assert isinstance(caught.value, ValueError)


def test_epoch_only_schedules_attach_no_step_begin_handler():
    by_epoch = StepDecayLrUpdater(lr_decay_id=[1])
    step_warmup = StepDecayLrUpdater(lr_decay_id=[1], warmup_by="step", warmup_len=2)
    by_step = StepDecayLrUpdater(lr_decay_id=[5], update_by="step")
    assert "on_step_begin" not in by_epoch.overridden_hooks() and "on_epoch_begin" in by_epoch.overridden_hooks()
    assert "on_step_begin" in step_warmup.overridden_hooks() and "on_step_begin" in by_step.overridden_hooks()
    rows = train(by_epoch, num_epochs=3)  # every step still sees its epoch's lr
    check(rows, lambda b, e, g: b * (0.1 if e >= 1 else 1.0))
