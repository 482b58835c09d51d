"""Built-in callbacks called as HAT's own loop (and HAT's unit tests) call their hooks.

HAT's loop passes fewer keywords than ours (no ``num_epochs`` to ``StepDecayLrUpdater``'s loop
begin, no ``model`` to ``GradScale``'s, the step id first to the EMA's step end, no ``epoch_id``
to TensorBoard's batch end); each hook must work with only those. The LR updaters' expected lrs
and attributes were measured by running HAT's own LR updater classes through the same calls
(``warmup_epochs = ceil(warmup_len / len(data_loader))`` for a step warmup,
``CosLrUpdater.max_steps = num_epochs * len(data_loader) - warmup_steps`` after loop begin,
``OneCycleUpdater.warmup_begin_lr = lr_max / div_factor``). One deliberate difference: HAT
keeps the ``max_steps`` of a first loop begin on a second one; ours derives it anew.
"""

from __future__ import annotations

import torch
from torch import nn

from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.ema import ExponentialMovingAverage
from hat_ignite.callbacks.grad_scale import GradScale
from hat_ignite.callbacks.lr_updater import CosLrUpdater, OneCycleUpdater, PolyLrUpdater, StepDecayLrUpdater
from hat_ignite.callbacks.stats_monitor import StatsMonitor
from hat_ignite.callbacks.tensorboard import TensorBoard
from hat_ignite.visualize.event_file import read_scalars


def _opt(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=lr)


