"""Checkpoint: the files written, best selection, crash safety, verified loading, exact resume.

Real models, optimizers, data loaders and files on disk; no mocks.
"""

from __future__ import annotations

import copy
import os
import re
import resource
import signal

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.callbacks.checkpoint import Checkpoint, list_checkpoints
from hat_ignite.callbacks.checkpoint_io import HASH_KEY, content_hash, load_checkpoint
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint, restore_training_state, resume_from
from hat_ignite.callbacks.lr_updater import CosLrUpdater
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.errors import CheckpointError

STEPS_PER_EPOCH = 3


class DropoutNet(nn.Module):
    """Small regression net whose dropout makes the result depend on the torch RNG."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.body = nn.Linear(4, hidden)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.head(self.drop(torch.relu(self.body(x)))), y),)


def make_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4 * STEPS_PER_EPOCH, 4, generator=g), torch.randn(4 * STEPS_PER_EPOCH, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)


def make_trainer(callbacks, model=None, seed=0, **kwargs) -> Trainer:
    torch.manual_seed(seed)
    model = model if model is not None else DropoutNet()
    if "num_steps" in kwargs:
        kwargs.setdefault("stop_by", "step")
    else:
        kwargs.setdefault("num_epochs", 5)
    return Trainer(
        model=model, data_loader=make_loader(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, callbacks=callbacks, **kwargs,
    )


def files(directory) -> list[str]:
    return sorted(os.listdir(directory))


def load_all_weights_only(directory) -> dict:
    """Load every file in ``directory`` with plain torch.load(weights_only=True)."""
    return {name: torch.load(os.path.join(directory, name), weights_only=True) for name in files(directory)}


class FeedMetric(CallbackMixin):
    """Puts a validation-like value into the loop's storage at each epoch end, as a tensor at
    ``storage[key]`` or, like validation does, as a float at ``storage["monitor_obj"][key]``."""

    def __init__(self, key: str, values, nested: bool) -> None:
        self.key, self.values, self.nested = key, values, nested

    def on_epoch_end(self, epoch_id, storage, **kwargs):
        if self.nested:
            storage["monitor_obj"] = {"loss": 1.0, self.key: self.values[epoch_id]}
        else:
            storage[self.key] = torch.tensor(self.values[epoch_id])


# -- files written -----------------------------------------------------------------------------
def test_epoch_interval_writes_exactly_the_expected_files(tmp_path):
    ckpt = Checkpoint(tmp_path, save_interval=2)
    make_trainer([ckpt], num_epochs=5).fit()
    names = files(tmp_path)
    assert len(names) == 3 and names[2] == "checkpoint-last.pth.tar"
    assert re.fullmatch(r"checkpoint-epoch-0001-[0-9a-f]{8}\.pth\.tar", names[0])
    assert re.fullmatch(r"checkpoint-epoch-0003-[0-9a-f]{8}\.pth\.tar", names[1])
    loaded = load_all_weights_only(tmp_path)
    for name, ckpt_dict in loaded.items():
        assert ckpt_dict[HASH_KEY] == content_hash(ckpt_dict)
    assert [loaded[n][HASH_KEY][:8] for n in names[:2]] == [n[-16:-8] for n in names[:2]]
    assert (loaded[names[1]]["epoch"], loaded[names[1]]["progress"]["iteration"]) == (3, 4 * STEPS_PER_EPOCH)
    # the end of training updates last with the final state
    assert loaded[names[2]]["progress"]["iteration"] == 5 * STEPS_PER_EPOCH


@pytest.mark.parametrize("save_on_train_end, last_iteration", [(True, 7), (False, 6)])
def test_step_interval_with_num_steps_and_save_on_train_end(tmp_path, save_on_train_end, last_iteration):
    ckpt = Checkpoint(tmp_path, name_prefix="float-", interval_by="step", save_interval=3, save_hash=False,
                      save_on_train_end=save_on_train_end)
    make_trainer([ckpt], num_steps=7).fit()
    assert files(tmp_path) == ["float-checkpoint-last.pth.tar", "float-checkpoint-step-2.pth.tar",
                               "float-checkpoint-step-5.pth.tar"]
    loaded = load_all_weights_only(tmp_path)
    assert loaded["float-checkpoint-step-5.pth.tar"]["step"] == 5
    assert loaded["float-checkpoint-last.pth.tar"]["progress"]["iteration"] == last_iteration


def test_checkpoint_holds_what_a_resume_needs(tmp_path):
    trainer = make_trainer([CosLrUpdater(warmup_len=2), Checkpoint(tmp_path)], num_epochs=1)
    trainer.ema_model = copy.deepcopy(nn.DataParallel(trainer.model).module)
    trainer.fit()
    saved = torch.load(tmp_path / "checkpoint-last.pth.tar", weights_only=True)
    assert set(saved) >= {"hat_ignite_format", "epoch", "step", "state_dict", "optimizer", "grad_scaler",
                          "ema_state_dict", "callbacks", "progress", "rng", "versions", HASH_KEY}
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in trainer.model.state_dict().items())
    assert set(saved["ema_state_dict"]) == set(trainer.model.state_dict())
    assert saved["optimizer"]["state"]  # momentum buffers
    assert saved["callbacks"]["CosLrUpdater"] == {"base_lrs": [0.05]}
    assert saved["callbacks"]["Checkpoint"] == {"best": None, "mode": None, "best_iteration": None}
    assert saved["progress"] == {"epoch": 1, "iteration": 3, "epoch_length": 3, "stop_by": "epoch",
                                 "num_epochs": 1, "num_steps": None, "world_size": 1}
    assert saved["rng"]["torch"].dtype == torch.uint8 and saved["rng"]["numpy"]["keys"].numel() == 624


# -- best --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, best_epoch, nested", [("max", 3, False), ("min", 1, False), ("max", 3, True)])
def test_best_follows_the_metric_in_storage(tmp_path, mode, best_epoch, nested):
    values = [0.5, 0.2, 0.6, 0.9, 0.3]
    ckpt = Checkpoint(tmp_path, mode=mode, monitor_metric_key="acc")
    make_trainer([FeedMetric("acc", values, nested), ckpt], num_epochs=5).fit()
    best = load_checkpoint(ckpt.best_path)
    assert best["epoch"] == best_epoch and ckpt.best == pytest.approx(values[best_epoch])
    assert best["callbacks"]["Checkpoint"]["best"] == pytest.approx(values[best_epoch])
    (epoch_file,) = [p for p in list_checkpoints(tmp_path) if f"epoch-{best_epoch:04d}" in p]
    same = load_checkpoint(epoch_file)
    assert all(torch.equal(same["state_dict"][k], v) for k, v in best["state_dict"].items())


def test_a_misspelt_monitored_key_says_did_you_mean_and_fails_at_the_end(tmp_path, caplog):
    ckpt = Checkpoint(tmp_path, mode="max", monitor_metric_key="acuracy")
    with caplog.at_level("WARNING", logger="hat_ignite.callbacks.checkpoint"):
        with pytest.raises(ValueError) as info:
            make_trainer([FeedMetric("accuracy", [0.5, 0.7, 0.6], True), ckpt], num_epochs=3).fit()
    warned = [r.getMessage() for r in caplog.records if "monitored metric" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("Did you mean 'accuracy'?")  # at the first result
    assert str(info.value).startswith("Checkpoint(monitor_metric_key='acuracy'): no result of this run had "
                                      "that key, so no best checkpoint was written. Did you mean 'accuracy'?")
    assert os.path.exists(ckpt.last_path) and not os.path.exists(ckpt.best_path)  # the last state is kept
    quiet = Checkpoint(tmp_path / "quiet", mode="max", monitor_metric_key="accuracy")
    make_trainer([quiet], num_epochs=1).fit()  # no result at all yet (no validation ran): no error


class RunningAccuracy:
    """A metric object in HAT's shape: get() returns (names, values)."""

    def __init__(self) -> None:
        self.correct = self.seen = 0

    def update(self, correct: int, seen: int) -> None:
        self.correct, self.seen = self.correct + correct, self.seen + seen

    def get(self):
        return ["acc", "seen"], [self.correct / self.seen, self.seen]


