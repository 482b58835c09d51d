"""The exact HAT event order and keyword values, recorded by a callback."""

from __future__ import annotations

import torch
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import (
    HOOK_EVENTS, HOOK_KWARGS, BasicBatchProcessor, HatEvents, MultiBatchProcessor, Trainer, collect_loss_by_index,
)
from hat_ignite.engine.state import COMMON_KWARGS
from hat_style import HatStyleBase

IDS = ("epoch_id", "step_id", "global_step_id")


#: The keywords HAT's own loop (hat/engine/loop_base.py) and batch processors
#: (hat/engine/processors/processor.py) pass to each hook; ours pass at least these.
HAT_PASSES = {
    "on_loop_begin": {"model", "optimizer", "data_loader", "num_epochs", "num_steps", "loop", "train_metrics",
                      "val_metrics", "storage", "profiler"},
    "on_epoch_begin": {"model", "epoch_id", "optimizer", "global_step_id", "train_metrics", "val_metrics",
                       "storage", "data_loader", "profiler"},
    "on_step_begin": {"model", "optimizer", *IDS, "data_loader", "start_epoch", "start_step", "train_metrics",
                      "val_metrics", "storage", "profiler"},
    "on_batch_begin": {"batch", "batch_idx", *IDS, "train_metrics", "val_metrics", "storage"},
    "on_forward_begin": {"batch", "model", *IDS},
    "on_forward_end": {"model_outs", "batch_idx", *IDS},
    "on_backward_begin": {"model", "optimizer", "batch", *IDS},
    "on_backward_end": {"model", "optimizer", "batch", "batch_idx", "grad_scaler", *IDS},
    "on_optimizer_step_begin": {"model", "optimizer", "grad_scaler", *IDS},
    "on_batch_end": {"batch", "losses", "model_outs", *IDS, "train_metrics", "val_metrics", "storage"},
    "on_step_end": {*IDS, "data_loader", "model", "ema_model", "optimizer", "num_steps", "device", "callbacks",
                    "train_metrics", "val_metrics", "storage", "profiler"},
    "on_epoch_end": {"epoch_id", "global_step_id", "model", "ema_model", "optimizer", "num_epochs", "device",
                     "callbacks", "train_metrics", "val_metrics", "storage", "profiler"},
    "on_loop_end": {"model", "ema_model", "optimizer", "epoch_id", "global_step_id", "device", "train_metrics",
                    "val_metrics", "callbacks", "storage", "profiler"},
}


def _recording(hook: str):
    def method(self, **kw):
        self._record(hook, kw)

    method.__name__ = hook
    return method


class Recorder(HatStyleBase):
    """Records (hook, ids) for every one of the 13 hooks and checks each call's keyword names."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _record(self, hook: str, kwargs: dict) -> None:
        assert set(kwargs) == set(HOOK_KWARGS[hook]) | set(COMMON_KWARGS), hook
        assert HAT_PASSES[hook] <= set(kwargs), (hook, HAT_PASSES[hook] - set(kwargs))
        ids = tuple(kwargs[k] for k in (*IDS, "batch_idx") if k in kwargs)
        self.calls.append((hook, *ids))

    for _hook in HOOK_KWARGS:
        locals()[_hook] = _recording(_hook)
    del _hook


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


def make_data(n_batches: int, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n_batches)]


def make_trainer(data, processor=None, **kwargs) -> tuple[Trainer, Recorder, TinyNet]:
    torch.manual_seed(0)
    model = TinyNet()
    rec = Recorder()
    processor = processor or BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    trainer = Trainer(
        model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        batch_processor=processor, device=None, callbacks=[rec], **kwargs,
    )
    return trainer, rec, model


BATCH_HOOKS = ("on_batch_begin", "on_forward_begin", "on_forward_end", "on_backward_begin", "on_backward_end")


def step_calls(epoch_id: int, step_id: int, global_step_id: int, batches: int | None = None) -> list[tuple]:
    """HAT's order inside a step: a BasicBatchProcessor (``batches=None``) steps the optimizer
    before ``on_batch_end``, a MultiBatchProcessor after the last batch's ``on_batch_end``."""
    ids = (epoch_id, step_id, global_step_id)
    calls = [("on_step_begin", *ids)]
    if batches is None:
        calls += [(hook, *ids, 0) for hook in BATCH_HOOKS]
        calls += [("on_optimizer_step_begin", *ids), ("on_batch_end", *ids, 0)]
    else:
        for b in range(batches):
            calls += [(hook, *ids, b) for hook in (*BATCH_HOOKS, "on_batch_end")]
        calls += [("on_optimizer_step_begin", *ids)]
    return calls + [("on_step_end", *ids)]


def test_the_thirteen_hooks_in_hat_order():
    assert list(HOOK_EVENTS) == [
        "on_loop_begin", "on_epoch_begin", "on_step_begin", "on_batch_begin", "on_forward_begin", "on_forward_end",
        "on_backward_begin", "on_backward_end", "on_optimizer_step_begin", "on_batch_end", "on_step_end",
        "on_epoch_end", "on_loop_end",
    ]
    assert set(HOOK_KWARGS) == set(HOOK_EVENTS) == set(HAT_PASSES)


