"""StatsMonitor on real training: what it logs and stores, and that the time split is right."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import flat_digits_loader
from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.stats_monitor import StatsMonitor
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_index

LOGGER = "hat_ignite.callbacks.stats_monitor"


def digits_loader(n: int = 240, batch_size: int = 40):
    return flat_digits_loader(n, batch_size)


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


class StatsLog(CallbackMixin):
    """After StatsMonitor: a copy of storage['stats'] each time it changes."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []
        self._last = None

    def _note(self, where: str, storage: dict) -> None:
        stats = storage.get("stats")
        if stats is not None and stats is not self._last:
            self.seen.append((where, dict(stats)))
            self._last = stats

    def on_step_end(self, storage, **kwargs):
        self._note("step", storage)

    def on_epoch_end(self, storage, **kwargs):
        self._note("epoch", storage)


def train(callbacks, data=None, num_epochs: int = 2, lr: float = 0.1) -> Trainer:
    torch.manual_seed(0)
    model = DigitNet()
    trainer = Trainer(
        model=model, data_loader=data if data is not None else digits_loader(),
        optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=num_epochs, callbacks=callbacks,
    )
    trainer.fit()
    return trainer


def test_logs_and_stores_every_log_freq_steps_and_each_epoch(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    log = StatsLog()
    trainer = train([StatsMonitor(log_freq=4), log], num_epochs=2)  # 6 steps per epoch
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert [line.split(" ")[0] + " " + line.split(" ")[1] for line in lines] == [
        "Epoch[0] Step[3]", "Epoch[0] done", "Epoch[1] Step[1]", "Epoch[1] Step[5]", "Epoch[1] done",
    ]
    assert "GlobalStep[7]" in lines[2] and "samples/sec" in lines[0] and "lr=0.1" in lines[0]
    assert [(where, s["global_step_id"]) for where, s in log.seen] == [
        ("step", 3), ("epoch", 6), ("step", 7), ("step", 11), ("epoch", 12),
    ]
    first = log.seen[0][1]
    assert first["step_time"] == pytest.approx(first["data_time"] + first["compute_time"])
    assert first["samples_per_sec"] == pytest.approx(40 / first["step_time"])
    assert first["eta_seconds"] == pytest.approx(8 * first["step_time"])  # 8 of 12 steps left
    etas = [s["eta_seconds"] for _, s in log.seen]
    assert etas[-1] == 0.0 and all(e >= 0 for e in etas)
    final = trainer.state.storage["stats"]
    assert final["epoch_id"] == 1 and final["epoch_steps"] == 6 and final["lr"] == 0.1
    assert final["epoch_time"] >= 6 * final["epoch_compute_time"] > 0
    assert final["epoch_samples_per_sec"] > 0 and final["peak_memory_mib"] > 10
    assert final["step_id"] == 5  # the step figures of the last step log are kept alongside


class SlowLoader:
    """A loader that takes `delay` seconds to produce each batch."""

    def __init__(self, data: DataLoader, delay: float) -> None:
        self.data, self.delay = data, delay

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        for batch in self.data:
            time.sleep(self.delay)
            yield batch


class SlowCompute(CallbackMixin):
    def on_batch_end(self, **kwargs):
        time.sleep(0.02)


def test_data_wait_and_compute_are_told_apart():
    log = StatsLog()
    data = SlowLoader(digits_loader(n=96, batch_size=16), delay=0.04)  # 6 steps
    train([SlowCompute(), StatsMonitor(log_freq=3, batch_size=32), log], data=data, num_epochs=1)
    step_logs = [s for where, s in log.seen if where == "step"]
    assert len(step_logs) == 2
    for stats in step_logs:
        assert stats["data_time"] >= 0.04 and stats["compute_time"] >= 0.02
        assert stats["compute_time"] < stats["data_time"] + 0.5  # sane, even on a busy machine
        assert stats["samples_per_sec"] == pytest.approx(32 / stats["step_time"])  # the given batch size
    epoch = log.seen[-1][1]
    assert epoch["epoch_data_time"] >= 0.04 and epoch["epoch_time"] >= 6 * 0.06


class ClockOff(CallbackMixin):
    """Turns the engine's step clock off at loop begin, as if StatsMonitor came in later."""

    def on_loop_begin(self, loop, **kwargs):
        loop.step_clock = None
        loop.state.__dict__.pop("step_start_time", None)


def test_the_engine_reads_step_starts_only_for_a_stats_monitor():
    assert train([], num_epochs=1).step_clock is None
    monitored = train([StatsMonitor(log_freq=2)], num_epochs=1)
    assert monitored.step_clock is time.perf_counter and monitored.state.step_start_time > 0
    log = StatsLog()  # a monitor that finds no step start reads them from its first step on
    trainer = train([StatsMonitor(log_freq=2), ClockOff(), log], num_epochs=1)
    assert trainer.step_clock is time.perf_counter
    step_logs = [stats for where, stats in log.seen if where == "step"]
    assert len(step_logs) == 3 and all(s["data_time"] >= 0 and s["compute_time"] > 0 for s in step_logs)


class Lengths(nn.Module):
    def forward(self, batch):
        return torch.tensor([float(len(w)) for w in batch["words"]])


def test_predictor_without_optimizer_or_tensor_batches():
    batches = [{"words": ["a", "bb"]}, {"words": ["ccc"]}]
    predictor = Predictor(Lengths(), batches, BasicBatchProcessor(need_grad_update=False), callbacks=[StatsMonitor(log_freq=1)])
    stats = predictor.fit().storage["stats"]
    assert stats["lr"] is None and stats["samples_per_sec"] is None and stats["epoch_samples_per_sec"] is None
    assert stats["epoch_steps"] == 2 and stats["eta_seconds"] == 0.0


def test_bad_arguments():
    with pytest.raises(TypeError, match="log_freq must be an int"):
        StatsMonitor(log_freq="200")
    with pytest.raises(ValueError, match="batch_size must be None"):
        StatsMonitor(batch_size=0)
