"""The per-step path: generated keyword builders, the HAT event dispatcher, and the finite-loss check."""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Events
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import HOOK_KWARGS, BasicBatchProcessor, HatEvents, Trainer, collect_loss_by_index
from hat_ignite.engine.state import COMMON_KWARGS, kwargs_builder


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


def make_trainer(callbacks=(), n=4, **kwargs):
    torch.manual_seed(0)
    model = Net()
    data = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(n)]
    return Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                   device=None, num_epochs=1, callbacks=list(callbacks), **kwargs)


def test_builders_build_exactly_the_contract_of_every_hook():
    trainer = make_trainer()
    trainer.fit()
    for hook, names in HOOK_KWARGS.items():
        built = kwargs_builder(hook)(trainer)
        assert list(built) == [*names, *COMMON_KWARGS], hook
        assert built["loop"] is trainer and built["storage"] is trainer.state.storage
    assert kwargs_builder("on_step_end", ("global_step_id",))(trainer) == {"global_step_id": trainer.state.iteration - 1}
    assert kwargs_builder("on_epoch_end", ("global_step_id",))(trainer) == {"global_step_id": trainer.state.iteration}
    with pytest.raises(ValueError, match="on_loop_begin does not pass 'losses'"):
        kwargs_builder("on_loop_begin", ("losses",))
    with pytest.raises(ValueError, match="not a HAT hook"):
        kwargs_builder("on_step")


def test_named_hooks_shared_dicts_filters_and_plain_handlers_on_one_event():
    seen = []

    class Named(CallbackMixin):
        def on_step_end(self, global_step_id, batch):
            seen.append(("named", global_step_id, batch[0].shape[0]))

    class Mutating(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen.append(("kw", kwargs["global_step_id"]))
            kwargs["global_step_id"] = -1  # a callee's dict is its own copy

    trainer = make_trainer([Named(), Mutating(), Mutating()])
    trainer.add_event_handler(HatEvents.STEP_END(every=2), lambda engine: seen.append(("every2", engine.state.iteration)))
    trainer.add_event_handler(HatEvents.STEP_END, lambda: seen.append(("plain",)))
    trainer.fit()
    first_step = seen[: seen.index(("plain",)) + 1]
    assert first_step == [("named", 0, 5), ("kw", 0), ("kw", 0), ("plain",)]
    assert ("every2", 2) in seen and ("every2", 1) not in seen
    assert [s for s in seen if s[0] == "kw"][-2:] == [("kw", 3), ("kw", 3)]


def test_handlers_removed_during_a_run_stop_being_called():
    calls = []

    class Once(CallbackMixin):
        def on_step_begin(self, global_step_id, **kwargs):
            calls.append(global_step_id)
            handles[0].remove()

    trainer = make_trainer()
    handles = Once().attach(trainer)
    trainer.fit()
    assert calls == [0]


def test_a_nan_loss_with_a_plain_optimizer_is_named_a_step_later_without_a_host_read():
    events = []

    class Spy(CallbackMixin):
        def on_backward_end(self, global_step_id, **kwargs):
            events.append(global_step_id)

    trainer = make_trainer([Spy()])
    trainer.add_event_handler(Events.ITERATION_STARTED, lambda e: e.state.iteration == 3 and e.model.fc.bias.data.fill_(float("nan")))
    from hat_ignite.errors import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match="global_step_id=2"):
        trainer.fit()
    # the flags of step 2 stay on the device; they are read inside step 3, after its backward
    assert events == [0, 1, 2, 3]


def test_tensorboard_builds_batch_keywords_only_for_its_update_functions(tmp_path):
    from hat_ignite.callbacks import TensorBoard
    from hat_ignite.engine.dispatch import HookCall

    seen = []

    def record(model_outs, batch, **kwargs):
        seen.append(batch is not None and "train_metrics" in kwargs)

    # the Net's outputs are (loss, logits): its loss is output "0"
    plain = TensorBoard(save_dir=str(tmp_path / "plain"), update_freq=1, loss_name_reg="^0$")
    with_funcs = TensorBoard(save_dir=str(tmp_path / "funcs"), update_freq=1, loss_name_reg="^0$",
                             tb_update_funcs=[record])
    trainer = make_trainer([plain, with_funcs])
    calls = [h for h, _, _ in trainer._event_handlers[HatEvents.BATCH_END] if isinstance(h, HookCall)]
    assert [c.only for c in calls] == [frozenset({"model_outs", "epoch_id", "global_step_id"}), None]
    trainer.fit()
    assert seen == [True] * 4  # the update functions still get every keyword
    from hat_ignite.visualize.event_file import event_files, read_scalars

    for run in ("plain", "funcs"):  # both wrote the loss at every step, into their scalars file
        path = event_files(tmp_path / run)[0]
        assert [step for step, _ in read_scalars(path)["loss/0"]] == [0, 1, 2, 3]