def test_stop_by_epoch_order_and_ids():
    trainer, rec, _ = make_trainer(make_data(2), num_epochs=2)
    trainer.fit()
    expected = [("on_loop_begin",)]
    g = 0
    for epoch in range(2):
        expected.append(("on_epoch_begin", epoch, g))
        for step in range(2):
            expected += step_calls(epoch, step, g)
            g += 1
        expected.append(("on_epoch_end", epoch, g))
    expected.append(("on_loop_end", 2, g))  # HAT's epoch counter after the loop: past the last epoch
    assert rec.calls == expected
    assert not hasattr(Recorder, "attach")  # attached as HAT's callbacks are: by their hooks


def test_stop_by_step_crossing_an_epoch_boundary_closes_the_last_epoch():
    trainer, rec, _ = make_trainer(make_data(3), stop_by="step", num_steps=5)
    trainer.fit()
    expected = [("on_loop_begin",), ("on_epoch_begin", 0, 0)]
    expected += step_calls(0, 0, 0) + step_calls(0, 1, 1) + step_calls(0, 2, 2)
    expected += [("on_epoch_end", 0, 3), ("on_epoch_begin", 1, 3)]
    expected += step_calls(1, 0, 3) + step_calls(1, 1, 4)
    expected += [("on_epoch_end", 1, 5), ("on_loop_end", 2, 5)]
    assert rec.calls == expected
    # on_step_begin fires exactly once per step (HAT fired one more at an epoch's end)
    assert sum(c[0] == "on_step_begin" for c in rec.calls) == 5


def test_multi_batch_processor_two_batches_per_step_one_optimizer_step():
    data = [tuple(make_data(2, seed=s)) for s in range(2)]  # each step: a tuple of 2 batches
    processor = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    trainer, rec, model = make_trainer(data, processor=processor, num_epochs=1)
    steps = []
    orig_step = trainer.optimizer.step

    def counting_step(*a, **k):
        steps.append(trainer.state.iteration)
        return orig_step(*a, **k)

    trainer.optimizer.step = counting_step
    trainer.fit()
    expected = [("on_loop_begin",), ("on_epoch_begin", 0, 0)]
    expected += step_calls(0, 0, 0, batches=2) + step_calls(0, 1, 1, batches=2)
    expected += [("on_epoch_end", 0, 2), ("on_loop_end", 1, 2)]
    assert rec.calls == expected
    assert steps == [1, 2]  # one optimizer step per training step, after both batches
    assert isinstance(trainer.state.output, list) and len(trainer.state.output) == 2


def test_num_epochs_zero_runs_loop_begin_and_end_only():
    trainer, rec, model = make_trainer(make_data(2), num_epochs=0)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.fit()
    assert rec.calls == [("on_loop_begin",), ("on_loop_end", 0, 0)]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_num_steps_zero_runs_loop_begin_and_end_only():
    trainer, rec, _ = make_trainer(make_data(2), stop_by="step", num_steps=0)
    trainer.fit()
    assert [c[0] for c in rec.calls] == ["on_loop_begin", "on_loop_end"]


def test_keyword_values_are_the_loop_objects():
    seen = {}

    class Grab(CallbackMixin):
        def on_step_end(self, model, optimizer, data_loader, batch, model_outs, num_steps, device, loop, **kw):
            seen.update(model=model, optimizer=optimizer, data_loader=data_loader, batch=batch,
                        model_outs=model_outs, device=device, loop=loop)

        def on_batch_end(self, losses, model_outs, batch_idx, **kw):
            seen.update(losses=losses, batch_idx=batch_idx)

    data = make_data(1)
    trainer, _, model = make_trainer(data, num_epochs=1)
    trainer.attach_callbacks([Grab()])
    trainer.fit()
    assert seen["model"] is model and seen["optimizer"] is trainer.optimizer
    assert seen["data_loader"] is data and seen["batch"] is data[0] and seen["device"] is None
    assert seen["loop"] is trainer and seen["batch_idx"] == 0
    loss, logits = seen["model_outs"]
    assert seen["losses"] == [loss] and logits.shape == (5, 3)


def test_start_epoch_and_start_step_continue_the_ids():
    trainer, rec, _ = make_trainer(make_data(3), num_epochs=3, start_epoch=2)
    trainer.fit()
    assert rec.calls[1] == ("on_epoch_begin", 2, 6)
    assert [c for c in rec.calls if c[0] == "on_step_begin"] == [("on_step_begin", 2, s, 6 + s) for s in range(3)]

    trainer, rec, _ = make_trainer(make_data(3), stop_by="step", num_steps=6, start_step=4)
    trainer.fit()
    begins = [c for c in rec.calls if c[0] == "on_step_begin"]
    assert begins == [("on_step_begin", 1, 1, 4), ("on_step_begin", 1, 2, 5)]
