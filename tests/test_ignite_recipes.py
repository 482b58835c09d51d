"""Ignite's own recipes on hat-ignite loops: the validation's evaluator, the epoch-end order,
``state.output`` and Ignite handlers listed in ``callbacks``.

Each test runs the recipe as Ignite's docs write it, and, where a plain Ignite evaluator can do
the same, compares with it on the same seed (a 32-unit MLP on 256 digits, 4 steps an epoch).
"""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.contrib.engines import common
from ignite.engine import Events, create_supervised_evaluator
from ignite.handlers import (
    Checkpoint, DiskSaver, EarlyStopping, TensorboardLogger, TerminateOnNan, global_step_from_engine,
)
from ignite.metrics import Accuracy as IgniteAccuracy
from ignite.metrics import RunningAverage
from torch.utils.data import DataLoader, Subset

from conftest import run_tool
from host_reads import HostReads
from hat_ignite.callbacks import CallbackMixin, MetricUpdater, Validation
from hat_ignite.callbacks import Checkpoint as HatCheckpoint
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy
from hat_ignite.models.mlp import MLPClassifier
from hat_ignite.registry import build_from_cfg
from hat_ignite.visualize.event_file import event_files, read_scalars

TRAIN = DataLoader(Subset(DigitsDataset("train"), range(256)), batch_size=64)
VAL = DataLoader(Subset(DigitsDataset("val"), range(128)), batch_size=64)
# validation accuracy after epochs 1-4 of make_trainer(), the same from a stock Ignite evaluator
ACCURACIES = [0.1484375, 0.390625, 0.515625, 0.6640625]


def make_model():
    torch.manual_seed(0)
    return MLPClassifier(hidden_features=32)


def make_trainer(num_epochs=4, callbacks=None, model=None, **kwargs):
    model = make_model() if model is None else model
    return Trainer(model=model, data_loader=TRAIN, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                   device=None, num_epochs=num_epochs, callbacks=callbacks, val_metrics=[Accuracy()], **kwargs)


def update_val_metrics(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)


def make_validation():
    return Validation(VAL, BasicBatchProcessor(need_grad_update=False),
                      [MetricUpdater(update_val_metrics, step_log_freq=0)], log_interval=0)


def ignite_evaluator(model):
    return create_supervised_evaluator(
        model, metrics={"accuracy": IgniteAccuracy()},
        prepare_batch=lambda batch, device, non_blocking: (batch["img"], batch["labels"]))


def accuracy_score(engine):
    return engine.state.metrics["accuracy"]


# -- 1. HAT's Validation as an Ignite evaluator -------------------------------------------------
def test_validation_evaluator_drives_ignite_checkpoint_early_stopping_and_best_models(tmp_path):
    validation = make_validation()
    trainer = make_trainer(callbacks=[validation])
    evaluator = validation.evaluator
    seen = []
    evaluator.add_event_handler(Events.COMPLETED, lambda engine: seen.append(engine.state.metrics["accuracy"]))
    evaluator.add_event_handler(Events.COMPLETED, Checkpoint(
        {"model": trainer.model}, DiskSaver(str(tmp_path / "best"), create_dir=True), n_saved=1,
        filename_prefix="best", score_function=accuracy_score, score_name="accuracy",
        global_step_transform=global_step_from_engine(trainer)))
    evaluator.add_event_handler(Events.COMPLETED, EarlyStopping(
        patience=1, threshold=0.2, score_function=accuracy_score, trainer=trainer))
    common.gen_save_best_models_by_val_score(DiskSaver(str(tmp_path / "gen"), create_dir=True), evaluator,
                                             trainer.model, "accuracy", n_saved=1, trainer=trainer)
    trainer.fit()

    # the same recipe on a stock Ignite evaluator of the same model and seed
    plain = make_trainer()
    plain_evaluator = ignite_evaluator(plain.model)
    plain_seen = []
    plain.add_event_handler(Events.EPOCH_COMPLETED, lambda engine: plain_evaluator.run(VAL))
    plain_evaluator.add_event_handler(Events.COMPLETED, lambda e: plain_seen.append(e.state.metrics["accuracy"]))
    plain_evaluator.add_event_handler(Events.COMPLETED, EarlyStopping(
        patience=1, threshold=0.2, score_function=accuracy_score, trainer=plain))
    plain.fit()

    assert seen == plain_seen == ACCURACIES[:3]  # EarlyStopping: epoch 3 gained 0.125 < threshold
    assert trainer.state.epoch == plain.state.epoch == 3
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["best_model_3_accuracy=0.5156.pt"]
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["best_model_3_val_accuracy=0.5156.pt"]
    assert evaluator.state.metrics["accuracy"] == ACCURACIES[2]
    assert evaluator.state.output is None and evaluator.state.batch is None  # nothing held between runs
    with pytest.raises(RuntimeError, match="runs when the Validation callback validates"):
        evaluator.run(VAL)


