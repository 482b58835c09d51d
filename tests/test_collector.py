"""The garbage collector of ``hat-train`` and ``hat-predict`` (hat_ignite/cli/collector.py): off while
the command starts, on during the build and the loop with what was imported (and then built) frozen, and as the
caller had it once the command returns; a run's results do not depend on it."""

from __future__ import annotations

import gc
import json
import textwrap

import torch
from conftest import DIGITS_CONFIG

from hat_ignite.cli import predict as predict_cli
from hat_ignite.cli import train as train_cli

CONFIG = """
import gc
import json

import torch
from hat_ignite.callbacks import CallbackMixin

seen = {{"config": dict(enabled=gc.isenabled(), frozen=gc.get_freeze_count())}}


class CollectorProbe(CallbackMixin):
    def __init__(self):
        seen["build"] = dict(enabled=gc.isenabled(), frozen=gc.get_freeze_count())

    def on_step_begin(self, global_step_id, **kwargs):
        if global_step_id == 0:
            seen["loop"] = dict(enabled=gc.isenabled(), frozen=gc.get_freeze_count())

    def on_loop_end(self, model, **kwargs):
        with open({out!r}, "w") as f:
            json.dump(seen, f)
        torch.save(model.state_dict(), {out!r} + ".pt")


seed = 0
model = dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10)
loader = dict(type="torch.utils.data.DataLoader", dataset=dict(type="DigitsDataset", split="train"), batch_size=64)
float_trainer = dict(
    type="Trainer", model=model, data_loader=loader, device=None, num_epochs=1,
    optimizer=dict(type="torch.optim.SGD", lr=0.1),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                         loss_collector=dict(type="collect_loss_by_index", indexes=0)),
    callbacks=[dict(type=CollectorProbe)],
)
"""


def test_the_loop_runs_with_the_startup_frozen_and_the_caller_gets_its_collector_back(tmp_path):
    config = tmp_path / "cfg.py"
    config.write_text(textwrap.dedent(CONFIG.format(out=str(tmp_path / "seen.json"))))
    assert gc.isenabled()
    assert train_cli.main([str(config), "--work-dir", str(tmp_path / "work")]) == 0

    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["config"]["enabled"] is False  # the config's imports: no collection
    assert seen["build"]["enabled"] is True and seen["build"]["frozen"] > 10_000  # torch's modules and more
    assert seen["loop"]["enabled"] is True and seen["loop"]["frozen"] > seen["build"]["frozen"]  # and the stage
    assert gc.isenabled() and gc.get_freeze_count() == 0  # on, as this process had it; nothing frozen

    gc.disable()  # a caller with the collector off keeps it off
    try:
        assert train_cli.main([str(config), "--work-dir", str(tmp_path / "again")]) == 0
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_failing_command_gives_the_collector_back_too(tmp_path, capsys):
    assert train_cli.main([str(tmp_path / "missing.py")]) == 1
    assert predict_cli.main([str(DIGITS_CONFIG), "--stage", "nope", "--work-dir", str(tmp_path / "w")]) == 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_run_with_the_collector_off_at_the_start_trains_the_same_weights(tmp_path):
    """The collector decides when memory is freed, never what is computed: the same run with the
    process's collector turned off for good gives the same checkpoint."""
    weights = []
    for run, collector in (("a", gc.enable), ("b", gc.disable)):
        config = tmp_path / f"{run}.py"
        config.write_text(textwrap.dedent(CONFIG.format(out=str(tmp_path / f"{run}.json"))))
        collector()
        try:
            assert train_cli.main([str(config), "--work-dir", str(tmp_path / run)]) == 0
        finally:
            gc.enable()
        weights.append(torch.load(tmp_path / f"{run}.json.pt", weights_only=True))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
