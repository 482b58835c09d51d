"""Stock Ignite handlers, event filters, error propagation, signature checks, garbage collection."""

from __future__ import annotations

import gc
import io
import logging
import weakref

import pytest
import torch
from ignite.engine import Events
from ignite.handlers import EarlyStopping, ProgressBar, TerminateOnNan, Timer
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import BasicBatchProcessor, HatEvents, Trainer, collect_loss_by_index
from hat_ignite.errors import CallbackSignatureError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


def data(n=6):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 4, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(n)]


def trainer(callbacks=None, **kw):
    model = Net()
    kw.setdefault("num_epochs", 2)
    return Trainer(model=model, data_loader=data(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                   device=None, callbacks=callbacks, **kw)


def test_progress_bar_attaches_and_shows_the_run():
    t = trainer()
    out = io.StringIO()
    ProgressBar(file=out, persist=True).attach(t, output_transform=lambda outs: {"loss": outs[0].item()})
    t.fit()
    text = out.getvalue()
    assert "6/6" in text and "loss" in text


def test_timer_measures_hat_steps():
    t = trainer()
    timer = Timer(average=True)
    timer.attach(t, start=Events.STARTED, resume=HatEvents.STEP_BEGIN, pause=HatEvents.STEP_END,
                 step=HatEvents.STEP_END)
    t.fit()
    assert timer.step_count == 12 and timer.value() > 0


def test_early_stopping_style_termination_closes_the_epoch_and_loop():
    ends = []

    class Ends(CallbackMixin):
        def on_epoch_end(self, epoch_id, global_step_id, **kw):
            ends.append(("epoch", epoch_id, global_step_id))

        def on_loop_end(self, **kw):
            ends.append(("loop",))

    t = trainer(callbacks=[Ends()], num_epochs=10)
    scores = iter([1.0, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, -1.0])
    stopper = EarlyStopping(patience=2, score_function=lambda engine: next(scores), trainer=t)
    t.add_event_handler(HatEvents.EPOCH_END, stopper)
    t.fit()
    assert t.state.epoch == 3  # best at epoch 1, two worse epochs, stop
    assert ends == [("epoch", 0, 6), ("epoch", 1, 12), ("epoch", 2, 18), ("loop",)]

    # terminate() in the middle of an epoch still closes it before on_loop_end
    ends.clear()
    t = trainer(callbacks=[Ends()], num_epochs=10)
    t.add_event_handler(HatEvents.STEP_END(once=4), lambda engine: engine.terminate())
    t.fit()
    assert ends == [("epoch", 0, 4), ("loop",)]


def test_terminate_on_nan_works_on_the_process_output():
    class NanNet(Net):
        def forward(self, x, y):
            loss, logits = super().forward(x, y)
            return loss * float("nan"), logits

    model = NanNet()
    t = Trainer(model=model, data_loader=data(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                                                    check_finite_loss=False),
                device=None, num_epochs=3)
    t.add_event_handler(Events.ITERATION_COMPLETED, TerminateOnNan(output_transform=lambda outs: outs[0]))
    t.fit()
    assert t.state.iteration == 1


def test_event_filter_on_hat_step_end_every_3():
    fired = []
    t = trainer()
    t.add_event_handler(HatEvents.STEP_END(every=3), lambda engine: fired.append(engine.state.iteration))
    t.add_event_handler(HatEvents.BATCH_END(once=2), lambda engine: fired.append(("batch", engine.state.hat_batch_count)))
    t.fit()
    assert fired == [("batch", 2), 3, 6, 9, 12]


def test_callbacks_and_ignite_handlers_run_in_registration_order():
    order = []

    class A(CallbackMixin):
        def on_step_end(self, **kw):
            order.append("A")

    class B(CallbackMixin):
        def on_step_end(self, **kw):
            order.append("B")

    t = trainer(callbacks=[B(), A()], num_epochs=1)
    t.add_event_handler(HatEvents.STEP_END, lambda: order.append("ignite"))
    t.fit()
    assert order[:3] == ["B", "A", "ignite"]


def test_step_hooks_wrap_the_ignite_iteration_handlers_whenever_they_were_added():
    order = []
    t = trainer(num_epochs=1)
    t.add_event_handler(Events.ITERATION_STARTED, lambda e: order.append(("started", e.state.step_id)))
    t.add_event_handler(Events.ITERATION_COMPLETED, lambda e: order.append(("completed", e.state.output[0].dim())))
    # added after the Ignite handlers, still fired before them: HAT's step runs inside Ignite's iteration
    t.add_event_handler(HatEvents.STEP_BEGIN, lambda e: order.append(("step_begin", e.state.step_id)))
    t.add_event_handler(HatEvents.STEP_END, lambda e: order.append(("step_end", e.state.output[0].dim())))
    t.fit()
    assert order[:8] == [("step_begin", 0), ("started", 0), ("step_end", 0), ("completed", 0),
                         ("step_begin", 1), ("started", 1), ("step_end", 0), ("completed", 0)]


def test_ignite_events_call_handlers_exactly_as_a_bare_ignite_engine_does():
    """The engine formats Ignite's per-event debug message only when it is logged; the calls stay Ignite's."""
    from ignite.engine import Engine

    def record(engine):
        calls = []
        engine.add_event_handler(Events.ITERATION_STARTED, lambda e: calls.append(("engine", e is engine)))
        engine.add_event_handler(Events.ITERATION_STARTED, lambda: calls.append(("none",)))
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e, a, b=0: calls.append(("args", e is engine, a, b)), 1, b=2)
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda a, b=0: calls.append(("no engine", a, b)), 3, b=4)
        engine.add_event_handler(Events.ITERATION_COMPLETED(every=2), lambda e: calls.append(("every 2", e.state.iteration)))
        return calls

    t = trainer(num_epochs=1)
    ours = record(t)
    t.fit()
    bare = Engine(lambda engine, batch: None)
    theirs = record(bare)
    bare.run(data(), max_epochs=1)
    assert ours == theirs and len(ours) == 6 * 4 + 3
    assert t.last_event_name == bare.last_event_name == Events.COMPLETED


