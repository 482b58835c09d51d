"""MetricUpdater on a real model training on the sklearn digits: updates, logs, resets, storage."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from torch import nn

from conftest import flat_digits_loader
from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.metric_updater import MetricUpdater
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy, LossShow

LOGGER = "hat_ignite.callbacks.metric_updater"
STEPS_PER_EPOCH = 6


def digits_loader(n: int = 240, batch_size: int = 40):
    return flat_digits_loader(n, batch_size)


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


def update_metric(metrics, batch, model_outs):
    metrics["acc"].update(batch[1], model_outs[1])
    metrics["loss"].update(model_outs[0])


def new_metrics() -> dict:
    return {"acc": Accuracy(name="acc"), "loss": LossShow(name="loss")}


class Recorder(CallbackMixin):
    """Keeps what the metrics saw per step, and every change of storage['monitor_obj']."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int]] = []  # (hits, count, loss sum) per global step
        self.losses: list[float] = []
        self.stores: list[tuple[str, int, dict]] = []
        self._seen = None

    def on_batch_end(self, batch, model_outs, **kwargs):
        preds = model_outs[1].detach().argmax(1)
        self.steps.append((int((preds == batch[1]).sum()), len(batch[1])))
        self.losses.append(float(model_outs[0].detach()))

    def _note(self, where: str, at: int, storage: dict) -> None:
        current = storage.get("monitor_obj")
        if current is not None and current is not self._seen:
            self.stores.append((where, at, dict(current)))
            self._seen = current

    def on_step_end(self, global_step_id, storage, **kwargs):
        self._note("step", global_step_id, storage)

    def on_epoch_end(self, epoch_id, storage, **kwargs):
        self._note("epoch", epoch_id, storage)

    def on_loop_end(self, global_step_id, storage, **kwargs):
        self._note("loop", global_step_id, storage)

    def acc(self, steps: range) -> float:
        return sum(self.steps[i][0] for i in steps) / sum(self.steps[i][1] for i in steps)

    def loss(self, steps: range) -> float:
        return sum(self.losses[i] for i in steps) / len(steps)


def train(updater: MetricUpdater, num_epochs: int = 2, **kwargs) -> tuple[Trainer, Recorder]:
    torch.manual_seed(0)
    model = DigitNet()
    rec = Recorder()
    trainer = Trainer(
        model=model, data_loader=digits_loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=num_epochs, callbacks=[updater, rec], **kwargs,
    )
    trainer.fit()
    return trainer, rec


def parse(caplog) -> list[tuple[str, dict]]:
    """(head, {name: value}) of every MetricUpdater log line."""
    out = []
    for record in caplog.records:
        if record.name != LOGGER:
            continue
        msg = record.getMessage()
        head = msg.split(" acc=")[0]
        values = {k: float(v) for k, v in re.findall(r"(\w+)=([-\d.e+naif]+)", msg)}
        out.append((head, values))
    return out


