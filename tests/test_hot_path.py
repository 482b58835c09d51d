"""The per-step path: the hook keywords, the HAT event dispatcher, no-op hooks, and the finite-loss check."""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Events
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import HOOK_KWARGS, BasicBatchProcessor, HatEvents, Trainer, collect_loss_by_index
from hat_ignite.engine.dispatch import is_noop
from hat_ignite.engine.state import COMMON_KWARGS, hook_kwargs


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


def test_the_keywords_of_every_hook_are_exactly_its_contract():
    trainer = make_trainer()
    trainer.fit()
    for hook, names in HOOK_KWARGS.items():
        built = hook_kwargs(hook, trainer)
        assert list(built) == [*names, *COMMON_KWARGS], hook
        assert built["loop"] is trainer and built["storage"] is trainer.state.storage
    # inside a step global_step_id is the running step's id; outside, the next step's
    assert hook_kwargs("on_step_end", trainer)["global_step_id"] == trainer.state.iteration - 1 == 3
    assert hook_kwargs("on_epoch_end", trainer)["global_step_id"] == trainer.state.iteration == 4
    assert hook_kwargs("on_loop_end", trainer)["epoch_id"] == 1 and hook_kwargs("on_epoch_end", trainer)["epoch_id"] == 0
    with pytest.raises(ValueError, match="not a HAT hook"):
        hook_kwargs("on_step", trainer)


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


def test_tensorboard_update_functions_get_every_keyword(tmp_path):
    from hat_ignite.callbacks import TensorBoard

    seen = []

    def record(model_outs, batch, **kwargs):
        seen.append(batch is not None and "train_metrics" in kwargs)

    # the Net's outputs are (loss, logits): its loss is output "0"
    plain = TensorBoard(save_dir=str(tmp_path / "plain"), update_freq=1, loss_name_reg="^0$")
    with_funcs = TensorBoard(save_dir=str(tmp_path / "funcs"), update_freq=1, loss_name_reg="^0$",
                             tb_update_funcs=[record])
    trainer = make_trainer([plain, with_funcs])
    trainer.fit()
    assert seen == [True] * 4  # the update functions still get every keyword
    from hat_ignite.visualize.event_file import event_files, read_scalars

    for run in ("plain", "funcs"):  # both wrote the loss at every step, into their scalars file
        path = event_files(tmp_path / run)[0]
        assert [step for step, _ in read_scalars(path)["loss/0"]] == [0, 1, 2, 3]


