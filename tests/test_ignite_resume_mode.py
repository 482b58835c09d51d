"""Stock Ignite resume recipes, evaluators and loss handlers on a hat-ignite Trainer (digits data)."""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.engine import Events, create_supervised_evaluator
from ignite.handlers import Checkpoint, DiskSaver, EarlyStopping, ProgressBar, TerminateOnNan
from ignite.metrics import Accuracy, RunningAverage
from torch.utils.data import DataLoader, Subset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index, loss_output
from hat_ignite.models.mlp import MLPClassifier

STEPS = 4  # batches per epoch


def loader(split="train", n=256):
    return DataLoader(Subset(DigitsDataset(split), range(n)), batch_size=n // STEPS, shuffle=False)


def make_trainer(num_epochs=3, callbacks=None, seed=0):
    torch.manual_seed(seed)
    model = MLPClassifier(hidden_features=32)
    return Trainer(model=model, data_loader=loader(), optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                   device=None, num_epochs=num_epochs, callbacks=callbacks)


def weights(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


@pytest.fixture(scope="module")
def straight():
    trainer = make_trainer()
    trainer.fit()
    return weights(trainer)


# -- 1. fit() continues a restored or interrupted state ------------------------------------------
def test_checkpoint_load_objects_then_fit_continues_at_the_saved_epoch(tmp_path, straight):
    first = make_trainer()
    to_save = {"trainer": first, "model": first.model, "optimizer": first.optimizer}
    saver = Checkpoint(to_save, DiskSaver(str(tmp_path), require_empty=False), n_saved=None)
    first.add_event_handler(Events.EPOCH_COMPLETED, saver)
    first.fit()
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*.pt")) == sorted(
        f"checkpoint_{i * STEPS}.pt" for i in (1, 2, 3))

    resumed = make_trainer(seed=1)  # other initial weights: all must come from the checkpoint
    epochs_run = []
    resumed.add_event_handler(Events.EPOCH_STARTED, lambda e: epochs_run.append(e.state.epoch))
    Checkpoint.load_objects({"trainer": resumed, "model": resumed.model, "optimizer": resumed.optimizer},
                            str(tmp_path / f"checkpoint_{STEPS}.pt"))
    state = resumed.fit()
    assert epochs_run == [2, 3]
    assert (state.epoch, state.iteration) == (3, 3 * STEPS)
    assert torch.equal(weights(resumed), straight)


def test_ignite_checkpoint_inside_an_epoch_of_a_shuffling_loader_resumes_exactly(tmp_path):
    """Ignite's recipe, saved inside an epoch: ``trainer.state_dict()`` holds the position in the
    epoch, its shuffle order and the generators (dropout), so the resumed run ends with the
    straight run's weights, bit for bit, as ``hat-train --resume`` does."""

    def shuffling_trainer(seed):
        torch.manual_seed(seed)
        model = MLPClassifier(hidden_features=32, dropout=0.3)
        data = DataLoader(Subset(DigitsDataset("train"), range(256)), batch_size=256 // STEPS, shuffle=True)
        return Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
                       batch_processor=BasicBatchProcessor(need_grad_update=True,
                                                           loss_collector=collect_loss_by_index(0)),
                       device=None, num_epochs=2)

    straight = shuffling_trainer(seed=0)
    to_save = {"trainer": straight, "model": straight.model, "optimizer": straight.optimizer}
    straight.add_event_handler(Events.ITERATION_COMPLETED(once=STEPS + 2),  # inside the second epoch
                               Checkpoint(to_save, DiskSaver(str(tmp_path), require_empty=False)))
    straight.fit()

    resumed = shuffling_trainer(seed=1)  # other weights and generators: all must come from the checkpoint
    steps = []
    resumed.add_event_handler(Events.ITERATION_COMPLETED, lambda e: steps.append(e.state.iteration))
    Checkpoint.load_objects({"trainer": resumed, "model": resumed.model, "optimizer": resumed.optimizer},
                            str(tmp_path / f"checkpoint_{STEPS + 2}.pt"))
    resumed.fit()
    assert steps == list(range(STEPS + 3, 2 * STEPS + 1))
    assert torch.equal(weights(resumed), weights(straight))


def test_load_state_dict_mid_epoch_then_fit_runs_the_rest():
    trainer = make_trainer(num_epochs=2)
    steps = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: steps.append(e.state.iteration))
    trainer.load_state_dict({"iteration": 6, "epoch_length": STEPS, "max_epochs": 2})
    state = trainer.fit()
    assert steps == [7, 8]
    assert (state.epoch, state.iteration) == (2, 2 * STEPS)
    steps.clear()
    trainer.fit()  # a finished run: the next fit() starts over, as in HAT
    assert steps == list(range(1, 2 * STEPS + 1))


def test_state_dict_user_keys_survive_a_restore_and_a_start_epoch(straight):
    """Ignite's ``state_dict_user_keys`` recipe: the key is saved, restored, and fit() goes on."""
    first = make_trainer()
    first.state_dict_user_keys.append("alpha")
    first.state.alpha = 0.25
    first.add_event_handler(Events.EPOCH_COMPLETED(once=1), lambda e: e.terminate())
    first.fit()
    saved = first.state_dict()
    assert saved["alpha"] == 0.25 and saved["iteration"] == STEPS
    resumed = make_trainer()
    resumed.state_dict_user_keys.append("alpha")
    resumed.model.load_state_dict(first.model.state_dict())
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    resumed.load_state_dict(saved)
    state = resumed.fit()
    assert (state.epoch, state.iteration, state.alpha) == (3, 3 * STEPS, 0.25)
    assert torch.equal(weights(resumed), straight)
    fresh = make_trainer()  # HAT's start_epoch with a user key never set: nothing to restore, it runs
    fresh.start_epoch = 2
    fresh.state_dict_user_keys.append("beta")
    assert fresh.fit().iteration == 3 * STEPS and list(fresh.state_dict_user_keys) == ["beta"]