def test_epoch_reset_logs_each_step_interval_and_epoch(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    updater = MetricUpdater(update_metric, metrics=new_metrics(), step_log_freq=2, log_prefix="Train ")
    trainer, rec = train(updater, num_epochs=2)
    logs = parse(caplog)
    expected = []
    for epoch in range(2):
        first = epoch * STEPS_PER_EPOCH
        for step_id in (1, 3, 5):
            g = first + step_id
            expected.append((f"Train Epoch[{epoch}] Step[{step_id}] GlobalStep[{g}]", range(first, g + 1)))
        expected.append((f"Train Epoch[{epoch}]", range(first, first + STEPS_PER_EPOCH)))
    assert [head for head, _ in logs] == [head for head, _ in expected]
    for (_, values), (_, steps) in zip(logs, expected):
        assert values["acc"] == pytest.approx(rec.acc(steps), abs=1e-6)
        assert values["loss"] == pytest.approx(rec.loss(steps), rel=1e-5)
    # the model learns: the second epoch is clearly better than the first
    assert logs[-1][1]["acc"] > logs[3][1]["acc"] and logs[-1][1]["acc"] > 0.8
    # default storage: nothing during the run, the final epoch's values at the end
    assert rec.stores == [("loop", 12, trainer.state.storage["monitor_obj"])]
    assert trainer.state.storage["monitor_obj"] == {
        "acc": pytest.approx(rec.acc(range(6, 12)), abs=1e-6),
        "loss": pytest.approx(rec.loss(range(6, 12)), rel=1e-5),
    }


def test_step_reset_reports_each_step_alone(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    updater = MetricUpdater(update_metric, metrics=new_metrics(), step_log_freq=1, reset_metrics_by="step",
                            log_prefix="resnet18_cls")  # HAT configs pass the bare task name
    trainer, rec = train(updater, num_epochs=1)
    logs = parse(caplog)
    assert len(logs) == STEPS_PER_EPOCH  # no epoch log: epoch_log_freq only works with epoch resets
    for step, (head, values) in enumerate(logs):
        assert head == f"resnet18_cls Epoch[0] Step[{step}] GlobalStep[{step}]"
        assert values["acc"] == pytest.approx(rec.acc(range(step, step + 1)), abs=1e-6)
    assert trainer.state.storage["monitor_obj"]["acc"] == pytest.approx(rec.acc(range(5, 6)), abs=1e-6)


def test_log_reset_starts_over_after_each_log(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    updater = MetricUpdater(update_metric, metrics=new_metrics(), step_log_freq=4, reset_metrics_by="log")
    trainer, rec = train(updater, num_epochs=2)
    logs = parse(caplog)
    # step_log_freq counts steps inside an epoch: step_id 3 of each epoch (global steps 3 and 9)
    assert [h for h, _ in logs] == ["Epoch[0] Step[3] GlobalStep[3]", "Epoch[1] Step[3] GlobalStep[9]"]
    assert logs[0][1]["acc"] == pytest.approx(rec.acc(range(0, 4)), abs=1e-6)
    assert logs[1][1]["acc"] == pytest.approx(rec.acc(range(4, 10)), abs=1e-6)  # no reset at the epoch
    assert trainer.state.storage["monitor_obj"]["acc"] == pytest.approx(rec.acc(range(10, 12)), abs=1e-6)


def test_storage_frequencies():
    updater = MetricUpdater(
        update_metric, metrics=new_metrics(), step_log_freq=0, step_storage_freq=4, epoch_storage_freq=2,
        storage_key="monitor_obj",
    )
    trainer, rec = train(updater, num_epochs=3)
    assert [(where, at) for where, at, _ in rec.stores] == [
        ("step", 3), ("step", 7), ("step", 11), ("epoch", 1), ("step", 15), ("loop", 18),
    ]
    by_point = {(where, at): values for where, at, values in rec.stores}
    assert by_point[("step", 7)]["acc"] == pytest.approx(rec.acc(range(6, 8)), abs=1e-6)  # epoch 1 so far
    assert by_point[("epoch", 1)]["acc"] == pytest.approx(rec.acc(range(6, 12)), abs=1e-6)
    assert by_point[("loop", 18)]["acc"] == pytest.approx(rec.acc(range(12, 18)), abs=1e-6)


def test_uses_train_metrics_and_filter_condition_in_a_predictor():
    torch.manual_seed(0)
    model = DigitNet()
    loader = digits_loader(n=200, batch_size=25)
    seen = []

    def first_label_even(batch):  # HAT calls the filter with the batch alone
        keep = int(batch[1][0]) % 2 == 0
        if keep:
            with torch.no_grad():
                seen.append((batch[1], model(*batch)[1].argmax(1)))
        return keep

    updater = MetricUpdater(update_metric, filter_condition=first_label_even, step_log_freq=0)
    metrics = new_metrics()
    predictor = Predictor(model, loader, BasicBatchProcessor(need_grad_update=False), metrics=metrics, callbacks=[updater])
    storage = predictor.fit().storage
    hits = sum(int((p == y).sum()) for y, p in seen)
    total = sum(len(y) for y, _ in seen)
    assert 0 < len(seen) < len(loader)
    assert storage["monitor_obj"]["acc"] == pytest.approx(hits / total, abs=1e-6)
    assert metrics["acc"].get()[1] == storage["monitor_obj"]["acc"]


def test_trainer_train_metrics_are_the_default_metrics(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    updater = MetricUpdater(update_metric, step_log_freq=0, epoch_log_freq=2)
    metrics = new_metrics()
    trainer, rec = train(updater, num_epochs=2, train_metrics=metrics)
    assert [h for h, _ in parse(caplog)] == ["Epoch[1]"]  # every 2nd epoch only
    assert metrics["acc"].get()[1] == pytest.approx(rec.acc(range(6, 12)), abs=1e-6)


def test_bad_arguments_and_missing_metrics():
    with pytest.raises(ValueError, match="reset_metrics_by must be one of"):
        MetricUpdater(update_metric, reset_metrics_by="batch")
    with pytest.raises(ValueError, match="step_log_freq=0 disables step logs"):
        MetricUpdater(update_metric, reset_metrics_by="log", step_log_freq=0)
    with pytest.raises(TypeError, match="metric_update_func must be callable"):
        MetricUpdater("update_metric")
    with pytest.raises(TypeError, match="step_storage_freq must be an int"):
        MetricUpdater(update_metric, step_storage_freq=1.5)
    with pytest.raises(ValueError, match="MetricUpdater has no metrics"):
        train(MetricUpdater(update_metric), num_epochs=1)


def test_attaches_only_the_hooks_its_reset_mode_needs():
    by_epoch = MetricUpdater(update_metric, reset_metrics_by="epoch").overridden_hooks()
    by_step = MetricUpdater(update_metric, reset_metrics_by="step").overridden_hooks()
    assert "on_epoch_begin" in by_epoch and "on_step_begin" not in by_epoch
    assert "on_step_begin" in by_step and "on_epoch_begin" not in by_step
    assert {"on_loop_begin", "on_batch_end", "on_step_end", "on_epoch_end", "on_loop_end"} <= set(by_step)
    quiet = MetricUpdater(update_metric, step_log_freq=0).overridden_hooks()
    stored = MetricUpdater(update_metric, step_log_freq=0, step_storage_freq=2).overridden_hooks()
    assert "on_step_end" not in quiet and "on_batch_end" in quiet  # no step logs, no step storage
    assert "on_step_end" in stored


def test_metrics_replaced_between_runs_are_checked_again():
    updater = MetricUpdater(update_metric, step_log_freq=0)
    train(updater, num_epochs=1, train_metrics=new_metrics())
    with pytest.raises(ValueError, match="MetricUpdater has no metrics"):
        train(updater, num_epochs=1, train_metrics={})
