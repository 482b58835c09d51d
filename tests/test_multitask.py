"""TaskSampler, MultitaskLoader and the data-parallel pieces that run in one process."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from hat_ignite.data import DigitsDataset, DigitsParityDataset, MultitaskLoader
from hat_ignite.engine import (
    DataParallelTrainer,
    DistributedDataParallelTrainer,
    MultiBatchProcessor,
    TaskSampler,
    Trainer,
    build_launcher,
    collect_loss_by_index,
)
from hat_ignite.engine.dist_data import distributed_loader
from hat_ignite.models import MLPClassifier, MultiTaskMLP


def draws(sampler: TaskSampler, n: int, **kw) -> list[list[str]]:
    return [sampler.sample_task(**kw) for _ in range(n)]


def test_sampling_methods_follow_the_factors():
    assert draws(TaskSampler({"a": 1, "b": 2}, method="sample_all"), 2) == [["a", "b", "b"]] * 2
    assert draws(TaskSampler({"a": 1, "b": 2}, method="sample_one"), 6) == [["a"], ["b"], ["b"]] * 2
    part = TaskSampler({"a": 1, "b": 1, "c": 1}, method="sample_part", unions=[["a", "b"], ["c"]])
    assert draws(part, 3) == [["a", "b"], ["c"], ["a", "b"]]
    assert draws(TaskSampler({"a": 1, "b": 0}, method="sample_one"), 2) == [["a"], ["a"]]


def test_random_and_shuffled_draws_are_seeded_and_resumable():
    weighted = TaskSampler({"a": 3, "b": 1}, method="sample_random", seed=7)
    seq = draws(weighted, 400)
    assert seq == draws(TaskSampler({"a": 3, "b": 1}, method="sample_random", seed=7), 400)  # every rank alike
    assert 0.65 < seq.count(["a"]) / 400 < 0.85
    shuffled = TaskSampler({"a": 1, "b": 1, "c": 1}, shuffle=True, seed=3)
    draws(shuffled, 4)
    state = shuffled.state_dict()
    ahead = draws(shuffled, 7)
    resumed = TaskSampler({"a": 1, "b": 1, "c": 1}, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert draws(resumed, 7) == ahead
    assert sorted(t for u in ahead[2:5] for t in u) == ["a", "b", "c"]  # a cycle holds each task once


def test_epoch_and_step_ranges_and_bad_configs():
    sampler = TaskSampler({"a": dict(end_epoch=1), "b": dict(start_step=2)}, method="sample_all")
    assert sampler.sample_task(epoch=0) == ["a", "b"] and sampler.sample_task(epoch=1) == ["b"]
    assert sampler.sample_task(step=0) == ["a"]
    with pytest.raises(ValueError, match="no task trains at epoch=1, step=0"):
        sampler.sample_task(epoch=1, step=0)
    with pytest.raises(ValueError, match="gpu_group"):
        TaskSampler({"a": dict(gpu_group="0")})
    with pytest.raises(ValueError, match="method must be one of"):
        TaskSampler({"a": 1}, method="sample_repeat")
    with pytest.raises(ValueError, match="names tasks \\['z'\\]"):
        TaskSampler({"a": 1}, method="sample_part", unions=[["z"]])
    with pytest.raises(ValueError, match="end_epoch=1 must be greater"):
        TaskSampler({"a": dict(start_epoch=2, end_epoch=1)})


def test_multitask_loader_cycles_short_loaders_and_reaches_every_sampler():
    small = DataLoader(Subset(DigitsParityDataset("val"), range(40)), batch_size=20)
    big = DataLoader(Subset(DigitsDataset("val"), range(100)), batch_size=20)
    loader = MultitaskLoader({"digits": big, "parity": small}, TaskSampler({"digits": 1, "parity": 1}, "sample_one"))
    steps = list(loader)
    assert len(steps) == len(loader) == 5
    assert [list(s[0]) for s in steps] == [["digits"], ["parity"], ["digits"], ["parity"], ["digits"]]
    assert set(steps[1][0]["parity"]["labels"].tolist()) <= {0, 1}
    sharded = distributed_loader(loader, num_replicas=2, rank=1, seed=5)
    for sub in sharded.loaders.values():
        assert isinstance(sub.sampler, DistributedSampler) and sub.batch_size == 20
    sharded.set_epoch(3)
    assert all(sub.sampler.epoch == 3 for sub in sharded.loaders.values())
    with pytest.raises(ValueError, match="names tasks \\['x'\\] that have no loader"):
        MultitaskLoader({"digits": big}, TaskSampler({"x": 1}))


def test_distributed_loader_keeps_the_per_process_batch_size_and_shuffling():
    data = list(range(10))
    shuffled = distributed_loader(DataLoader(data, batch_size=2, shuffle=True), num_replicas=2, rank=0, seed=1)
    assert shuffled.batch_size == 2 and shuffled.sampler.shuffle and shuffled.sampler.seed == 1
    other = distributed_loader(DataLoader(data, batch_size=2, shuffle=True), num_replicas=2, rank=1, seed=1)
    seen = [int(x) for b in list(shuffled) + list(other) for x in b]
    assert sorted(seen) == data  # the two shards cover the epoch once
    weighted = torch.utils.data.WeightedRandomSampler([1.0] * 10, 10)
    proxied = distributed_loader(DataLoader(data, batch_size=2, sampler=weighted), num_replicas=2, rank=0)
    assert type(proxied.sampler).__name__ == "DistributedProxySampler"


def test_multitask_model_trains_both_heads_in_one_process():
    torch.manual_seed(0)
    loaders = {
        "digits": DataLoader(DigitsDataset("train"), batch_size=64, shuffle=True),
        "parity": DataLoader(DigitsParityDataset("train"), batch_size=64, shuffle=True),
    }
    model = MultiTaskMLP({"digits": 10, "parity": 2}, hidden_features=64)
    trainer = Trainer(
        model=model, data_loader=MultitaskLoader(loaders), optimizer=torch.optim.Adam(model.parameters(), 1e-2),
        batch_processor=MultiBatchProcessor(need_grad_update=True, delay_sync=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=2,
    )
    trainer.fit()
    model.eval()
    val = {"digits": DigitsDataset("val"), "parity": DigitsParityDataset("val")}
    with torch.no_grad():
        acc = {t: float((model({t: {"img": d.images}})[t].argmax(1) == d.labels).float().mean()) for t, d in val.items()}
    assert acc["digits"] > 0.8 and acc["parity"] > 0.8, acc


def test_data_parallel_trainer_on_the_cpu_trains_like_trainer():
    def run(cls):
        torch.manual_seed(0)
        model = MLPClassifier(hidden_features=16)
        loader = DataLoader(Subset(DigitsDataset("train"), range(64)), batch_size=16)
        cls(model=model, data_loader=loader, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            batch_processor=MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
            device=None, num_epochs=1).fit()
        return model.state_dict()

    a, b = run(Trainer), run(DataParallelTrainer)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(TypeError, match="list of GPU ids"):
        DataParallelTrainer(model=MLPClassifier(), data_loader=[], optimizer=None, batch_processor=lambda e, b: None,
                            device="0,1", num_epochs=1)


def test_ddp_trainer_without_a_process_group_says_how_to_start_one():
    with pytest.raises(RuntimeError, match="hat-train CONFIG --nproc N"):
        DistributedDataParallelTrainer(model=MLPClassifier(), data_loader=[], optimizer=None,
                                       batch_processor=lambda e, b: None, device=None, num_epochs=1)
    assert build_launcher({"type": "DistributedDataParallelTrainer"}).__name__ == "launch_distributed"
    devices = []
    build_launcher("DataParallelTrainer")(lambda device: devices.append(device), device_ids=[0, 1])
    build_launcher("Trainer")(lambda device: devices.append(device))
    assert devices == [[0, 1], None]
    with pytest.raises(ValueError, match="DistributedDataParallelTrainer launcher"):
        build_launcher("Trainer")(lambda device: None, num_processes=2)
