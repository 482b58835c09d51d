"""Built-in callbacks in a loop that calls their hooks as HAT's own loop does (tests/hat_loop_calls.py).

HAT's loop gives ``on_loop_begin`` its ``loop`` and every hook ``storage``, but no ``loop`` to the
other hooks, no ``batch`` at step end, and its processor passes only the ids to the batch hooks.
HAT's unit tests call hooks with fewer keywords still (no ``storage``, no ``global_step_id`` at
a validation's loop end). Each test trains a real model on the sklearn digits through such calls
and checks what the callback logged, stored, validated or saved.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks.dump_data import DumpData
from hat_ignite.callbacks.freeze import FreezeModule
from hat_ignite.callbacks.metric_updater import MetricUpdater
from hat_ignite.callbacks.param_updater import StepDecayOptimParamUpdater
from hat_ignite.callbacks.save_traced import SaveTraced
from hat_ignite.callbacks.stats_monitor import StatsMonitor
from hat_ignite.callbacks.validation import Validation
from hat_ignite.engine import BasicBatchProcessor
from hat_ignite.metrics import Accuracy
from hat_loop_calls import HatStyleLoop

_X, _Y = load_digits(return_X_y=True)
_X = torch.tensor(_X / 16.0, dtype=torch.float32)
_Y = torch.tensor(_Y)


def loader(start: int, stop: int, batch_size: int = 50) -> DataLoader:
    return DataLoader(TensorDataset(_X[start:stop], _Y[start:stop]), batch_size=batch_size, shuffle=False)


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(64, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        logits = self.head(torch.relu(self.body(x)))
        return nn.functional.cross_entropy(logits, y), logits


def update_accuracy(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch[1], model_outs[1])


def accuracy_of(model: nn.Module, data: DataLoader) -> float:
    model.eval()
    with torch.no_grad():
        hits = sum(int((model(x, y)[1].argmax(1) == y).sum()) for x, y in data)
    return hits / len(data.dataset)


def _sgd(model: nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)


def test_stats_monitor_in_a_hat_loop_gives_speed_and_eta():
    model = DigitNet()
    seen: list[dict] = []

    class Keep:  # after the monitor: what it stored at each epoch end
        def __getattr__(self, hook):
            return lambda **kw: seen.append(dict(kw["storage"]["stats"])) if hook == "on_epoch_end" else None

    loop = HatStyleLoop(model, _sgd(model), loader(0, 200), [StatsMonitor(log_freq=2), Keep()], num_epochs=2)
    stats = loop.fit()["stats"]
    # no batch at HAT's step end: the samples come from the loader's batch size (50 a step)
    assert seen[0]["epoch_steps"] == 4 and seen[0]["epoch_samples_per_sec"] > 0
    # no loop after loop begin: the ETA comes from loop begin's num_epochs x len(data_loader)
    assert seen[0]["eta_seconds"] > 0 and seen[1]["eta_seconds"] == 0.0
    assert (stats["epoch_id"], stats["global_step_id"], stats["step_id"], stats["lr"]) == (1, 8, 3, 0.1)


def test_metric_updater_in_a_hat_loop_logs_and_stores(caplog):
    model = DigitNet()
    data = loader(0, 200)
    updater = MetricUpdater(update_accuracy, step_log_freq=4, step_storage_freq=-1, epoch_storage_freq=1,
                            log_prefix="digits")
    loop = HatStyleLoop(model, _sgd(model, lr=0.0), data, [updater], num_epochs=2, train_metrics=[Accuracy()])
    with caplog.at_level(logging.INFO, logger="hat_ignite.callbacks.metric_updater"):
        storage = loop.fit()
    expected = accuracy_of(model, data)  # lr 0: the model the epochs saw
    assert storage["monitor_obj"]["accuracy"] == pytest.approx(expected)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("digits Epoch[1] Step[3] GlobalStep[7]") for line in lines)
    assert any(line.startswith("digits Epoch[1] ") and "Step" not in line for line in lines)


def test_metric_updater_hooks_without_storage_log_only(caplog):
    metric = Accuracy()
    updater = MetricUpdater(update_accuracy, metrics=[metric], step_log_freq=1)
    batch = (None, torch.tensor([1, 2]))
    updater.on_loop_begin()
    updater.on_epoch_begin()
    updater.on_batch_end(batch=batch, model_outs=(None, torch.eye(10)[[1, 3]]))
    with caplog.at_level(logging.INFO, logger="hat_ignite.callbacks.metric_updater"):
        updater.on_step_end(epoch_id=0, step_id=0, global_step_id=0)
        updater.on_epoch_end(epoch_id=0)
        updater.on_loop_end()
    assert [r.getMessage() for r in caplog.records] == ["Epoch[0] Step[0] GlobalStep[0] accuracy=0.5", "Epoch[0] accuracy=0.5"]
    assert updater.final_values == {"accuracy": 0.5}


class CountRuns:
    """Inside the validation: how many validations ran."""

    def __init__(self) -> None:
        self.runs = 0

    def on_loop_begin(self, **kwargs):
        self.runs += 1


def _validation(counter: CountRuns) -> Validation:
    return Validation(
        data_loader=loader(1200, 1500), batch_processor=BasicBatchProcessor(need_grad_update=False),
        callbacks=[MetricUpdater(update_accuracy, step_log_freq=0), counter],
    )


def test_validation_in_a_hat_loop_validates_each_epoch_and_stores_the_results():
    model = DigitNet()
    counter = CountRuns()
    loop = HatStyleLoop(model, _sgd(model), loader(0, 400), [_validation(counter)], num_epochs=2,
                        val_metrics=[Accuracy()])
    storage = loop.fit()
    record = storage["validation"]
    assert (record["epoch_id"], record["global_step_id"]) == (1, 16)
    assert record["results"]["monitor_obj"]["accuracy"] == pytest.approx(accuracy_of(model, loader(1200, 1500)))
    assert counter.runs == 2  # the loop end saw the state the last epoch end validated


def test_validation_hooks_with_hats_required_keywords_only():
    model = DigitNet()
    counter = CountRuns()
    val = _validation(counter)
    metrics = [Accuracy()]
    val.on_loop_begin()
    val.on_epoch_end(epoch_id=0, model=model, device=None, num_epochs=1, val_metrics=metrics)
    assert metrics[0].get() == ("accuracy", pytest.approx(accuracy_of(model, loader(1200, 1500))))
    val.on_loop_end(model=model, device=None, epoch_id=1, val_metrics=metrics)
    assert counter.runs == 2  # without global_step_id nothing says the state was validated: validate


def test_other_built_ins_in_a_hat_loop(tmp_path):
    model = DigitNet()
    optimizer = _sgd(model)
    callbacks = [
        StepDecayOptimParamUpdater("weight_decay", param_decay_id=[1], param_decay_factor=0.5),
        FreezeModule(modules=["body"], step_or_epoch=[1], update_by="epoch"),
        DumpData(str(tmp_path / "dump"), save_interval=3, dump_model_grad=False),
        SaveTraced(str(tmp_path / "traced"), trace_inputs=(torch.zeros(1, 64), torch.zeros(1, dtype=torch.long)),
                   save_exported=False),
    ]
    body_before = model.body.weight.detach().clone()
    seen_wd: list[float] = []

    class Keep:
        def __getattr__(self, hook):
            if hook == "on_epoch_begin":
                return lambda **kw: seen_wd.append(kw["optimizer"].param_groups[0]["weight_decay"])
            return lambda **kw: None

    loop = HatStyleLoop(model, optimizer, loader(0, 200), [*callbacks, Keep()], num_epochs=2)
    loop.fit()
    assert seen_wd == [1e-4, pytest.approx(5e-5)]
    assert not model.body.weight.requires_grad  # frozen from epoch 1 on
    assert not torch.equal(model.body.weight, body_before)  # it trained in epoch 0
    assert os.path.exists(callbacks[2].dump_file)
    traced = callbacks[3].traced_path
    assert traced is not None and os.path.exists(traced)
    reloaded = torch.jit.load(traced)
    x, y = _X[:5], _Y[:5]
    model.eval()
    assert torch.allclose(reloaded(x, y)[1], model(x, y)[1], atol=1e-6)
