"""Batch processors: accumulation, AMP, channels_last, guards, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, Predictor, Trainer, collect_loss_by_index
from hat_ignite.errors import NonFiniteLossError


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x, y):
        pred = self.net(x)
        return nn.functional.mse_loss(pred, y), pred


def chunks(x, y, k):
    return [(a, b) for a, b in zip(x.chunk(k), y.chunk(k))]


def train(model, data, processor, **kw):
    trainer = Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                      batch_processor=processor, device=None, **kw)
    trainer.fit()
    return trainer


def proc(**kw):
    return BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), **kw)


@pytest.mark.parametrize("k", [2, 4])
def test_grad_accumulation_equals_one_step_on_the_concatenated_batch(k):
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randn(16, 1)
    base = Regressor()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    train(a, [(x, y)], proc(), num_epochs=1)
    train(b, chunks(x, y, k), proc(grad_accumulation_step=k), num_epochs=1)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_incomplete_last_group_of_an_epoch_is_flushed_as_its_own_mean():
    torch.manual_seed(1)
    x, y = torch.randn(10, 6), torch.randn(10, 1)
    base = Regressor()
    # 5 micro-batches, k=3: groups [0,1,2] and [3,4]; the last group must update too
    ref = copy.deepcopy(base)
    train(ref, [(x[:6], y[:6]), (x[6:], y[6:])], proc(), num_epochs=1)
    acc = copy.deepcopy(base)
    train(acc, chunks(x, y, 5), proc(grad_accumulation_step=3), num_epochs=1)
    for pa, pb in zip(ref.parameters(), acc.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_loader_without_length_flushes_at_epoch_end():
    torch.manual_seed(2)
    x, y = torch.randn(10, 6), torch.randn(10, 1)
    base = Regressor()
    ref = copy.deepcopy(base)
    train(ref, [(x[:6], y[:6]), (x[6:], y[6:])], proc(), num_epochs=1)

    class NoLen:
        def __iter__(self):
            return iter(chunks(x, y, 5))

    acc = copy.deepcopy(base)
    train(acc, NoLen(), proc(grad_accumulation_step=3), num_epochs=1)
    for pa, pb in zip(ref.parameters(), acc.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_multi_batch_accumulation_matches_basic_on_the_same_batches():
    torch.manual_seed(3)
    x, y = torch.randn(12, 6), torch.randn(12, 1)
    base = Regressor()
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    parts = chunks(x, y, 4)
    train(a, [(x[:6], y[:6]), (x[6:], y[6:])], proc(), num_epochs=1)
    multi = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                                grad_accumulation_step=2, delay_sync=True)
    # two steps of two batches each, accumulated over 2 steps: the sum of 4 losses / 2
    train(b, [tuple(parts[:2]), tuple(parts[2:])], multi, num_epochs=1)
    # reference for "sum of the step's batch losses, averaged over the group": x2 learning rate
    c = copy.deepcopy(base)
    opt = torch.optim.SGD(c.parameters(), lr=0.05)
    opt.zero_grad()
    sum(c(*p)[0] for p in parts).div(2).backward()
    opt.step()
    for pb, pc in zip(b.parameters(), c.parameters()):
        torch.testing.assert_close(pb, pc, rtol=1e-5, atol=1e-6)


class DtypeProbe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 1)
        self.dtypes: list = []

    def forward(self, x, y):
        out = self.fc(x)
        self.dtypes.append(out.dtype)
        return nn.functional.mse_loss(out.float(), y), out


def test_bf16_autocast_changes_the_forward_dtype_on_cpu_without_a_scaler():
    data = [(torch.randn(4, 6), torch.randn(4, 1))]
    m = DtypeProbe()
    p = proc(enable_amp=True, enable_amp_dtype=torch.bfloat16)
    train(m, data, p, num_epochs=1)
    assert m.dtypes == [torch.bfloat16]
    assert p.grad_scaler is None
    m2 = DtypeProbe()
    train(m2, data, proc(), num_epochs=1)
    assert m2.dtypes == [torch.float32]


def test_bf16_from_a_config_string():
    m = DtypeProbe()
    train(m, [(torch.randn(4, 6), torch.randn(4, 1))], proc(enable_amp=True, enable_amp_dtype="bfloat16"), num_epochs=1)
    assert m.dtypes == [torch.bfloat16]


def test_fp16_amp_creates_a_grad_scaler_for_the_device():
    p = proc(enable_amp=True, enable_amp_dtype=torch.float16)
    m = DtypeProbe()
    train(m, [(torch.randn(4, 6), torch.randn(4, 1))], p, num_epochs=1)
    assert isinstance(p.grad_scaler, torch.amp.GradScaler)
    assert m.dtypes == [torch.float16]


def test_channels_last_converts_only_the_named_keys():
    seen = {}

    class DictNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 1)

        def forward(self, batch):
            seen["img"] = batch["img"].is_contiguous(memory_format=torch.channels_last)
            seen["aux"] = batch["aux"].is_contiguous(memory_format=torch.channels_last)
            return {"loss": self.conv(batch["img"]).mean() + batch["aux"].mean() * 0}

    batch = {"img": torch.randn(2, 3, 4, 4), "aux": torch.randn(2, 3, 4, 4)}
    m = DictNet()
    p = BasicBatchProcessor(need_grad_update=True, loss_collector=lambda o: [o["loss"]],
                            enable_channels_last=True, channels_last_keys=["img"])
    train(m, [batch], p, num_epochs=1)
    assert seen == {"img": True, "aux": False}
    p_all = BasicBatchProcessor(need_grad_update=True, loss_collector=lambda o: [o["loss"]], enable_channels_last=True)
    train(DictNet(), [batch], p_all, num_epochs=1)
    assert seen == {"img": True, "aux": True}


def test_apex_is_refused_with_the_native_flags_named():
    with pytest.raises(ValueError, match="enable_amp=True.*enable_amp_dtype"):
        BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), enable_apex=True)
    with pytest.raises(ValueError, match="Apex is not supported"):
        MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), enable_apex=True)


def test_training_needs_a_loss_collector_and_a_valid_accumulation_step():
    with pytest.raises(ValueError, match="loss_collector"):
        BasicBatchProcessor(need_grad_update=True)
    with pytest.raises(ValueError, match="grad_accumulation_step"):
        proc(grad_accumulation_step=0)
    assert MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                               grad_accumulation_step="3").grad_accumulation_step == 3


def test_non_finite_loss_stops_the_run_naming_step_and_losses():
    class Exploding(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 1)

        def forward(self, x, y):
            loss = nn.functional.mse_loss(self.fc(x), y)
            return {"mse_loss": loss * (float("nan") if x[0, 0] > 100 else 1.0), "pred": self.fc(x)}

    good = (torch.randn(4, 6), torch.randn(4, 1))
    bad_x = torch.randn(4, 6)
    bad_x[0, 0] = 1000.0
    m = Exploding()
    snapshots = []

    class Snap(CallbackMixin):
        def on_step_end(self, model, **kw):
            snapshots.append([p.detach().clone() for p in model.parameters()])

    p = BasicBatchProcessor(need_grad_update=True, loss_collector=lambda o: [o["mse_loss"]])
    with pytest.raises(NonFiniteLossError) as info:
        train(m, [good, good, (bad_x, good[1])], p, num_epochs=1, callbacks=[Snap()])
    msg = str(info.value)
    assert "global_step_id=2" in msg and "epoch_id=0" in msg and "mse_loss=nan" in msg
    assert "check_finite_loss=False" in msg
    # plain SGD cannot skip on the device: the flags of the last step are read at the epoch's end
    assert len(snapshots) == 3 and "do not save them" in msg
    # turned off, training goes on (and the parameters become NaN)
    m2 = Exploding()
    p2 = BasicBatchProcessor(need_grad_update=True, loss_collector=lambda o: [o["mse_loss"]], check_finite_loss=False)
    train(m2, [good, (bad_x, good[1])], p2, num_epochs=1)
    assert any(torch.isnan(q).any() for q in m2.parameters())


def test_eval_processor_runs_without_grad_and_leaves_parameters_alone():
    m = Regressor()
    before = copy.deepcopy(m.state_dict())
    outs = []

    class Keep(CallbackMixin):
        def on_batch_end(self, model_outs, **kw):
            outs.append(model_outs)

    data = [(torch.randn(3, 6), torch.randn(3, 1))]
    Predictor(m, data, BasicBatchProcessor(need_grad_update=False), callbacks=[Keep()]).fit()
    assert not outs[0][0].requires_grad
    assert not m.training
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_batch_and_inverse_transforms():
    calls = []

    def scale(batch):
        calls.append("t")
        return (batch[0] * 0, batch[1])

    def inverse(model_outs, batch):
        calls.append("inv")
        return (model_outs[0], model_outs[1] + 1)

    got = {}

    class Keep(CallbackMixin):
        def on_batch_end(self, model_outs, batch, **kw):
            got["pred"], got["x"] = model_outs[1], batch[0]

    m = Regressor()
    train(m, [(torch.randn(3, 6), torch.randn(3, 1))],
          proc(batch_transforms=[scale], inverse_transforms=inverse), num_epochs=1, callbacks=[Keep()])
    assert calls == ["t", "inv"]
    assert torch.equal(got["x"], torch.zeros(3, 6))


def test_device_moves_are_recursive_and_keep_container_types():
    from collections import namedtuple

    from hat_ignite.engine.processors.base import move_to_device

    Pair = namedtuple("Pair", "a b")
    batch = {"x": [torch.ones(2), (torch.zeros(1), "tag")], "p": Pair(torch.ones(1), 3)}
    moved = move_to_device(batch, torch.device("meta"))
    assert moved["x"][0].device.type == "meta" and moved["x"][1][0].device.type == "meta"
    assert isinstance(moved["x"][1], tuple) and moved["x"][1][1] == "tag"
    assert isinstance(moved["p"], Pair) and moved["p"].a.device.type == "meta" and moved["p"].b == 3


def test_a_users_processor_with_its_own_call_runs_whole_epochs():
    """A HAT user's processor subclasses the mixin and writes ``__call__`` itself, without the
    mixin's setup: the epoch end must not need what only the shipped processors set up."""
    from hat_ignite.engine.processors import BatchProcessorMixin

    class PlainProcessor(BatchProcessorMixin):
        need_grad_update = True

        def __call__(self, engine, batch):
            engine.optimizer.zero_grad()
            x, y = batch
            loss = nn.functional.mse_loss(engine.model(x), y)
            loss.backward()
            engine.optimizer.step()
            return loss

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]
    before = model.weight.detach().clone()
    trainer = Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      batch_processor=PlainProcessor(), device=None, num_epochs=2)
    state = trainer.fit()
    assert (state.epoch, state.iteration) == (2, 6)
    assert not torch.equal(before, model.weight)