class UpdateMetric(CallbackMixin):
    def __init__(self, metric, correct_per_epoch) -> None:
        self.metric, self.correct_per_epoch = metric, correct_per_epoch

    def on_epoch_end(self, epoch_id, **kwargs):
        self.metric.update(self.correct_per_epoch[epoch_id], 10)


def test_best_from_a_best_refer_metric_object(tmp_path):
    metric = RunningAccuracy()  # running accuracy: 0.2, 0.5, 0.4, 0.325
    ckpt = Checkpoint(tmp_path, mode="max", monitor_metric_key="acc", best_refer_metric=metric)
    make_trainer([UpdateMetric(metric, [2, 8, 2, 1]), ckpt], num_epochs=4).fit()
    assert load_checkpoint(ckpt.best_path)["epoch"] == 1 and ckpt.best == pytest.approx(0.5)


# -- crash safety ------------------------------------------------------------------------------
def test_keep_n_rotation_ignores_and_clears_a_crashed_temp_file(tmp_path, caplog):
    leftover = tmp_path / ".checkpoint-epoch-0009-deadbeef.pth.tar.0badc0de.tmp"
    leftover.write_bytes(b"half a checkpoint")
    assert list_checkpoints(tmp_path) == []
    with caplog.at_level("INFO", logger="hat_ignite.callbacks.checkpoint"):
        make_trainer([Checkpoint(tmp_path, keep_n=2)], num_epochs=5).fit()
    saved = [r.getMessage().split()[2].rstrip(".") for r in caplog.records if r.getMessage().startswith("Saved checkpoint")]
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Removed old checkpoint")]
    # every file a log line named and rotation deleted is named again when it goes
    assert removed == [f"Removed old checkpoint {path} (keep_n=2)." for path in saved[:3]]
    names = files(tmp_path)
    assert len(names) == 3 and names[2] == "checkpoint-last.pth.tar"
    assert [n[:22] for n in names[:2]] == ["checkpoint-epoch-0003-", "checkpoint-epoch-0004-"]
    assert [os.path.basename(p) for p in list_checkpoints(tmp_path)] == names[:2]