def test_ignite_debug_messages_are_still_logged_when_asked_for(caplog):
    t = trainer(num_epochs=1)
    with caplog.at_level(logging.DEBUG, logger=t.logger.name):
        t.fit()
    assert "1 | 1, Firing handlers for event Events.ITERATION_COMPLETED" in caplog.text


def test_terminate_in_a_step_begin_handler_skips_that_step():
    processed = []
    t = trainer(num_epochs=1)
    t.add_event_handler(HatEvents.BATCH_BEGIN, lambda e: processed.append(e.state.iteration))
    t.add_event_handler(HatEvents.STEP_BEGIN(once=3), lambda e: e.terminate())
    t.fit()
    assert processed == [1, 2] and t.state.iteration == 3


def test_an_error_in_a_callback_propagates_unchanged():
    boom = RuntimeError("callback failed")

    class Fails(CallbackMixin):
        def on_step_end(self, global_step_id, **kw):
            if global_step_id == 2:
                raise boom

    t = trainer(callbacks=[Fails()])
    with pytest.raises(RuntimeError) as info:
        t.fit()
    assert info.value is boom
    assert t.state.iteration == 3


def test_an_error_in_the_model_propagates_unchanged():
    class Broken(Net):
        def forward(self, x, y):
            raise KeyError("no such head")

    model = Broken()
    t = Trainer(model=model, data_loader=data(), optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                device=None, num_epochs=1)
    with pytest.raises(KeyError, match="no such head"):
        t.fit()


def test_a_hook_asking_for_a_keyword_it_never_gets_is_rejected_at_attach():
    class Typo(CallbackMixin):
        def on_step_end(self, golbal_step_id, **kw):
            pass

    with pytest.raises(CallbackSignatureError, match=r"Typo\.on_step_end.*'golbal_step_id'.*on_step_end passes"):
        trainer(callbacks=[Typo()])

    class WrongHook(CallbackMixin):
        def on_loop_begin(self, batch, **kw):  # on_loop_begin passes no batch
            pass

    with pytest.raises(CallbackSignatureError, match="WrongHook.on_loop_begin"):
        trainer(callbacks=[WrongHook()])


def test_a_hook_without_kwargs_gets_only_what_it_names():
    got = []

    class Narrow(CallbackMixin):
        def on_epoch_end(self, epoch_id):
            got.append(epoch_id)

    trainer(callbacks=[Narrow()]).fit()
    assert got == [0, 1]


def test_objects_without_attach_are_refused_with_the_position():
    with pytest.raises(TypeError, match=r"callbacks\[1\] is a int"):
        trainer(callbacks=[CallbackMixin(), 3])


def test_engine_and_model_are_freed_after_fit_without_the_cycle_collector():
    class Count(CallbackMixin):
        def on_step_end(self, **kw):
            pass

    gc.collect()
    gc.disable()
    try:
        t = trainer(callbacks=[Count()], log_interval=2)
        t.fit()
        engine_ref, model_ref = weakref.ref(t), weakref.ref(t.model)
        del t
        assert engine_ref() is None and model_ref() is None
    finally:
        gc.enable()


def test_engine_with_stock_handlers_is_collected():
    t = trainer()
    ProgressBar(file=io.StringIO()).attach(t)
    t.add_event_handler(HatEvents.STEP_END(every=2), lambda engine: None)
    t.fit()
    engine_ref, model_ref = weakref.ref(t), weakref.ref(t.model)
    del t
    gc.collect()
    assert engine_ref() is None and model_ref() is None
