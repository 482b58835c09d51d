"""Validation inside training, on a real model learning the sklearn digits."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.callbacks.metric_updater import MetricUpdater
from hat_ignite.callbacks.validation import MeanTeacherValidation, Validation
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy

STEPS_PER_EPOCH = 6
_X, _Y = load_digits(return_X_y=True)
_X = torch.tensor(_X / 16.0, dtype=torch.float32)
_Y = torch.tensor(_Y)


def loader(start: int, stop: int, batch_size: int = 100) -> DataLoader:
    return DataLoader(TensorDataset(_X[start:stop], _Y[start:stop]), batch_size=batch_size, shuffle=False)


def train_loader() -> DataLoader:
    return loader(0, 600)  # 6 steps per epoch


def val_loader() -> DataLoader:
    return loader(600, 900)  # 3 steps


class DigitNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))

    def forward(self, x, y):
        logits = self.net(x)
        return nn.functional.cross_entropy(logits, y), logits


def update_metric(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch[1], model_outs[1])


class ValRecorder(CallbackMixin):
    """Runs inside the validation predictor: which model it got, and in which mode."""

    def __init__(self) -> None:
        self.model_ids: list[int] = []
        self.training_flags: list[bool] = []

    def on_loop_begin(self, model, **kwargs):
        self.model_ids.append(id(model))

    def on_step_begin(self, model, **kwargs):
        self.training_flags.append(model.training)


class Points(CallbackMixin):
    """Runs after Validation in training: notes each new storage['validation'] record."""

    def __init__(self) -> None:
        self.points: list[tuple] = []
        self._seen = None

    def _note(self, where: str, storage: dict) -> None:
        record = storage.get("validation")
        if record is not None and record is not self._seen:
            self.points.append((where, record["epoch_id"], record["global_step_id"]))
            self._seen = record

    def on_step_end(self, storage, **kwargs):
        self._note("step", storage)

    def on_epoch_end(self, storage, **kwargs):
        self._note("epoch", storage)

    def on_loop_end(self, storage, **kwargs):
        self._note("loop", storage)


def accuracy_of(model: nn.Module, data: DataLoader) -> float:
    model = copy.deepcopy(model).eval()
    with torch.no_grad():
        hits = sum(int((model(x, y)[1].argmax(1) == y).sum()) for x, y in data)
    return hits / len(data.dataset)


def fit(validation: Validation, extra_before=(), extra_after=(), model=None, **kwargs):
    torch.manual_seed(0)
    model = model if model is not None else DigitNet()
    points = Points()
    trainer = Trainer(
        model=model, data_loader=train_loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.3),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, val_metrics=[Accuracy()], callbacks=[*extra_before, validation, *extra_after, points], **kwargs,
    )
    trainer.fit()
    return trainer, points


def make_validation(rec: ValRecorder | None = None, **kwargs) -> Validation:
    callbacks = [MetricUpdater(update_metric, step_log_freq=0, log_prefix="Validation ")]
    if rec is not None:
        callbacks.append(rec)
    kwargs.setdefault("log_interval", 0)
    return Validation(val_loader(), BasicBatchProcessor(need_grad_update=False), callbacks, **kwargs)


def test_every_second_epoch_and_at_train_end():
    rec = ValRecorder()
    trainer, points = fit(make_validation(rec, val_interval=2), num_epochs=5)
    # at loop end HAT's epoch_id is one past the last epoch (5 after epochs 0..4)
    assert points.points == [("epoch", 1, 12), ("epoch", 3, 24), ("loop", 5, 30)]
    assert rec.model_ids == [id(trainer.model)] * 3 and rec.training_flags == [False] * 9
    storage = trainer.state.storage
    assert storage["monitor_obj"]["accuracy"] == pytest.approx(accuracy_of(trainer.model, val_loader()), abs=1e-6)
    assert storage["validation"]["results"]["monitor_obj"] == storage["monitor_obj"]
    assert storage["monitor_obj"]["accuracy"] > 0.85  # it trained
    assert trainer.model.training


def test_no_second_validation_of_the_same_point_and_val_on_train_end_off():
    _, points = fit(make_validation(val_interval=1), num_epochs=3)
    assert points.points == [("epoch", 0, 6), ("epoch", 1, 12), ("epoch", 2, 18)]
    _, points = fit(make_validation(val_interval=2, val_on_train_end=False), num_epochs=3)
    assert points.points == [("epoch", 1, 12)]


def test_every_n_steps():
    _, points = fit(make_validation(val_interval=4, interval_by="step"), stop_by="step", num_steps=14)
    assert points.points == [("step", 0, 3), ("step", 1, 7), ("step", 1, 11), ("loop", 3, 14)]
    _, points = fit(make_validation(val_interval=4, interval_by="step"), stop_by="step", num_steps=12)
    assert points.points == [("step", 0, 3), ("step", 1, 7), ("step", 1, 11)]


class HalfEMA(CallbackMixin):
    """A small EMA (momentum 0.5) that publishes its model as loop.ema_model."""

    def __init__(self) -> None:
        self.ema: nn.Module | None = None

    def on_loop_begin(self, loop, model, **kwargs):
        self.ema = copy.deepcopy(model)
        loop.ema_model = self.ema

    def on_step_end(self, model, **kwargs):
        with torch.no_grad():
            for e, p in zip(self.ema.state_dict().values(), model.state_dict().values()):
                if e.is_floating_point():
                    e.mul_(0.5).add_(p, alpha=0.5)
                else:
                    e.copy_(p)


def test_validates_the_ema_model_when_the_loop_has_one():
    rec, ema = ValRecorder(), HalfEMA()
    trainer, _ = fit(make_validation(rec), extra_before=[ema], num_epochs=2)
    assert rec.model_ids == [id(ema.ema)] * 2
    ema_acc = trainer.state.storage["monitor_obj"]["accuracy"]
    assert ema_acc == pytest.approx(accuracy_of(ema.ema, val_loader()), abs=1e-6)
    assert ema.ema.training  # its mode is restored too


class FreezeBN(CallbackMixin):
    def on_loop_begin(self, model, **kwargs):
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.eval()


class Snapshot(CallbackMixin):
    def __init__(self) -> None:
        self.state = None
        self.grads = None

    def on_epoch_end(self, model, **kwargs):
        self.state = copy.deepcopy(model.state_dict())
        self.grads = [p.grad.clone() for p in model.parameters()]

    on_loop_end = on_epoch_end


class Compare(CallbackMixin):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.checked = 0

    def on_epoch_end(self, model, **kwargs):
        now = model.state_dict()
        assert all(torch.equal(now[k], v) for k, v in self.snapshot.state.items())
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), self.snapshot.grads))
        modes = {type(m).__name__: m.training for m in model.modules()}
        assert modes == {"DigitNet": True, "Sequential": True, "Linear": True, "BatchNorm1d": False,
                         "ReLU": True, "Dropout": True}
        self.checked += 1

    on_loop_end = on_epoch_end


def test_validation_leaves_the_model_and_its_modes_untouched():
    snapshot = Snapshot()
    compare = Compare(snapshot)
    rec = ValRecorder()
    fit(make_validation(rec, val_interval=2), extra_before=[FreezeBN(), snapshot], extra_after=[compare], num_epochs=3)
    # checked at 3 epoch ends and the loop end; validated after epoch 1 and at the end, 3 steps each
    assert compare.checked == 4 and rec.training_flags == [False] * 6


def test_separate_val_model_loaded_from_the_train_model():
    val_model = DigitNet()
    untouched = copy.deepcopy(val_model.state_dict())
    rec = ValRecorder()
    trainer, _ = fit(make_validation(rec, val_model=val_model), num_epochs=2)
    assert rec.model_ids == [id(val_model)] * 2
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in val_model.state_dict().items())
    assert trainer.state.storage["monitor_obj"]["accuracy"] == pytest.approx(
        accuracy_of(trainer.model, val_loader()), abs=1e-6
    )

    keep = DigitNet()
    keep.load_state_dict(untouched)
    fit(make_validation(val_model=keep, init_with_train_model=False), num_epochs=1)
    assert all(torch.equal(v, untouched[k]) for k, v in keep.state_dict().items())

    class Other(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 10)

        def forward(self, x, y):
            return None, self.fc(x)

    with pytest.raises(RuntimeError, match="strict_match=True failed"):
        fit(make_validation(val_model=Other(), strict_match=True), num_epochs=1)


def test_model_convert_pipeline_converts_a_copy():
    def always_class_3(model: DigitNet) -> DigitNet:
        last = model.net[-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.copy_(nn.functional.one_hot(torch.tensor(3), 10).float())
        return model

    trainer, _ = fit(make_validation(model_convert_pipeline=[always_class_3]), num_epochs=1)
    expected = float((_Y[600:900] == 3).float().mean())
    assert trainer.state.storage["monitor_obj"]["accuracy"] == pytest.approx(expected, abs=1e-6)
    assert trainer.model.net[-1].weight.abs().sum() > 0  # the train model was not converted


class MeanTeacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.student, self.teacher = DigitNet(), DigitNet()

    def forward(self, x, y):
        return self.student(x, y)


@pytest.mark.parametrize("inference_on", ["student", "teacher"])
def test_mean_teacher_validation_picks_student_or_teacher(inference_on):
    rec = ValRecorder()
    callbacks = [MetricUpdater(update_metric, step_log_freq=0), rec]
    validation = MeanTeacherValidation(
        inference_on, data_loader=val_loader(), batch_processor=BasicBatchProcessor(need_grad_update=False),
        callbacks=callbacks, log_interval=0,
    )
    model = MeanTeacher()
    trainer, _ = fit(validation, model=model, num_epochs=1)
    part = getattr(model, inference_on)
    assert rec.model_ids == [id(part)]
    assert trainer.state.storage["monitor_obj"]["accuracy"] == pytest.approx(accuracy_of(part, val_loader()), abs=1e-6)


def test_mean_teacher_validation_falls_back_to_ema_or_explains():
    rec, ema = ValRecorder(), HalfEMA()
    validation = MeanTeacherValidation(
        "teacher", data_loader=val_loader(), batch_processor=BasicBatchProcessor(need_grad_update=False),
        callbacks=[MetricUpdater(update_metric, step_log_freq=0), rec], log_interval=0,
    )
    fit(validation, extra_before=[ema], num_epochs=1)
    assert rec.model_ids == [id(ema.ema)]
    no_teacher = MeanTeacherValidation(
        "teacher", data_loader=val_loader(), batch_processor=BasicBatchProcessor(need_grad_update=False), callbacks=[],
    )
    with pytest.raises(ValueError, match="no 'teacher' submodule and the loop has no ema_model"):
        fit(no_teacher, num_epochs=1)
    with pytest.raises(ValueError, match="inference_on must be 'student' or 'teacher'"):
        MeanTeacherValidation("both", data_loader=[], batch_processor=BasicBatchProcessor(need_grad_update=False), callbacks=[])


def test_several_loaders_with_their_own_callbacks():
    per_loader = [
        [MetricUpdater(update_metric, metrics=[Accuracy()], step_log_freq=0, storage_key="val_a")],
        [MetricUpdater(update_metric, metrics=[Accuracy()], step_log_freq=0, storage_key="val_b")],
    ]
    validation = Validation(
        [loader(600, 700), loader(700, 900)], BasicBatchProcessor(need_grad_update=False), per_loader,
        share_callbacks=False, log_interval=0,
    )
    trainer, _ = fit(validation, num_epochs=1)
    storage = trainer.state.storage
    assert storage["val_a"]["accuracy"] == pytest.approx(accuracy_of(trainer.model, loader(600, 700)), abs=1e-6)
    assert storage["val_b"]["accuracy"] == pytest.approx(accuracy_of(trainer.model, loader(700, 900)), abs=1e-6)
    # HAT's flat form: one callback per loader, not in a list (HAT's multi-process predictor test)
    flat = [per_loader[0][0], per_loader[1][0]]
    validation = Validation([loader(600, 700), loader(700, 900)], BasicBatchProcessor(need_grad_update=False), flat,
                            share_callbacks=False, log_interval=0)
    trainer, _ = fit(validation, num_epochs=1)
    assert set(trainer.state.storage) >= {"val_a", "val_b"}
    with pytest.raises(ValueError, match="one callback \\(or list of them\\) per data loader: got 2 loader"):
        Predictor(model=trainer.model, data_loader=[loader(600, 700), loader(700, 900)], callbacks=flat[:1],
                  batch_processor=BasicBatchProcessor(need_grad_update=False), device=None, share_callbacks=False)


def test_bad_arguments():
    bp = BasicBatchProcessor(need_grad_update=False)
    with pytest.raises(ValueError, match="interval_by must be 'epoch' or 'step'"):
        Validation(val_loader(), bp, [], interval_by="iteration")
    with pytest.raises(ValueError, match="val_interval must be an integer >= 1"):
        Validation(val_loader(), bp, [], val_interval=0)
    with pytest.raises(TypeError, match="callbacks must be a list"):
        Validation(val_loader(), bp, None)
    with pytest.raises(TypeError, match="batch_processor must be callable"):
        Validation(val_loader(), "processor", [])


def test_trainer_with_validation_is_freed_without_the_cycle_collector():
    gc.collect()
    gc.disable()
    try:
        trainer, _ = fit(make_validation(ValRecorder()), extra_before=[HalfEMA()], num_epochs=1)
        engine_ref, model_ref = weakref.ref(trainer), weakref.ref(trainer.model)
        del trainer
        assert engine_ref() is None and model_ref() is None
    finally:
        gc.enable()