class LimitFileSize(CallbackMixin):
    """From epoch ``at`` on, the process may write no file beyond ``limit`` bytes (EFBIG)."""

    def __init__(self, at: int, limit: int) -> None:
        self.at, self.limit = at, limit

    def on_epoch_end(self, epoch_id, **kwargs):
        if epoch_id == self.at:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_a_failed_write_keeps_the_previous_checkpoints(tmp_path):
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        trainer = make_trainer([LimitFileSize(at=2, limit=1024), Checkpoint(tmp_path)], num_epochs=4)
        with pytest.raises(CheckpointError, match=re.escape(str(tmp_path)) + ".*File too large"):
            trainer.fit()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    names = files(tmp_path)
    assert len(names) == 3 and not any(n.startswith(".") for n in names)  # no temp file left behind
    assert load_checkpoint(tmp_path / "checkpoint-last.pth.tar")["epoch"] == 1


def test_a_state_torch_cannot_load_safely_is_refused_when_saving(tmp_path):
    class NumpyState(CallbackMixin):
        def state_dict(self):
            return {"history": np.zeros(3)}

        def load_state_dict(self, state):
            pass

    with pytest.raises(TypeError, match=r"callbacks\.NumpyState\.history is a numpy\.ndarray"):
        make_trainer([NumpyState(), Checkpoint(tmp_path)], num_epochs=1).fit()
    assert files(tmp_path) == []


# -- loading errors ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("saved")
    trainer = make_trainer([Checkpoint(directory)], num_epochs=1)
    trainer.fit()
    return directory / "checkpoint-last.pth.tar", trainer.model


