"""Ignite's EMAHandler and time profilers on HAT's loops (digits data, a real MLP that trains)."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import BasicTimeProfiler, EMAHandler, HandlersTimeProfiler
from torch.utils.data import DataLoader, Subset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.callbacks.metric_updater import MetricUpdater
from hat_ignite.callbacks.validation import Validation
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, HatEvents, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy
from hat_ignite.models.mlp import MLPClassifier

STEPS = 12


def digits(split: str, n: int) -> DataLoader:
    return DataLoader(Subset(DigitsDataset(split), range(n)), batch_size=16)


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


class Seen(CallbackMixin):
    """Inside the validation predictor: the model it validates."""

    def __init__(self):
        self.models = []

    def on_loop_begin(self, model, **kwargs):
        self.models.append(model)


def accuracy_of(model, data) -> float:
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        hits = sum(int((model(b["img"]).argmax(1) == b["labels"]).sum()) for b in data)
    return hits / len(data.dataset)


def make_trainer(callbacks, **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = MLPClassifier(hidden_features=16)
    kwargs.setdefault("num_epochs", 2)
    return Trainer(model, digits("train", 16 * STEPS), torch.optim.SGD(model.parameters(), lr=0.2),
                   BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None,
                   val_metrics=[Accuracy()], callbacks=callbacks, **kwargs)


def make_validation(seen: Seen, **kwargs) -> Validation:
    return Validation(digits("val", 96), BasicBatchProcessor(need_grad_update=False),
                      [MetricUpdater(update_metric, step_log_freq=0), seen], log_interval=0, **kwargs)


def test_validation_validates_the_model_of_an_attached_ema_handler(caplog):
    seen = Seen()
    trainer = make_trainer([make_validation(seen)])
    ema = EMAHandler(trainer.model, momentum=0.5)
    ema.attach(trainer, event=Events.ITERATION_COMPLETED)
    with caplog.at_level("INFO", logger="hat_ignite.engine.ignite_handlers"):
        trainer.fit()
    assert trainer.ema_model is ema.ema_model
    assert seen.models == [ema.ema_model] * 2  # epochs 0 and 1 (the loop end repeats no point)
    assert not any(m is trainer.model for m in seen.models)
    accuracy = trainer.state.storage["monitor_obj"]["accuracy"]
    assert accuracy == pytest.approx(accuracy_of(ema.ema_model, digits("val", 96)), abs=1e-6)
    assert accuracy != pytest.approx(accuracy_of(trainer.model, digits("val", 96)), abs=1e-6)
    assert "EMAHandler's ema_model is the loop's ema_model" in caplog.text

    seen = Seen()  # asked for, the train model is validated
    trainer = make_trainer([make_validation(seen, use_ema_model=False)])
    EMAHandler(trainer.model, momentum=0.5).attach(trainer)
    trainer.fit()
    assert seen.models == [trainer.model] * 2


def test_an_ema_model_set_by_hand_is_kept_and_two_handlers_are_not_guessed(caplog):
    seen = Seen()
    trainer = make_trainer([make_validation(seen)], num_epochs=1)
    first, second = EMAHandler(trainer.model, momentum=0.5), EMAHandler(trainer.model, momentum=0.1)
    first.attach(trainer, name="ema_a")
    second.attach(trainer, name="ema_b")
    with caplog.at_level("WARNING"):
        trainer.fit()
    assert seen.models == [trainer.model] and trainer.ema_model is None
    assert "2 Ignite EMAHandlers are attached" in caplog.text
    assert "trainer.ema_model = ema_handler.ema_model" in caplog.text
    trainer.ema_model = second.ema_model
    trainer.fit()
    assert seen.models[-1] is second.ema_model


class SlowHooks(CallbackMixin):
    """HAT hooks that sleep: on_step_end inside the step, the others inside Ignite event handlers."""

    def __init__(self, sleep=0.002):
        self.sleep = sleep
        self.spent = 0.0
        self.processing_timer = None  # a HandlersTimeProfiler's, read around on_step_end
        self.processing_read = []

    def _sleep(self, sleep=None):
        t0 = time.perf_counter()
        time.sleep(self.sleep if sleep is None else sleep)
        self.spent += time.perf_counter() - t0

    def on_loop_begin(self, **kwargs):
        self._sleep()

    def on_epoch_begin(self, **kwargs):
        self._sleep()

    def on_step_begin(self, **kwargs):
        self._sleep(0.002)

    def on_step_end(self, **kwargs):
        before = self.processing_timer.value() if self.processing_timer else None
        self._sleep(0.002)
        if self.processing_timer:
            self.processing_read.append((before, self.processing_timer.value()))

    def on_epoch_end(self, **kwargs):
        self._sleep()

    def on_loop_end(self, **kwargs):
        self._sleep()


def test_handlers_time_profiler_counts_each_hat_hook_once():
    hooks = SlowHooks(sleep=0.06)
    trainer = make_trainer([hooks])
    profiler = HandlersTimeProfiler()
    profiler.attach(trainer)
    hooks.processing_timer = profiler._processing_timer  # Ignite's timer of "Processing"
    t0 = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - t0
    rows = {(row[0], row[1]): row for row in profiler.get_results()}
    hook_rows = sum(row[2] for (name, _), row in rows.items() if name.startswith("SlowHooks."))
    assert hook_rows == pytest.approx(hooks.spent, rel=0.2)
    # before: the step hooks were counted again in "Processing" and the others in the rows of the
    # loop's bridge handlers, so the rows added up to more than the run took
    assert len(hooks.processing_read) == 2 * STEPS
    assert all(before == after for before, after in hooks.processing_read)  # paused while the hook ran
    assert rows[("Total", "")][2] + rows[("Processing", "None")][2] + rows[("Dataflow", "None")][2] <= wall
    bridges = ("on_started", "on_epoch_started", "close_epoch", "on_completed")  # hooks of 60 ms each
    maxima = [row[4][0] for (name, _), row in rows.items() if name in bridges]
    assert len(maxima) == len(bridges) and all(t < 0.03 for t in maxima), rows
    # nothing stays behind: the next run, unprofiled, has only the hooks
    assert trainer.event_handlers(HatEvents.STEP_END) == ["SlowHooks.on_step_end"]


def test_basic_time_profiler_with_stop_by_step():
    hooks = SlowHooks()
    trainer = make_trainer([hooks], num_epochs=None, stop_by="step", num_steps=STEPS + 5)
    profiler = BasicTimeProfiler()
    profiler.attach(trainer)
    trainer.fit()  # raised TypeError: NoneType * int (max_epochs was None)
    results = profiler.get_results()
    assert profiler.max_epochs == 2 and profiler.total_num_iters == 2 * STEPS
    assert results["processing_stats"]["total"] >= (STEPS + 5) * 0.002
    assert trainer.state.iteration == STEPS + 5 and trainer.state.max_epochs is None
    # Ignite's own run() in max_iters mode still follows a fit() (it refuses a state with max_epochs)
    trainer = make_trainer([], num_epochs=None, stop_by="step", num_steps=STEPS + 5)
    trainer.fit()
    trainer.run(trainer.data_loader, max_iters=STEPS + 8)
    assert trainer.state.iteration == STEPS + 8