def test_validation_evaluator_takes_ignite_metrics_and_tensorboard_all_metrics(tmp_path):
    validation = make_validation()
    trainer = make_trainer(num_epochs=2, callbacks=[validation])
    evaluator = validation.evaluator
    logger = TensorboardLogger(log_dir=str(tmp_path))
    logger.attach_output_handler(evaluator, event_name=Events.EPOCH_COMPLETED, tag="validation",
                                 metric_names="all", global_step_transform=global_step_from_engine(trainer))
    IgniteAccuracy(output_transform=lambda logits: (logits, evaluator.state.batch["labels"])).attach(
        evaluator, "ignite_accuracy")
    trainer.fit()
    logger.close()
    assert evaluator.state.metrics == {"accuracy": ACCURACIES[1], "ignite_accuracy": ACCURACIES[1]}
    scalars = read_scalars(event_files(tmp_path)[0])
    assert scalars["validation/accuracy"] == [(1, ACCURACIES[0]), (2, ACCURACIES[1])]


# -- 2. the epoch-end order between HAT hooks and Ignite handlers --------------------------------
def evaluator_into_trainer_metrics(model):
    evaluator = ignite_evaluator(model)

    def run_evaluator(trainer):
        evaluator.run(VAL)
        trainer.state.metrics.update(evaluator.state.metrics)

    return run_evaluator


def test_an_evaluator_listed_before_hat_checkpoint_is_read_in_the_same_epoch(tmp_path, caplog):
    best = HatCheckpoint(str(tmp_path), mode="max", monitor_metric_key="accuracy")
    model = make_model()
    trainer = make_trainer(num_epochs=3, model=model, callbacks=[
        dict(handler=evaluator_into_trainer_metrics(model), event="EPOCH_COMPLETED"), best])
    with caplog.at_level(logging.WARNING):
        trainer.fit()
    assert best.best == ACCURACIES[2]  # 0.5156: this epoch's value
    assert "EPOCH_COMPLETED handler of the trainer set it afterwards" not in caplog.text


def test_an_evaluator_added_after_hat_checkpoint_is_a_warning(tmp_path, caplog):
    best = HatCheckpoint(str(tmp_path), mode="max", monitor_metric_key="accuracy")
    trainer = make_trainer(num_epochs=3, callbacks=[best])
    trainer.add_event_handler(Events.EPOCH_COMPLETED, evaluator_into_trainer_metrics(trainer.model))
    with caplog.at_level(logging.WARNING):
        trainer.fit()
    assert best.best == ACCURACIES[1]  # read one epoch late, as Ignite's handler order makes it
    warnings = [r.getMessage() for r in caplog.records if "set it afterwards" in r.getMessage()]
    assert len(warnings) == 1 and "dict(handler=..., event='EPOCH_COMPLETED')" in warnings[0]
    assert "validation.evaluator" in warnings[0]