def _flip_inside_tensor(data: bytes, tensor: torch.Tensor) -> bytes:
    raw = tensor.detach().contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at > 0 and data.find(raw, at + 1) == -1
    corrupted = bytearray(data)
    corrupted[at + len(raw) // 2] ^= 0x10
    return bytes(corrupted)


@pytest.mark.parametrize("damage, reason", [
    ("missing", "does not exist"),
    ("empty", "empty"),
    ("truncated", "truncated"),
    ("garbage", "not a complete torch.save archive"),
    ("flipped", "corrupt: its content hash"),
])
def test_damaged_files_raise_checkpoint_error_naming_the_path(tmp_path, saved_checkpoint, damage, reason):
    source, model = saved_checkpoint
    data = source.read_bytes()
    path = tmp_path / "sub" / ".." / f"{damage}.pth.tar"  # the error names the absolute, normalised path
    (tmp_path / "sub").mkdir()
    content = {
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "garbage": np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "flipped": _flip_inside_tensor(data, model.body.weight),
    }
    if damage != "missing":
        path.write_bytes(content[damage])
    expected = str(tmp_path / f"{damage}.pth.tar")
    for load in (load_checkpoint, lambda p: LoadCheckpoint(p)(DropoutNet()),
                 lambda p: resume_from(make_trainer([], num_epochs=1), p)):
        with pytest.raises(CheckpointError, match=re.escape(expected) + ".*" + reason):
            load(path)


def test_a_flipped_byte_is_not_noticed_by_torch_alone(tmp_path, saved_checkpoint):
    source, model = saved_checkpoint
    path = tmp_path / "flipped.pth.tar"
    path.write_bytes(_flip_inside_tensor(source.read_bytes(), model.body.weight))
    silently_wrong = torch.load(path, weights_only=True)["state_dict"]["body.weight"]
    assert not torch.equal(silently_wrong, model.body.weight)  # why the content hash is there


def test_renamed_file_does_not_match_its_name(tmp_path):
    ckpt = Checkpoint(tmp_path)
    make_trainer([ckpt], num_epochs=2).fit()
    first, second = list_checkpoints(tmp_path)
    impostor = first[: -len("12345678.pth.tar")] + os.path.basename(second)[-16:]
    os.replace(first, impostor)
    with pytest.raises(CheckpointError, match=re.escape(impostor) + ".*does not match its name"):
        load_checkpoint(impostor)


def bigger_model() -> nn.Module:
    """DropoutNet's weights plus one more layer."""
    return nn.ModuleDict({"body": nn.Linear(4, 8), "head": nn.Linear(8, 1), "extra": nn.Linear(1, 1)})


def test_another_models_checkpoint_is_refused(saved_checkpoint):
    path, _ = saved_checkpoint
    where = re.escape(str(path))
    shapes = r".*3 shape mismatch.*body\.weight: checkpoint \(8, 4\) vs model \(16, 4\)"
    with pytest.raises(CheckpointError, match=where + shapes):
        LoadCheckpoint(path)(DropoutNet(hidden=16))
    with pytest.raises(CheckpointError, match=where + r".*missing from the checkpoint \[extra\.weight"):
        LoadCheckpoint(path)(bigger_model())
    with pytest.raises(CheckpointError, match=where + r".*the model does not have \[head\.weight"):
        LoadCheckpoint(path)(nn.ModuleDict({"body": nn.Linear(4, 8)}))


def test_load_checkpoint_converter_options(saved_checkpoint):
    path, trained = saved_checkpoint
    model = LoadCheckpoint(path)(DropoutNet())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    part = LoadCheckpoint(path, ignore_extra=True)(nn.ModuleDict({"body": nn.Linear(4, 8)}))
    assert torch.equal(part["body"].weight, trained.body.weight)
    bigger = bigger_model()
    extra_before = bigger["extra"].weight.clone()
    LoadCheckpoint(path, allow_miss=True)(bigger)
    assert torch.equal(bigger["head"].weight, trained.head.weight)
    assert torch.equal(bigger["extra"].weight, extra_before)


# -- resume ------------------------------------------------------------------------------------
class CrashAfter(CallbackMixin):
    """Stops the process-like run with an error at the end of epoch ``epoch``."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, epoch_id, **kwargs):
        if epoch_id == self.epoch:
            raise KeyboardInterrupt(f"simulated crash after epoch {epoch_id}")


def _resume_run(path, save_dir, reseed=None) -> Trainer:
    trainer = make_trainer([CosLrUpdater(warmup_len=2), Checkpoint(save_dir)], seed=99, num_epochs=4,
                           resume_optimizer=True, resume_epoch_or_step=True)
    if reseed is None:
        report = resume_from(trainer, path)
        wanted = {"model", "optimizer", "progress (goes on at global step 6)", "callback CosLrUpdater", "rng:torch"}
        assert wanted <= set(report["restored"])
    else:  # the same resume without the saved generators, which another seed then drives
        saved = {k: v for k, v in load_checkpoint(path).items() if k != "rng"}
        assert "rng (none saved)" in restore_training_state(trainer, saved, path)["skipped"]
        torch.manual_seed(reseed)
    trainer.fit()
    return trainer


def test_resumed_run_ends_with_the_same_parameters_as_a_straight_run(tmp_path):
    straight = make_trainer([CosLrUpdater(warmup_len=2), Checkpoint(tmp_path / "straight")], num_epochs=4)
    straight.fit()
    crashed = make_trainer([CosLrUpdater(warmup_len=2), Checkpoint(tmp_path / "split"), CrashAfter(1)], num_epochs=4)
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()
    last = tmp_path / "split" / "checkpoint-last.pth.tar"
    resumed = _resume_run(last, tmp_path / "resumed")
    assert resumed.state.iteration == straight.state.iteration == 4 * STEPS_PER_EPOCH
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    # the generator state matters: the same resume with another dropout stream ends elsewhere
    reseeded = _resume_run(last, tmp_path / "reseeded", reseed=1234)
    assert not torch.equal(reseeded.model.body.weight, straight.model.body.weight)


def test_resume_restores_ema_weights_and_keeps_the_checkpoint_on_the_loop(tmp_path):
    first = make_trainer([Checkpoint(tmp_path)], num_epochs=1)
    first.ema_model = DropoutNet()
    first.fit()
    second = make_trainer([], seed=5, num_epochs=1)
    second.ema_model = DropoutNet()
    report = resume_from(second, tmp_path / "checkpoint-last.pth.tar")
    assert report["restored"] == ["model", "ema_model"]
    assert "optimizer and grad_scaler (resume_optimizer=False)" in report["skipped"]
    assert torch.equal(second.ema_model.head.weight, first.ema_model.head.weight)
    assert second.checkpoint["epoch"] == 0 and second.start_epoch == 0


def test_resume_with_optimizer_and_progress_off_restores_the_weights_only_and_says_so(tmp_path, caplog):
    first = make_trainer([Checkpoint(tmp_path)], num_epochs=2)
    first.fit()
    second = make_trainer([], seed=5, num_epochs=1)  # resume_optimizer / resume_epoch_or_step: False
    with caplog.at_level("INFO", logger="hat_ignite.checkpoint.restore"):
        report = resume_from(second, tmp_path / "checkpoint-last.pth.tar")
    assert report == {"restored": ["model"], "skipped": [
        "optimizer and grad_scaler (resume_optimizer=False)",
        "epoch/step, callback states and RNG (resume_epoch_or_step=False)",
    ]}
    assert all(torch.equal(a, b) for a, b in zip(second.model.state_dict().values(),
                                                 first.model.state_dict().values()))
    assert second.optimizer.state_dict()["state"] == {}  # no momentum buffers loaded
    assert second.start_epoch == 0 and second.checkpoint is not None
    assert "Not restored from" in caplog.text and "resume_optimizer=False" in caplog.text


def _fp16_trainer(save_dir, callbacks=(), **kwargs) -> Trainer:
    """fp16 autocast with a GradScaler whose scale moves: overflows at the start, growth every 2 steps."""
    torch.manual_seed(0)
    model = DropoutNet()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40, growth_interval=2)
    return Trainer(
        model=model, data_loader=make_loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                                            enable_amp=True, enable_amp_dtype=torch.float16, grad_scaler=scaler),
        device=None, num_epochs=4, callbacks=[Checkpoint(save_dir), *callbacks], **kwargs,
    )


def test_a_resumed_fp16_run_restores_the_grad_scaler_and_ends_bitwise_equal(tmp_path):
    straight = _fp16_trainer(tmp_path / "straight")
    straight.fit()
    scales = [load_checkpoint(p)["grad_scaler"]["scale"] for p in list_checkpoints(tmp_path / "straight")]
    assert len(set(scales)) > 1  # the scale changed during the run: there is state to restore
    crashed = _fp16_trainer(tmp_path / "split", callbacks=[CrashAfter(1)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit()
    resumed = _fp16_trainer(tmp_path / "resumed", resume_optimizer=True, resume_epoch_or_step=True)
    saved = load_checkpoint(tmp_path / "split" / "checkpoint-last.pth.tar")
    report = resume_from(resumed, tmp_path / "split" / "checkpoint-last.pth.tar")
    assert "grad_scaler" in " ".join(report["restored"])
    assert resumed.batch_processor.grad_scaler.get_scale() == saved["grad_scaler"]["scale"] != 2.0**40
    resumed.fit()
    assert resumed.state.iteration == straight.state.iteration == 4 * STEPS_PER_EPOCH
    assert resumed.batch_processor.grad_scaler.state_dict() == straight.batch_processor.grad_scaler.state_dict()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
