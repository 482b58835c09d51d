"""No host read of a device value between log points (see tests/host_reads.py for what is counted).

Each read (``.item()``, ``float(t)``, ``.tolist()``...) drains a GPU's queue. A training step of the
bare Trainer with a fused optimizer, of the shipped digits config, and of a 2-process run makes
none; the log and TensorBoard steps and the epoch boundaries (validation, checkpoints, the data
loader's shuffle) read what they write.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch
from torch import nn

from hat_ignite.config import Config
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from host_reads import HostReads
from host_reads_dist import result_file, run_job

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x, y):
        logits = self.body(x)
        return nn.functional.cross_entropy(logits, y), logits


def bare_trainer(steps: int) -> Trainer:
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(steps)]
    return Trainer(model=model, data_loader=data, device=None, num_epochs=1,
                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)))


def test_a_bare_trainer_with_the_default_guard_and_a_fused_optimizer_reads_nothing():
    trainer = bare_trainer(40)
    reads = HostReads().attach(trainer)
    with reads:
        trainer.fit()
    assert trainer.state.iteration == 40
    assert reads.reads(range(6, 36)) == {}
    # the guard is on: a NaN would be caught (tests/test_nonfinite_device.py)
    assert trainer.batch_processor.nonfinite.device_flags is not None


def test_the_progress_bar_reads_the_loss_only_when_it_redraws(monkeypatch):
    from hat_ignite.cli.progress import TerminalBar
    from hat_ignite.cli.train import _attach_progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # hat-train on a terminal: a tqdm bar
    redraws: list[int] = []
    step = TerminalBar._step

    def counting_step(self, engine):  # the steps at which tqdm redrew (and so read the values)
        before = self.bar.n if self.bar is not None else None
        last = getattr(self.bar, "last_print_n", None)
        step(self, engine)
        if before is not None and self.bar.last_print_n != last:
            redraws.append(engine.state.iteration)

    monkeypatch.setattr(TerminalBar, "_step", counting_step)
    trainer = bare_trainer(45)
    _attach_progress(trainer)
    reads = HostReads().attach(trainer)
    with reads:
        trainer.fit()
    read_steps = sorted(reads.reads(range(2, 46)))
    # a step the bar did not redraw reads nothing; the epoch's end draws its last values once
    assert set(read_steps) <= set(redraws) | {45}
    assert len(read_steps) < 44  # tqdm redraws at most every mininterval (0.1 s), not every step


OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.1),
    "SGD momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01),
    "fused SGD": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
}


def _optimizer_own_reads(make_optimizer, steps: int) -> list[int]:
    """Host reads per step of a hand-written loop with that optimizer: what torch itself reads."""
    torch.manual_seed(0)
    model = Net()
    optimizer = make_optimizer(model.parameters())
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(steps)]
    reads = HostReads()
    with reads:
        for i, (x, y) in enumerate(data, start=1):
            reads.iteration = i
            optimizer.zero_grad(set_to_none=True)
            model(x, y)[0].backward()
            optimizer.step()
    return [reads.per_step[i] for i in range(1, steps + 1)]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_default_guard_reads_nothing_beyond_the_optimizer_itself(name, caplog):
    """HAT configs use plain SGD and AdamW: the guard (policy "raise") adds no host read to them."""
    steps = 24
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(steps)]
    trainer = Trainer(model=model, data_loader=data, device=None, num_epochs=1,
                      optimizer=OPTIMIZERS[name](model.parameters()),
                      batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)))
    reads = HostReads().attach(trainer)
    with caplog.at_level("INFO", logger="hat_ignite.engine.processors.nonfinite"), reads:
        trainer.fit()
    own = _optimizer_own_reads(OPTIMIZERS[name], steps)
    steady = range(3, steps)  # the first steps make the optimizer state; the last settles the flags
    assert [reads.per_step[i] for i in steady] == [own[i - 1] for i in steady], reads.reads(steady)
    assert trainer.batch_processor.nonfinite.device_flags is not None  # the guard is on
    assert not any("blocking host read" in r.getMessage() for r in caplog.records)


def test_skip_policy_with_a_plain_optimizer_keeps_the_blocking_check_and_says_so_once(caplog):
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(8)]
    trainer = Trainer(model=model, data_loader=data, device=None, num_epochs=1,
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                                                          nonfinite_policy="skip"))
    reads = HostReads().attach(trainer)
    with caplog.at_level("INFO", logger="hat_ignite.engine.processors.nonfinite"), reads:
        trainer.fit()
    assert all(len(r) == 2 for r in reads.reads(range(2, 9)).values()) and len(reads.reads(range(2, 9))) == 7
    told = [r.getMessage() for r in caplog.records if "blocking host read" in r.getMessage()]
    assert len(told) == 1 and "SGD cannot skip one on the device (no fused=True)" in told[0]


def test_the_shipped_digits_config_reads_only_at_log_steps(tmp_path):
    cfg = Config.fromfile(ROOT / "configs" / "classification" / "digits_mlp.py")
    cfg.relocate_paths(cfg.to_dict()["work_dir"], str(tmp_path / "work"))
    cfg.merge_opts(["float_trainer.num_epochs=3"])
    trainer = cfg.build("float_trainer")
    reads = HostReads().attach(trainer)
    with reads:
        trainer.fit()
    length = trainer.state.epoch_length
    tensorboard = {i for i in range(1, trainer.state.iteration + 1) if (i - 1) % 5 == 0}  # update_freq=5, HAT's steps
    boundaries = {e * length + d for e in range(4) for d in (0, 1)}  # last and first step of epochs
    counted = [i for i in range(2, trainer.state.iteration + 1) if i not in tensorboard | boundaries]
    assert len(counted) >= 30
    assert {i: reads.where[i] for i in counted if reads.per_step[i]} == {}
    assert any(reads.per_step[i] for i in tensorboard)  # the counter sees the reads where they are


COUNTED = ["fused SGD", "SGD momentum", "AdamW"]


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One 2-process job counting the host reads of a run with each optimizer of COUNTED, in turn."""
    return run_job("count", tmp_path_factory.mktemp("counted"), COUNTED, timeout=400)


@pytest.mark.parametrize("name", COUNTED)
def test_a_two_process_gloo_run_reads_nothing_beyond_the_optimizer_itself(counted, name):
    own = _optimizer_own_reads(OPTIMIZERS[name], 36)[5:36]  # steps 6..35, as counted there
    for rank in (0, 1):
        result = torch.load(counted / result_file("count", name, rank), weights_only=True)
        assert result["iteration"] == 40
        assert result["per_step"] == own[:30], result["reads"]


def test_the_package_reads_no_memory_through_ctypes():
    sources = [p for p in (ROOT / "hat_ignite").rglob("*.py") if "ctypes" in p.read_text()]
    assert sources == []