def test_hooks_reading_some_keywords_see_the_values_of_the_full_dict():
    seen: dict[str, list] = {"full": [], "read": [], "missing": []}

    class Full(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen["full"].append((kwargs["epoch_id"], kwargs["step_id"], kwargs["global_step_id"],
                                 kwargs.get("batch"), "loop" in kwargs, "losses" in kwargs, len(kwargs)))

    class Reads(CallbackMixin):
        def on_step_end(self, epoch_id, step_id, **kwargs):
            seen["read"].append((epoch_id, step_id, kwargs["global_step_id"], kwargs.get("batch"), "loop" in kwargs,
                                 "losses" in kwargs, 17))

    class Missing(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen["missing"].append(kwargs.get("losses", "absent"))  # on_step_end passes no losses
            try:
                kwargs["grad_scaler"]
            except KeyError as exc:
                seen["missing"].append(f"KeyError {exc}")

    class Counter(CallbackMixin):
        calls = 0

        def on_step_end(self, **kwargs):
            Counter.calls += 1

    trainer = make_trainer([Full(), Reads(), Missing(), Counter()], n=6)
    trainer.fit()
    assert len(seen["full"]) == 6 and seen["full"][0][-1] == 17
    assert [s[:-1] for s in seen["read"]] == [s[:-1] for s in seen["full"]]
    assert [s[:3] for s in seen["full"]] == [(0, i, i) for i in range(6)]
    assert all(a[3] is b[3] for a, b in zip(seen["read"], seen["full"]))  # the very batch objects
    assert seen["missing"][:2] == ["absent", "KeyError 'grad_scaler'"]
    assert Counter.calls == 6


def test_hat_handlers_follow_handlers_added_and_removed():
    trainer = make_trainer([])
    index = HatEvents.STEP_END.hat_index
    assert trainer.hat_handlers[index] is trainer._event_handlers[HatEvents.STEP_END]
    assert not trainer.hat_handlers[index]

    def every_other(engine):
        pass

    trainer.add_event_handler(HatEvents.STEP_END(every=2), every_other)
    handle = trainer.add_event_handler(HatEvents.STEP_END, lambda: None)
    assert len(trainer.hat_handlers[index]) == 2
    handle.remove()  # Ignite replaces the event's list on removal
    assert trainer.hat_handlers[index] is trainer._event_handlers[HatEvents.STEP_END]
    assert len(trainer.hat_handlers[index]) == 1


def test_an_event_fired_inside_a_hook_has_its_own_keywords():
    seen = []

    class Inner(CallbackMixin):
        def on_epoch_begin(self, **kwargs):
            seen.append(("epoch_begin", sorted(kwargs) == sorted((*HOOK_KWARGS["on_epoch_begin"], *COMMON_KWARGS))))

    class Outer(CallbackMixin):
        def on_step_end(self, **kwargs):
            if kwargs["global_step_id"] == 0:
                kwargs["loop"].fire_event(HatEvents.EPOCH_BEGIN)
            seen.append(("step_end", "model_outs" in kwargs))

    class After(CallbackMixin):
        def on_step_end(self, **kwargs):
            seen.append(("after", "model_outs" in kwargs and "epoch_id" in kwargs))

    trainer = make_trainer([Inner(), Outer(), After()], n=2)
    trainer.fit()
    assert seen[1:4] == [("epoch_begin", True), ("step_end", True), ("after", True)]
    assert trainer.firing_kwargs is None  # nothing kept between firings


def _plain_hook(self, **kwargs):
    pass


def _docstring_hook(self, **kwargs):
    """Only a docstring."""


def _ellipsis_hook(self, *args, **kwargs):
    ...


def _returns_none(self, **kwargs):
    return None


def _returns_value(self, **kwargs):
    return 1


def _reads_a_key(self, **kwargs):
    kwargs["epoch_id"]  # a KeyError where it is missing: it does something


def _calls(self, **kwargs):
    print("hook")


def _decorated(func):
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        print("wrapped")
        return func(*args, **kwargs)

    return wrapper


_made_at_run_time: dict = {}
exec("def made(self, **kwargs):\n    pass\n", _made_at_run_time)  # no source file to read


@pytest.mark.parametrize(
    ("hook", "noop"),
    [(_plain_hook, True), (_docstring_hook, True), (_ellipsis_hook, True), (_returns_none, True),
     (_returns_value, False), (_reads_a_key, False), (_calls, False), (_decorated(_plain_hook), False),
     (_made_at_run_time["made"], False), (print, False), (lambda self, **kwargs: None, False),
     (CallbackMixin.on_step_end, True)],
    ids=["pass", "docstring", "ellipsis", "return-none", "return-value", "subscript", "call", "decorated",
         "no-source", "builtin", "lambda", "CallbackMixin"],
)
def test_a_hook_is_a_noop_only_when_its_source_body_does_nothing(hook, noop):
    assert is_noop(hook) is noop


def test_noop_hooks_are_not_attached_and_others_are():
    class Base:
        def on_step_end(self, **kwargs):
            pass

        def on_batch_end(self, **kwargs):
            """Nothing."""

    class Counts(Base):
        calls = 0

        def on_batch_end(self, **kwargs):
            Counts.calls += 1

    class ReturnsSomething(Base):
        def on_step_end(self, **kwargs):
            return 1

    trainer = make_trainer([Counts(), ReturnsSomething()])
    assert trainer.event_handlers(HatEvents.BATCH_END) == ["Counts.on_batch_end"]
    assert trainer.event_handlers(HatEvents.STEP_END) == ["ReturnsSomething.on_step_end"]
    trainer.fit()
    assert Counts.calls == 4
