"""TaskSampler, MultitaskLoader and the data-parallel pieces that run in one process."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from hat_ignite.data import DigitsDataset, DigitsParityDataset, MultitaskLoader
from hat_ignite.engine import (
    DataParallelTrainer,
    DistributedDataParallelTrainer,
    HatEvents,
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
    # max_size: the epoch ends when a task has given max(5, 2) = 5 batches; sample_one alternates
    assert len(steps) == len(loader) == 10
    assert [list(s) for s in steps] == [["digits"], ["parity"]] * 5
    assert set(steps[1]["parity"]["labels"].tolist()) <= {0, 1}
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
        model=model, data_loader=MultitaskLoader(loaders, return_task=True),
        optimizer=torch.optim.Adam(model.parameters(), 1e-2),
        batch_processor=MultiBatchProcessor(need_grad_update=True, delay_sync=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=2,
    )
    trainer.fit()
    model.eval()
    val = {"digits": DigitsDataset("val"), "parity": DigitsParityDataset("val")}
    with torch.no_grad():
        acc = {t: float((model({t: {"img": d.images}})[t].argmax(1) == d.labels).float().mean()) for t, d in val.items()}
    assert acc["digits"] > 0.8 and acc["parity"] > 0.8, acc


def test_data_parallel_trainer_on_the_cpu_trains_the_given_model_unwrapped_like_trainer(caplog):
    """On the CPU DataParallel has nothing to split over: the model given is trained as it is (and the
    log says so), step for step as Trainer trains it."""

    def run(cls):
        torch.manual_seed(0)
        model = MLPClassifier(hidden_features=16)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        loader = DataLoader(Subset(DigitsDataset("train"), range(64)), batch_size=16)
        trainer = cls(model=model, data_loader=loader, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      batch_processor=MultiBatchProcessor(need_grad_update=True,
                                                          loss_collector=collect_loss_by_index(0)),
                      device=None, num_epochs=1)
        losses = []
        trainer.add_event_handler(HatEvents.STEP_END, lambda engine: losses.append(engine.state.losses[0].detach().clone()))
        trainer.fit()
        return trainer, model, start, losses

    with caplog.at_level(logging.INFO, logger="hat_ignite.engine.ddp_trainer"):
        dp, dp_model, start, dp_losses = run(DataParallelTrainer)
    assert dp.model is dp_model and dp.device_ids == []
    assert "DataParallelTrainer(device=None): training on the CPU, the model is not wrapped" in caplog.text
    plain, plain_model, _, plain_losses = run(Trainer)
    assert len(dp_losses) == 4 and all(torch.equal(a, b) for a, b in zip(dp_losses, plain_losses))
    trained, reference = dp_model.state_dict(), plain_model.state_dict()
    assert all(torch.equal(trained[k], reference[k]) for k in reference)
    assert all(not torch.equal(trained[k], start[k]) for k in start)  # it did train
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


# Each case: HAT's MultitaskLoader (hat/data/dataloaders/multitask_loader.py) and TaskSampler, run
# with the loaders range(6) and range(4) in batches of 2 (a: 3 batches, b: 2), return_task=True;
# the first epoch's steps as [(task, batch)] lists, measured with HAT's own code.
HAT_EPOCHS = {
    ("sample_one", (1, 2), "max_size"): [
        [("a", [0, 1])], [("b", [0, 1])], [("b", [2, 3])], [("a", [2, 3])], [("b", [0, 1])], [("b", [2, 3])],
        [("a", [4, 5])]],
    ("sample_all", (1, 2), "max_size"): [
        [("a", [0, 1]), ("b", [0, 1])], [("a", [2, 3]), ("b", [2, 3])], [("a", [4, 5]), ("b", [0, 1])],
        [("a", [0, 1]), ("b", [2, 3])]],
    ("sample_all", (1, 1), "validation"): [
        [("a", [0, 1]), ("b", [0, 1])], [("a", [2, 3]), ("b", [2, 3])], [("a", [4, 5])]],
    ("sample_one", (1, 1), "validation"): [
        [("a", [0, 1])], [("b", [0, 1])], [("a", [2, 3])], [("b", [2, 3])], [("a", [4, 5])], []],
    ("sample_one", (1, 1), "min_size"): [
        [("a", [0, 1])], [("b", [0, 1])], [("a", [2, 3])], [("b", [2, 3])], [("a", [4, 5])]],
}


@pytest.mark.parametrize("method, factors, mode", list(HAT_EPOCHS))
def test_multitask_loader_steps_are_hats(method, factors, mode):
    loaders = {"a": DataLoader(list(range(6)), batch_size=2), "b": DataLoader(list(range(4)), batch_size=2)}
    sampler = TaskSampler({"a": factors[0], "b": factors[1]}, method=method)
    loader = MultitaskLoader(loaders, sampler, mode=mode, return_task=True)
    steps = [[(task, batch.tolist()) for batch, task in step] for step in loader]
    assert steps == HAT_EPOCHS[method, factors, mode]
    assert len(loader) == len(steps)  # the loop runs exactly the steps HAT's first epoch has
    assert loader.batch_size == 2 * factors[0] + 2 * factors[1]  # HAT's batch_size: sum times factor


def test_multitask_loader_dict_steps_wrapped_pairs_and_custom_length():
    loaders = {"a": DataLoader(list(range(6)), batch_size=2), "b": DataLoader(list(range(4)), batch_size=2)}
    # no task sampler: one {task: batch} dict a step (HAT's default), b starting again (max_size)
    assert [{k: v.tolist() for k, v in s.items()} for s in MultitaskLoader(loaders)] == [
        {"a": [0, 1], "b": [0, 1]}, {"a": [2, 3], "b": [2, 3]}, {"a": [4, 5], "b": [0, 1]}]
    assert len(MultitaskLoader(loaders, mode="min_size")) == 2
    assert len(list(MultitaskLoader(loaders, custom_length=2))) == len(MultitaskLoader(loaders, custom_length=2)) == 2
    records = DataLoader([{"x": i} for i in range(4)], batch_size=2)
    wrapped = list(MultitaskLoader({"a": records}, return_task=True, wrap_batch=True))
    assert [(sorted(batch), task) for step in wrapped for batch, task in step] == [(["a", "x"], "a")] * 2
    assert wrapped[0][0][0]["a"]["x"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="mode must be one of max_size, min_size, validation"):
        MultitaskLoader(loaders, mode="longest")


def test_collect_loss_by_regex_finds_hats_graph_model_losses():
    from collections import namedtuple

    from hat_ignite.engine.processors.loss_collectors import collect_loss_by_regex, to_flat_ordered_dict

    Out = namedtuple("OrderedOutput", ["task1_toy_ToyLoss", "task1_toy_predict", "task1_toy_target"])
    outs = (Out(torch.tensor(1.5), torch.zeros(2, 3), torch.tensor([0, 1])),)
    # keys and collected losses measured with HAT's to_flat_ordered_dict / collect_loss_by_regex
    assert list(to_flat_ordered_dict(outs)) == ["0_task1_toy_ToyLoss", "0_task1_toy_predict", "0_task1_toy_target"]
    assert collect_loss_by_regex("^.*loss.*")(outs) == [torch.tensor(1.5)]
    pair = ({"img": torch.zeros(2, 3), "task1_label": torch.tensor([0, 1])}, "task1")
    assert list(to_flat_ordered_dict(pair)) == ["0_img", "0_task1_label", "1"]
    nested = {"a": [{"c": 1}], "d": (2, 3), "e": {"Loss": torch.tensor(2.0), "f": [torch.tensor(3.0)]}}
    assert list(to_flat_ordered_dict(nested)) == ["a_0_c", "d_0", "d_1", "e_Loss", "e_f_0"]
    assert list(to_flat_ordered_dict(nested, flat_condition=lambda k, v: not isinstance(v, tuple))) == [
        "a_0_c", "d", "e_Loss", "e_f_0"]
    with pytest.raises(ValueError, match="no model output matches; the outputs are \\['0_task1_toy_ToyLoss'"):
        collect_loss_by_regex("^.*cls_loss")(outs)
    with pytest.raises(TypeError, match="'0_task1_toy_target' matches but is a str, not a tensor"):
        collect_loss_by_regex("^.*target")(({"task1_toy_target": "label"},))


def test_metric_update_funcs_and_a_one_argument_filter_condition():
    from hat_ignite.callbacks import MetricUpdater, update_metric_using_index, update_metric_using_regex
    from hat_ignite.metrics import Accuracy

    pair = ({"img": torch.zeros(2, 3), "task1_label": torch.tensor([0, 2])}, "task1")
    outs = ({"task1_toy_predict": torch.tensor([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7]])},)
    update = update_metric_using_regex([dict(label_pattern="^.*task1_label.*", pred_pattern="^.*task1.*predict")])
    updater = MetricUpdater(update, metrics=[Accuracy()], filter_condition=lambda x: x[1] == "task1")
    updater.on_batch_end(batch=pair, model_outs=outs)
    updater.on_batch_end(batch=(pair[0], "task2"), model_outs=outs)  # another task's batch: filtered out
    assert updater.metrics[0].get() == ("accuracy", 1.0)
    metrics = [Accuracy(), Accuracy()]
    update_metric_using_index([dict(label_idx=0, pred_idx=0), dict(label_idx=1, pred_idx=1)])(
        metrics, [torch.tensor([1]), torch.tensor([2])], [torch.tensor([1]), torch.tensor([3])])
    assert [m.get()[1] for m in metrics] == [1.0, 0.0]
    with pytest.raises(ValueError, match="2 pattern\\(s\\) are given for 1 metric"):
        update_metric_using_index([dict(label_idx=0, pred_idx=0)] * 2)([Accuracy()], [1], [1])


def test_grad_scale_tells_the_task_of_a_batch_task_pair():
    """GradScale's task entries apply to (batch, task) pairs (HAT: ``task in batch``)."""
    from hat_ignite.callbacks import GradScale

    def trunk_after_one_step(tasks, callbacks):
        torch.manual_seed(0)
        model = MultiTaskMLP({"digits": 10, "parity": 2}, hidden_features=16)
        data = {"digits": DigitsDataset("val"), "parity": DigitsParityDataset("val")}
        loaders = {t: DataLoader(Subset(data[t], range(32)), batch_size=32) for t in tasks}
        Trainer(model=model, data_loader=MultitaskLoader(loaders, return_task=True),
                optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                batch_processor=MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                device=None, num_epochs=1, callbacks=callbacks).fit()
        return model.trunk[0].weight.detach().clone()

    # the parity batch's gradient into the trunk scaled to 0: the trunk moves as with digits alone
    scaled = trunk_after_one_step(["digits", "parity"], [GradScale([("trunk", 0.0, "parity")])])
    assert torch.allclose(scaled, trunk_after_one_step(["digits"], []), atol=1e-6)
    assert not torch.allclose(scaled, trunk_after_one_step(["digits", "parity"], []), atol=1e-4)
