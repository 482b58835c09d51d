"""Ignite's profilers and ours on a HAT hook that takes 2 ms a step (digits data)."""

from __future__ import annotations

import csv
import time

import torch
from ignite.handlers import BasicTimeProfiler, HandlersTimeProfiler
from torch.utils.data import DataLoader, Subset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.models.mlp import MLPClassifier
from hat_ignite.profiler import SimpleProfiler

STEPS = 20


class SlowHook(CallbackMixin):
    """A HAT callback whose on_step_end takes about 2 ms; records how long it really took."""

    def __init__(self):
        self.spent = 0.0

    def on_step_end(self, **kwargs):
        t0 = time.perf_counter()
        time.sleep(0.002)
        self.spent += time.perf_counter() - t0


def make_trainer(hook):
    torch.manual_seed(0)
    model = MLPClassifier(hidden_features=16)
    data = DataLoader(Subset(DigitsDataset("train"), range(16 * STEPS)), batch_size=16)
    return Trainer(model, data, torch.optim.SGD(model.parameters(), lr=0.1),
                   BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None, num_epochs=1,
                   callbacks=[hook])


def test_handlers_time_profiler_and_ours_count_a_hat_hook_once(tmp_path):
    hook = SlowHook()
    trainer = make_trainer(hook)
    ignite_profiler = HandlersTimeProfiler()
    ignite_profiler.attach(trainer)
    t0 = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - t0
    rows = {row[0]: row for row in ignite_profiler.get_results()}
    # the process function fires the hook, and "Processing" leaves its time out: the hook's own
    # row has it (see hat_ignite/engine/ignite_handlers.py)
    assert rows["SlowHook.on_step_end"][2] >= 0.9 * hook.spent
    assert rows["Total"][2] + rows["Processing"][2] + rows["Dataflow"][2] <= wall

    hook = SlowHook()
    trainer = make_trainer(hook)
    ours = SimpleProfiler(log=False)
    ours.attach(trainer)  # attached the way Ignite's profilers are
    trainer.fit()
    results = {r["name"]: r for r in ours.get_results()}
    hook_row = results["STEP_END: SlowHook.on_step_end"]
    assert hook_row["calls"] == STEPS and abs(hook_row["total_s"] - hook.spent) < 0.2 * hook.spent
    assert ours.timed_total_s() <= ours.wall_s  # exclusive times: the hook is counted once
    ours.write_results(str(tmp_path / "profile.csv"))
    with open(tmp_path / "profile.csv", newline="") as f:
        written = {row["name"]: row for row in csv.DictReader(f)}
    assert int(written["STEP_END: SlowHook.on_step_end"]["calls"]) == STEPS


def test_basic_time_profiler_has_no_row_for_hat_hooks():
    # BasicTimeProfiler reports Ignite's built-in events only: the HAT hook is nowhere by name,
    # its time is inside "processing" (the process function fires it)
    hook = SlowHook()
    trainer = make_trainer(hook)
    profiler = BasicTimeProfiler()
    profiler.attach(trainer)
    trainer.fit()
    results = profiler.get_results()
    names = [name for names in results["event_handlers_names"].values() for name in names]
    assert not any("SlowHook" in name or "on_step_end" in name for name in names), names
    assert all(event == "total_time" or not event.startswith(("STEP_", "FORWARD_", "BACKWARD_"))
               for event in results["event_handlers_stats"])
    assert results["processing_stats"]["total"] >= hook.spent