@pytest.mark.parametrize("listed", [True, False])
def test_hat_tensorboard_writes_an_evaluators_value_of_the_same_epoch_or_warns(tmp_path, caplog, listed):
    from hat_ignite.callbacks import TensorBoard

    model = make_model()
    run_evaluator = evaluator_into_trainer_metrics(model)
    tensorboard = TensorBoard(str(tmp_path), update_by="epoch")  # a point at each epoch end
    listing = [dict(handler=run_evaluator, event="EPOCH_COMPLETED")] if listed else []
    trainer = make_trainer(num_epochs=3, model=model, callbacks=[*listing, tensorboard])
    if not listed:
        trainer.add_event_handler(Events.EPOCH_COMPLETED, run_evaluator)
    with caplog.at_level(logging.WARNING):
        trainer.fit()
    written = [value for _, value in read_scalars(event_files(tmp_path)[0])["metrics/accuracy"]]
    warnings = [r.getMessage() for r in caplog.records if "one epoch late" in r.getMessage()]
    if listed:  # run among the HAT hooks in list order: each epoch's own value
        assert written == pytest.approx(ACCURACIES[:3]) and warnings == []
    else:  # Ignite runs it after the HAT hooks: the previous epoch's value, and one warning
        assert written == pytest.approx(ACCURACIES[:2])
        assert len(warnings) == 1 and "TensorBoard" in warnings[0] and "'accuracy'" in warnings[0]
        assert "dict(handler=..., event='EPOCH_COMPLETED')" in warnings[0]


# -- 3. state.output and run() -----------------------------------------------------------------
class KeepModelOuts(CallbackMixin):
    def __init__(self):
        self.outs = []

    def on_step_end(self, model_outs, **kwargs):
        self.outs.append(model_outs)


def test_ignite_quick_start_runs_with_state_output_loss_and_run_takes_num_epochs(tmp_path):
    hook = KeepModelOuts()
    trainer = make_trainer(num_epochs=2, callbacks=[hook], state_output="loss")
    lines = []

    @trainer.on(Events.ITERATION_COMPLETED(every=2))
    def log_training_loss(engine):  # Ignite's quick start, as written
        lines.append(f"Epoch[{engine.state.epoch}], Iter[{engine.state.iteration}] Loss: {engine.state.output:.2f}")

    common.setup_common_training_handlers(trainer, output_names=["loss"], with_pbars=False)
    logger = TensorboardLogger(log_dir=str(tmp_path))
    logger.attach_output_handler(trainer, event_name=Events.ITERATION_COMPLETED, tag="training",
                                 output_transform=lambda loss: {"loss": loss})
    state = trainer.run(TRAIN)  # no max_epochs: the trainer's num_epochs
    logger.close()
    assert (state.epoch, state.iteration) == (2, 8)
    assert len(lines) == 4 and lines[0].startswith("Epoch[1], Iter[2] Loss: 2.")
    assert 2.0 < state.metrics["loss"] < 2.4
    assert [step for step, _ in read_scalars(event_files(tmp_path)[0])["training/loss"]] == list(range(1, 9))
    assert isinstance(trainer.state.output, torch.Tensor) and trainer.state.output.dim() == 0
    assert not trainer.state.output.requires_grad
    loss_dict, logits = hook.outs[-1]  # HAT hooks still get the model outputs
    assert set(loss_dict) == {"cls_loss"} and logits.shape == (64, 10)


def error_text(error):
    """The message and its notes (Python 3.11+ keeps the note apart; older ones in the message)."""
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


def test_a_recipe_reading_model_outputs_as_a_loss_names_loss_output():
    trainer = make_trainer(num_epochs=1)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: print(f"{e.state.output:.2f}"))
    with pytest.raises(TypeError, match="unsupported format string") as info:
        trainer.run(TRAIN)
    note = error_text(info.value)
    assert "loss_output(trainer)" in note and "state_output='loss'" in note

    trainer = make_trainer(num_epochs=1)
    common.setup_common_training_handlers(trainer, output_names=["loss"], with_pbars=False)
    with pytest.raises(TypeError, match="output for RunningAverage metric should be a tuple/list") as info:
        trainer.fit()
    assert "loss_output(trainer)" in error_text(info.value)


def test_state_output_loss_adds_no_host_read_to_a_step():
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(16, 4), torch.randint(0, 2, (16,))) for _ in range(30)]
    trainer = Trainer(model=model, data_loader=data, device=None, num_epochs=1, state_output="loss",
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True),
                      batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)))
    reads = HostReads().attach(trainer)
    with reads:
        trainer.fit()
    assert reads.reads(range(6, 26)) == {}  # the loss stays on the device until a handler reads it
    assert trainer.state.output.dim() == 0