def _loader(n: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(range(n), batch_size=1)


def test_step_decay_loop_begin_takes_only_hat_keywords():
    up = StepDecayLrUpdater(update_by="epoch", warmup_by="epoch", warmup_len=1, lr_decay_id=[2], lr_decay_factor=0.1)
    opt = _opt()
    up.on_loop_begin(optimizer=opt, data_loader=_loader(4))
    up.on_step_begin(optimizer=opt, epoch_id=0, step_id=2, global_step_id=2)
    assert abs(opt.param_groups[0]["lr"] - 0.1 * 2 / 4) < 1e-12
    up.on_epoch_begin(optimizer=opt, epoch_id=3, global_step_id=12)
    assert abs(opt.param_groups[0]["lr"] - 0.01) < 1e-12


def test_warmup_epochs_as_hat_reads_it():
    by_epoch = PolyLrUpdater(max_update=4, warmup_by="epoch", warmup_len=3)
    assert by_epoch.warmup_epochs == 3
    by_step = PolyLrUpdater(max_update=4, update_by="epoch", warmup_by="step", warmup_len=3)
    assert by_step.warmup_epochs is None
    by_step.on_loop_begin(optimizer=_opt(), data_loader=_loader(2))
    assert by_step.warmup_epochs == 2  # ceil(3 / 2)


def test_cos_max_steps_after_loop_begin():
    up = CosLrUpdater(warmup_len=2)
    assert up.max_steps == -1
    up.on_loop_begin(optimizer=_opt(), data_loader=_loader(5), num_epochs=3)
    assert up.max_steps == 3 * 5 - 2
    up.on_loop_begin(optimizer=_opt(), data_loader=_loader(4), num_epochs=2)  # recomputed from the argument
    assert up.max_steps == 2 * 4 - 2
    assert CosLrUpdater(max_steps=7).max_steps == 7


def test_one_cycle_warmup_begin_lr():
    up = OneCycleUpdater(lr_max=0.1, div_factor=10.0, pct_start=0.5)
    assert abs(up.warmup_begin_lr - 0.01) < 1e-15
    opt = _opt(0.05)
    up.on_loop_begin(optimizer=opt, data_loader=_loader(2), num_epochs=2)
    assert up.max_steps == 2.0
    up.on_step_begin(optimizer=opt, epoch_id=0, step_id=0, global_step_id=0)
    assert abs(opt.param_groups[0]["lr"] - 0.01) < 1e-12


def test_grad_scale_loop_begin_without_keywords():
    model = nn.Linear(2, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cb = GradScale(module_and_scale=[("weight", 0.1), ("bias", 10)])
    cb.on_loop_begin()
    model(torch.ones(1, 2)).sum().backward()
    w, b = model.weight.grad.clone(), model.bias.grad.clone()
    cb.on_backward_end(model, batch=None, optimizer=opt)
    cb.on_optimizer_step_begin(model, optimizer=opt)
    assert torch.equal(model.weight.grad, w * 0.1) and torch.equal(model.bias.grad, b * 10)


class _HatLoop:
    ema_model = None


def test_ema_called_as_hat_calls_it():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    loop = _HatLoop()
    ema = ExponentialMovingAverage(decay=0.5, decay_base=1.0)
    ema.on_loop_begin(loop=loop, model=model)
    assert loop.ema_model is ema.ema_model
    before = loop.ema_model.weight.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.on_step_end(0, model=model, ema_model=loop.ema_model)
    d = ema.decay_at(1)
    assert torch.allclose(loop.ema_model.weight, before * d + (1 - d) * model.weight)
    ema.on_step_end(1)  # no model: nothing to average
    assert ema.updates == 1


def test_tensorboard_hooks_without_loop_begin(tmp_path):
    seen = []

    def by_step(writer, model_outs, global_step_id):
        seen.append(global_step_id)
        writer.add_scalar("x", 1.0, global_step_id)

    tb = TensorBoard(save_dir=str(tmp_path / "s"), update_freq=2, tb_update_funcs=[by_step])
    by_epoch = TensorBoard(save_dir=str(tmp_path / "e"), update_freq=1, update_by="epoch")
    outs = {"loss1": torch.tensor([1.0])}
    for step in range(4):
        tb.on_batch_end(model_outs=outs, global_step_id=step)
        by_epoch.on_batch_end(model_outs=outs, global_step_id=step, bad_param=1)
    tb.on_epoch_end(epoch_id=0, bad_param=1)
    by_epoch.on_epoch_end(epoch_id=0)
    tb.close()
    by_epoch.close()
    assert seen == [0, 2]  # HAT's rule: global_step_id % update_freq == 0
    assert [step for step, _ in read_scalars(str(tmp_path / "e"))["loss/loss1"]] == [0]


def test_checkpoint_saves_from_the_keywords_given(tmp_path):
    model, ema_model = nn.Linear(2, 1), nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = Checkpoint(save_dir=str(tmp_path / "s"), interval_by="step")
    ck.on_step_end(epoch_id=0, step_id=0, global_step_id=0, val_metrics=None, model=model, ema_model=None,
                   optimizer=opt, num_steps=None)
    assert any(p.name.startswith("checkpoint-step-0-") for p in (tmp_path / "s").iterdir())
    ck.on_loop_end(model=None, ema_model=ema_model, optimizer=None, storage=None, epoch_id=3, global_step_id=77)
    saved = torch.load(ck.last_path, weights_only=False)
    assert (saved["epoch"], saved["step"]) == (3, 77)
    assert torch.equal(saved["state_dict"]["weight"], ema_model.weight)  # only the EMA copy was given
    by_epoch = Checkpoint(save_dir=str(tmp_path / "e"), interval_by="epoch")
    by_epoch.on_epoch_end(epoch_id=0, global_step_id=0, model=model, ema_model=None, optimizer=opt,
                          num_epochs=None, val_metrics=None)
    saved = torch.load(by_epoch.last_path, weights_only=False)
    assert torch.equal(saved["state_dict"]["weight"], model.weight) and saved["optimizer"] is not None


def test_tensorboard_writes_hat_steps_and_epochs(tmp_path):
    # HAT writes step s when s % update_freq == 0, and epoch e when e % update_freq == 0
    by_step = TensorBoard(save_dir=str(tmp_path / "s"), update_freq=3)
    by_epoch = TensorBoard(save_dir=str(tmp_path / "e"), update_freq=2, update_by="epoch")
    outs = {"cls_loss": torch.tensor(1.0)}
    for epoch in range(3):
        for step in range(epoch * 4, epoch * 4 + 4):
            for board in (by_step, by_epoch):
                board.on_batch_end(model_outs=outs, epoch_id=epoch, global_step_id=step)
        for board in (by_step, by_epoch):
            board.on_epoch_end(epoch_id=epoch, global_step_id=epoch * 4 + 4)
    by_step.close()
    by_epoch.close()
    assert [s for s, _ in read_scalars(str(tmp_path / "s"))["loss/cls_loss"]] == [0, 3, 6, 9]
    assert [s for s, _ in read_scalars(str(tmp_path / "e"))["loss/cls_loss"]] == [4, 12]  # epochs 0 and 2


def test_checkpoint_loop_end_alone_saves_last(tmp_path):
    # HAT's tests call on_loop_end first thing: the save_dir is made there too
    ck = Checkpoint(save_dir=str(tmp_path / "new"), interval_by="epoch", mode="max", monitor_metric_key="accuracy")
    ck.on_loop_end(model=nn.Linear(2, 1), ema_model=None, optimizer=None, storage=None, epoch_id=4, global_step_id=9)
    saved = torch.load(ck.last_path, weights_only=False)
    assert (saved["epoch"], saved["step"]) == (4, 9)


def test_checkpoint_on_loop_begin_without_loop(tmp_path):
    model = nn.Linear(2, 1)
    ck = Checkpoint(save_dir=str(tmp_path / "ck"), interval_by="step")
    ck.on_loop_begin()
    ck.on_step_end(epoch_id=0, step_id=0, global_step_id=0, model=model, optimizer=None, val_metrics=None)
    assert any(p.name.startswith("checkpoint-step-0") for p in (tmp_path / "ck").iterdir())


def test_stats_monitor_without_loop_and_storage():
    opt = _opt(0.05)
    sm = StatsMonitor(log_freq=1)
    sm.on_loop_begin()
    sm.on_epoch_begin()
    sm.on_step_end(epoch_id=0, step_id=0, global_step_id=0, optimizer=opt)
    storage: dict = {}
    sm.on_step_end(epoch_id=0, step_id=1, global_step_id=1, optimizer=opt, storage=storage)
    assert storage["stats"]["global_step_id"] == 1 and storage["stats"]["lr"] == 0.05