def test_restored_state_with_another_epoch_length_is_refused():
    trainer = make_trainer()
    trainer.load_state_dict({"iteration": 5, "epoch_length": STEPS + 1, "max_epochs": 3})
    with pytest.raises(ValueError, match="epoch_length=5, but the data_loader has 4 batches"):
        trainer.fit()


def test_interrupt_then_fit_goes_on_where_it_stopped(straight, caplog):
    trainer = make_trainer()
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=5), lambda e: e.interrupt())
    loop_begins = []
    trainer.add_event_handler(Events.STARTED, lambda e: loop_begins.append(e.state.iteration))
    with caplog.at_level(logging.INFO):
        state = trainer.fit()
        assert (state.epoch, state.iteration) == (2, 5)
        state = trainer.fit()
    assert (state.epoch, state.iteration) == (3, 3 * STEPS)
    assert loop_begins == [0]  # one run, paused and continued
    assert torch.equal(weights(trainer), straight)
    assert "terminating due to exception" not in caplog.text


def test_fit_after_a_run_that_raised_starts_over(straight):
    """A run that ended with an exception is not paused: the next fit() runs the whole loop."""

    class FailOnce:
        def __init__(self):
            self.failed = False

        def on_step_end(self, global_step_id, **kwargs):
            if global_step_id == 4 and not self.failed:
                self.failed = True
                raise RuntimeError("a callback failed once")

    trainer = make_trainer(callbacks=[FailOnce()])
    with pytest.raises(RuntimeError, match="failed once"):
        trainer.fit()
    torch.manual_seed(0)
    trainer.model.load_state_dict(make_trainer().model.state_dict())  # the straight run's start
    trainer.optimizer.state.clear()
    state = trainer.fit()
    assert (state.epoch, state.iteration) == (3, 3 * STEPS)
    assert torch.equal(weights(trainer), straight)


def test_restoring_a_paused_run_drops_it_quietly(caplog):
    trainer = make_trainer(num_epochs=2)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(once=3), lambda e: e.interrupt())
    trainer.fit()
    trainer.load_state_dict({"iteration": 4, "epoch_length": STEPS, "max_epochs": 2})
    with caplog.at_level(logging.INFO):
        state = trainer.fit()
    assert state.iteration == 2 * STEPS
    assert "terminating due to exception" not in caplog.text


# -- 2. a stock evaluator on the same model does not leave the trainer in eval mode --------------
class FreezeFirstLayer(CallbackMixin):
    """An on_epoch_begin hook that keeps one sub-module in eval mode (as FreezeModule does)."""

    def on_epoch_begin(self, model, **kwargs):
        model.net[0].eval()


class ModeRecorder(CallbackMixin):
    def __init__(self):
        self.modes = []

    def on_batch_begin(self, loop, **kwargs):
        model = loop.model
        self.modes.append((model.training, model.net[0].training, model.net[1].training))


def test_create_supervised_evaluator_and_early_stopping_leave_training_intact():
    recorder = ModeRecorder()
    trainer = make_trainer(num_epochs=4, callbacks=[FreezeFirstLayer(), recorder])
    evaluator = create_supervised_evaluator(
        trainer.model, metrics={"accuracy": Accuracy()},
        prepare_batch=lambda batch, device, non_blocking: (batch["img"], batch["labels"]))
    val = loader("val", 64)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: evaluator.run(val))
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=3), lambda e: evaluator.run(val))
    stopper = EarlyStopping(patience=10, score_function=lambda e: e.state.metrics["accuracy"], trainer=trainer)
    evaluator.add_event_handler(Events.COMPLETED, stopper)
    state = trainer.fit()
    assert state.iteration == 4 * STEPS
    assert recorder.modes == [(True, False, True)] * (4 * STEPS)
    assert evaluator.state.metrics["accuracy"] > 0.2  # above chance (0.1): the model trained


# -- 4. loss_output: the step's loss for stock handlers ------------------------------------------
def test_running_average_progress_bar_and_terminate_on_nan_take_loss_output(capsys):
    trainer = make_trainer(num_epochs=2)
    seen = []
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append(float(e.state.losses[0].detach())))
    RunningAverage(output_transform=loss_output(trainer), alpha=0.5).attach(trainer, "loss")
    ProgressBar(persist=True).attach(trainer, metric_names=["loss"])
    trainer.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan(output_transform=loss_output(trainer)))
    state = trainer.fit()
    expected = seen[0]
    for value in seen[1:]:
        expected = 0.5 * expected + 0.5 * value
    assert state.metrics["loss"] == pytest.approx(expected, rel=1e-5)
    assert state.iteration == 2 * STEPS


def test_loss_output_is_detached_and_sums_every_loss():
    trainer = make_trainer(num_epochs=1)
    outputs = []
    transform = loss_output(trainer)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: outputs.append(transform(e.state.output)))
    trainer.fit()
    assert len(outputs) == STEPS and all(o.dim() == 0 and not o.requires_grad for o in outputs)
    trainer.state.losses = [torch.tensor([1.0, 2.0]), torch.tensor(3.0)]
    assert float(transform(None)) == 6.0
    trainer.state.losses = None
    with pytest.raises(ValueError, match="has no loss this step"):
        transform(None)