def test_state_output_refuses_unknown_values():
    with pytest.raises(ValueError, match="state_output must be 'model_outs', 'loss' or a callable"):
        make_trainer(state_output="losses")


# -- 4. Ignite handlers and metrics in callbacks lists ------------------------------------------
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        logits = self.fc(x)
        return torch.nn.functional.cross_entropy(logits, y), logits


def test_ignite_handlers_listed_with_their_event_in_callbacks(tmp_path):
    model = make_model()
    trainer = make_trainer(num_epochs=2, model=model, state_output="loss", callbacks=[
        dict(handler=RunningAverage(output_transform=lambda x: x), name="loss"),
        dict(handler=TerminateOnNan(), event="ITERATION_COMPLETED"),
        dict(handler=Checkpoint({"model": model}, DiskSaver(str(tmp_path), create_dir=True), n_saved=None),
             event="EPOCH_COMPLETED", every=2),
    ])
    state = trainer.fit()
    assert 2.0 < state.metrics["loss"] < 2.4
    assert "TerminateOnNan" in trainer.event_handlers(Events.ITERATION_COMPLETED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_8.pt"]  # every=2: not after epoch 1


def test_a_config_lists_ignite_handlers_and_terminate_on_nan_stops_the_run():
    torch.manual_seed(0)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
    data[2][0][0, 0] = float("nan")
    model = Net()
    trainer = build_from_cfg(dict(
        type="Trainer", model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                             loss_collector=collect_loss_by_index(0), check_finite_loss=False),
        device=None, num_epochs=2, state_output="loss",
        callbacks=[dict(handler=dict(type="ignite.handlers.TerminateOnNan"), event="ITERATION_COMPLETED"),
                   dict(handler=dict(type="ignite.metrics.RunningAverage", output_transform=lambda x: x),
                        name="loss")],
    ))
    state = trainer.fit()
    assert state.iteration == 3 and trainer.should_terminate  # stopped at the NaN batch


@pytest.mark.parametrize("entry, message", [
    (TerminateOnNan(), "as dict(handler=TerminateOnNan(...), event='ITERATION_COMPLETED')"),
    (RunningAverage(output_transform=lambda x: x), "as dict(handler=RunningAverage(...), name='loss')"),
    (dict(handler=TerminateOnNan()), "a handler entry needs event="),
    (dict(handler=TerminateOnNan(), event="ITERATION_DONE"), "did you mean 'ITERATION_COMPLETED'"),
    (dict(handler=RunningAverage(output_transform=lambda x: x)), "give the name its value goes under"),
])
def test_bare_or_incomplete_ignite_entries_say_how_to_list_them(entry, message):
    with pytest.raises((TypeError, ValueError)) as info:
        make_trainer(num_epochs=1, callbacks=[entry])
    assert message in str(info.value) and "callbacks[0]" in str(info.value)


def test_hat_train_builds_ignite_handlers_listed_in_a_config(write_config, tmp_path):
    config = write_config("""
        model = dict(type="MLPClassifier", in_features=64, hidden_features=16, num_classes=10)
        data_loader = dict(type="torch.utils.data.DataLoader", batch_size=256,
                           dataset=dict(type="DigitsDataset", split="train", val_ratio=0.2, seed=0))
        float_trainer = dict(
            type="Trainer", model=model, data_loader=data_loader, optimizer=dict(type="torch.optim.SGD", lr=0.1),
            batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                                 loss_collector=dict(type="collect_loss_by_index", indexes=0)),
            device=None, num_epochs=1, state_output="loss",
            callbacks=[
                dict(handler=dict(type="ignite.handlers.TerminateOnNan"), event="ITERATION_COMPLETED"),
                dict(handler=dict(type="ignite.metrics.RunningAverage", output_transform=lambda loss: loss),
                     name="loss"),
            ],
        )
    """)
    proc = run_tool("hat-train", config, "--dry-run", "--work-dir", tmp_path / "dry", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ITERATION_COMPLETED: TerminateOnNan, Metric.iteration_completed" in proc.stdout
