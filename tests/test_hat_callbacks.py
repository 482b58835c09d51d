"""Callbacks written for HAT run unchanged: they attach as they are and see HAT's keyword values.

The callbacks here are written the way HAT users write them: a plain base class with no-op
``on_*`` hooks taking ``**kwargs`` (HAT's ``CallbackMixin`` is one), no ``attach`` method.
"""

from __future__ import annotations

import pytest
import torch
from control_helpers import ConvBNNet, digits_loader, digits_tensors, make_trainer
from torch import nn

from hat_ignite.callbacks import CallbackMixin, GradScale, Validation
from hat_ignite.engine import (
    BasicBatchProcessor,
    Calibrator,
    HatEvents,
    MultiBatchProcessor,
    Predictor,
    Trainer,
    collect_loss_by_index,
)
from hat_ignite.engine.ddp_trainer import DataParallelTrainer
from hat_ignite.errors import CallbackSignatureError
from hat_ignite.metrics import Accuracy
from hat_ignite.quantization import Float2Calibration
from hat_style import HatStyleBase


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, y):
        logits = self.fc(x)
        return nn.functional.cross_entropy(logits, y), logits


def linear_data(n: int = 3) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 4, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(n)]


def linear_trainer(callbacks, lr: float = 0.5, data=None, **kwargs) -> Trainer:
    model = Linear()
    kwargs.setdefault("num_epochs", 1)
    processor = kwargs.pop("processor", None) or BasicBatchProcessor(
        need_grad_update=True, loss_collector=collect_loss_by_index(0), **kwargs.pop("processor_args", {})
    )
    return Trainer(model=model, data_loader=data or linear_data(), optimizer=torch.optim.SGD(model.parameters(), lr=lr),
                   batch_processor=processor, device=None, callbacks=callbacks, **kwargs)


# -- attaching ----------------------------------------------------------------------------------
def test_only_the_hooks_a_hat_callback_implements_are_attached():
    class StepCounter(HatStyleBase):
        steps = 0

        def on_step_end(self, **kwargs):
            self.steps += 1

    counter = StepCounter()
    trainer = linear_trainer([counter, HatStyleBase()])
    assert trainer.event_handlers(HatEvents.STEP_END) == ["StepCounter.on_step_end"]
    assert all(trainer.event_handlers(e) == [] for e in HatEvents if e is not HatEvents.STEP_END)
    trainer.fit()
    assert counter.steps == 3


def test_a_misspelled_hook_is_refused_at_attach_with_its_name_and_the_closest_hook():
    class Typo(HatStyleBase):
        def on_step_ends(self, **kwargs):
            self.seen = True

    with pytest.raises(CallbackSignatureError, match=r"Typo\.on_step_ends .*Did you mean 'on_step_end'.*on_loop_begin, "):
        linear_trainer([Typo()])

    class OurTypo(CallbackMixin):  # the same check on our own base
        def on_optimizer_step_begins(self, **kwargs):
            self.seen = True

    with pytest.raises(CallbackSignatureError, match=r"OurTypo\.on_optimizer_step_begins .*'on_optimizer_step_begin'"):
        linear_trainer([OurTypo()])


def test_a_no_op_hook_with_an_impossible_signature_is_still_refused():
    class Wrong(HatStyleBase):
        def on_loop_begin(self, batch, **kwargs):  # on_loop_begin passes no batch
            pass

    with pytest.raises(CallbackSignatureError, match="Wrong.on_loop_begin"):
        linear_trainer([Wrong()])


def test_a_parameter_the_hook_never_passes_keeps_its_default_as_in_hat():
    class WithDefault(HatStyleBase):
        seen: list = []

        def on_epoch_end(self, epoch_id, batch=None, note="kept", **kwargs):  # HAT passes neither
            self.seen.append((epoch_id, batch, note))

    callback = WithDefault()
    linear_trainer([callback], num_epochs=2).fit()
    assert callback.seen == [(0, None, "kept"), (1, None, "kept")]


def test_an_object_with_neither_hooks_nor_attach_is_refused():
    with pytest.raises(TypeError, match=r"callbacks\[0\] is a int, which has neither HAT hooks"):
        linear_trainer([3])


class Seen(HatStyleBase):
    """Counts the hooks it sees, whatever the engine."""

    def __init__(self) -> None:
        self.hooks: dict[str, int] = {}

    def _see(self, hook):
        self.hooks[hook] = self.hooks.get(hook, 0) + 1

    def on_loop_begin(self, **kwargs):
        self._see("on_loop_begin")

    def on_forward_end(self, model_outs, **kwargs):
        self._see("on_forward_end")

    def on_step_end(self, **kwargs):
        self._see("on_step_end")


def test_a_hat_callback_attaches_to_every_engine():
    x, y = digits_tensors(n=64)
    loader = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    eval_processor = BasicBatchProcessor(need_grad_update=False)
    seen = {}
    for name, build in {
        "predictor": lambda cb: Predictor(model=ConvBNNet(), data_loader=loader, batch_processor=eval_processor,
                                          callbacks=[cb]),
        "calibrator": lambda cb: Calibrator(
            model=nn.Sequential(nn.Linear(4, 4), nn.ReLU()), data_loader=[torch.rand(8, 4) for _ in range(4)],
            batch_processor=eval_processor, model_convert_pipeline=[Float2Calibration(example_inputs=torch.rand(8, 4))],
            callbacks=[cb]),
        "data_parallel": lambda cb: DataParallelTrainer(
            model=ConvBNNet(), data_loader=loader, optimizer={"type": "torch.optim.SGD", "lr": 0.1},
            batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
            device=None, num_epochs=1, callbacks=[cb]),
    }.items():
        cb = Seen()
        build(cb).fit()
        seen[name] = cb.hooks
    inner = Seen()  # inside Validation's predictor
    validation = Validation(data_loader=loader[:2], batch_processor=eval_processor, callbacks=[inner], val_interval=1)
    make_trainer([validation], num_epochs=1, loader=digits_loader(n=32)).fit()
    seen["validation"] = inner.hooks
    assert seen == {
        "predictor": {"on_loop_begin": 1, "on_forward_end": 4, "on_step_end": 4},
        "calibrator": {"on_loop_begin": 1, "on_forward_end": 4, "on_step_end": 4},
        "data_parallel": {"on_loop_begin": 1, "on_forward_end": 4, "on_step_end": 4},
        "validation": {"on_loop_begin": 1, "on_forward_end": 2, "on_step_end": 2},
    }


def test_the_new_events_work_with_ignite_event_filters():
    fired = []
    trainer = linear_trainer([], data=linear_data(4))
    trainer.add_event_handler(HatEvents.FORWARD_END(every=2), lambda e: fired.append(("fwd", e.state.hat_batch_count)))
    trainer.add_event_handler(HatEvents.OPTIMIZER_STEP_BEGIN(once=3), lambda e: fired.append(("opt", e.state.iteration)))
    trainer.fit()
    assert fired == [("fwd", 2), ("opt", 3), ("fwd", 4)]


# -- HAT's keyword values ------------------------------------------------------------------------
def test_gradscale_in_on_optimizer_step_begin_scales_the_gradients_the_optimizer_uses():
    """HAT's GradScale acts in on_optimizer_step_begin; with plain SGD the update is -lr * scale * g."""
    lr, scale = 0.5, 0.25

    class HatStyleGradScale(HatStyleBase):
        def __init__(self):
            self.grads = []

        def on_backward_end(self, model, **kwargs):
            self.grads.append([p.grad.clone() for p in model.parameters()])

        def on_optimizer_step_begin(self, model, optimizer, grad_scaler, **kwargs):
            for p in model.parameters():
                p.grad *= scale

    cb = HatStyleGradScale()
    trainer = linear_trainer([cb], lr=lr, num_epochs=1, data=linear_data(1))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.fit()
    for p0, p1, g in zip(before, trainer.model.parameters(), cb.grads[0]):
        assert torch.allclose(p1 - p0, -lr * scale * g, rtol=1e-6, atol=1e-8)
        assert not torch.allclose(p1 - p0, -lr * g)


def test_our_gradscale_matches_parameter_names_by_substring():
    lr = 0.5

    class Grads(HatStyleBase):
        def on_backward_end(self, model, **kwargs):
            self.grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    grads = Grads()  # before GradScale: sees this backward's raw gradients
    trainer = linear_trainer([grads, GradScale(module_and_scale=[("bias", 0.1)])], lr=lr, data=linear_data(1))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.fit()
    after = dict(trainer.model.named_parameters())
    torch.testing.assert_close(after["fc.bias"] - before["fc.bias"], -lr * 0.1 * grads.grads["fc.bias"])
    torch.testing.assert_close(after["fc.weight"] - before["fc.weight"], -lr * grads.grads["fc.weight"])


def test_storage_has_hats_put():
    class Puts(HatStyleBase):
        def on_step_end(self, storage, global_step_id, **kwargs):
            storage.put("step", global_step_id)
            storage.put("state", {f"at{global_step_id}": global_step_id}, always_dict=True)

        def on_loop_end(self, storage, **kwargs):
            self.histories = dict(storage.histories)

    cb = Puts()
    trainer = linear_trainer([cb])
    trainer.fit()
    assert cb.histories == {"step": [0, 1, 2], "state": [{"at0": 0, "at1": 1, "at2": 2}]}
    assert isinstance(trainer.state.storage, dict)


def test_grad_scaler_is_a_disabled_scaler_without_amp_and_unscale_works():
    """HAT's GradClip calls grad_scaler.unscale_ in on_optimizer_step_begin, then clips."""

    class HatStyleGradClip(HatStyleBase):
        def on_backward_end(self, model, grad_scaler, **kwargs):
            self.before = [p.grad.clone() for p in model.parameters()]
            self.scaler_at_backward_end = grad_scaler

        def on_optimizer_step_begin(self, model, optimizer, grad_scaler, **kwargs):
            self.scaler = grad_scaler
            grad_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
            self.used = [p.grad.clone() for p in model.parameters()]

    cb = HatStyleGradClip()
    linear_trainer([cb], data=linear_data(1)).fit()
    assert isinstance(cb.scaler, torch.amp.GradScaler) and not cb.scaler.is_enabled()
    assert cb.scaler_at_backward_end is cb.scaler
    params = [nn.Parameter(torch.zeros_like(g)) for g in cb.before]
    for p, g in zip(params, cb.before):
        p.grad = g.clone()
    assert torch.nn.utils.clip_grad_norm_(params, 0.05) > 0.05
    for p, got in zip(params, cb.used):
        torch.testing.assert_close(got, p.grad)


def test_metrics_are_passed_as_lists_as_hat_does():
    class Metrics(HatStyleBase):
        def on_step_end(self, train_metrics, val_metrics, **kwargs):
            self.pair = (train_metrics, val_metrics)

    cb = Metrics()
    linear_trainer([cb]).fit()
    assert cb.pair == ([None], [None])
    accuracy = Accuracy()
    cb = Metrics()
    linear_trainer([cb], train_metrics=accuracy).fit()
    assert cb.pair[0] == [accuracy] and cb.pair[1] == [None]


class GradsAtBatchBegin(HatStyleBase):
    def __init__(self):
        self.at_begin, self.at_end = [], []

    @staticmethod
    def _grads(model):
        return [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    def on_batch_begin(self, loop, **kwargs):
        self.at_begin.append(self._grads(loop.model))

    def on_batch_end(self, loop, **kwargs):
        self.at_end.append(self._grads(loop.model))


def _same(a, b):
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y)) for x, y in zip(a, b))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_batch_begin_sees_the_previous_steps_gradients_as_in_hat(accumulate):
    cb = GradsAtBatchBegin()
    linear_trainer([cb], data=linear_data(4), processor_args=dict(grad_accumulation_step=accumulate)).fit()
    assert all(g is None for g in cb.at_begin[0])
    for step in range(1, 4):  # zeroed after on_batch_begin: the gradients of the step before are still there
        assert _same(cb.at_begin[step], cb.at_end[step - 1]) and cb.at_begin[step][0] is not None
    if accumulate == 2:  # inside a group the gradients add up
        assert not torch.equal(cb.at_end[1][0], cb.at_end[0][0])


def test_a_multibatch_processor_zeroes_before_the_first_on_batch_begin_as_in_hat():
    cb = GradsAtBatchBegin()
    data = [tuple(linear_data(2)) for _ in range(2)]
    processor = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    linear_trainer([cb], data=data, processor=processor).fit()
    # batch 0 of each step: zeroed already; batch 1: the gradient of batch 0
    assert [all(g is None for g in grads) for grads in cb.at_begin] == [True, False, True, False]
    assert _same(cb.at_begin[1], cb.at_end[0]) and _same(cb.at_begin[3], cb.at_end[2])


def test_forward_and_backward_hooks_see_the_batch_the_outputs_and_the_gradients():
    class Around(HatStyleBase):
        def __init__(self):
            self.log = []

        def on_forward_begin(self, batch, model, **kwargs):
            self.log.append(("forward_begin", batch[0].dtype, model.training))

        def on_forward_end(self, model_outs, **kwargs):
            self.log.append(("forward_end", tuple(model_outs[1].shape)))

        def on_backward_begin(self, model, **kwargs):
            self.log.append(("backward_begin", model.fc.weight.grad is None))

        def on_backward_end(self, model, **kwargs):
            self.log.append(("backward_end", model.fc.weight.grad is None))

    cb = Around()
    to_double = lambda batch: (batch[0].double(), batch[1])  # noqa: E731
    trainer = linear_trainer([cb], data=linear_data(1), processor_args=dict(batch_transforms=[to_double]))
    trainer.model.double()
    trainer.fit()
    assert cb.log == [("forward_begin", torch.float64, True), ("forward_end", (6, 3)),
                      ("backward_begin", True), ("backward_end", False)]


class Unsized:
    """An iterable without len(): the engine sees an epoch's end only when it comes."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_the_flush_of_an_unfinished_accumulation_group_fires_on_optimizer_step_begin_first():
    class Order(HatStyleBase):
        def __init__(self):
            self.log = []

        def on_optimizer_step_begin(self, global_step_id, **kwargs):
            self.log.append(("optimizer_step_begin", global_step_id))

        def on_epoch_end(self, epoch_id, **kwargs):
            self.log.append(("epoch_end", epoch_id))

    def run(callbacks):
        order = Order()
        trainer = linear_trainer([*callbacks, order], data=Unsized(linear_data(3)), num_epochs=2,
                                 processor_args=dict(grad_accumulation_step=2))
        trainer.fit()
        return order.log, [p.detach().clone() for p in trainer.model.parameters()]

    log, plain = run([])
    assert log == [("optimizer_step_begin", 1), ("optimizer_step_begin", 2), ("epoch_end", 0),
                   ("optimizer_step_begin", 4), ("optimizer_step_begin", 5), ("epoch_end", 1)]
    # GradScale holds the gradients aside until on_optimizer_step_begin: the flush still applies them
    _, with_grad_scale = run([GradScale(module_and_scale=[("fc", 1.0)])])
    assert all(torch.equal(a, b) for a, b in zip(plain, with_grad_scale))


def test_a_hook_that_unscales_under_fp16_does_not_make_the_processors_clipping_unscale_again():
    class HatStyleGradClip(HatStyleBase):
        def on_optimizer_step_begin(self, model, optimizer, grad_scaler, **kwargs):
            self.enabled = grad_scaler.is_enabled()
            grad_scaler.unscale_(optimizer)  # HAT's GradClip
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)

    cb = HatStyleGradClip()
    trainer = make_trainer([cb], num_steps=2, processor=dict(enable_amp=True, enable_amp_dtype=torch.float16,
                                                             clip_grad_norm=0.5))
    trainer.fit()  # a second unscale_ before the update would raise RuntimeError
    assert cb.enabled and trainer.state.iteration == 2
    assert isinstance(trainer.state.grad_norm, torch.Tensor) and trainer.state.grad_norm <= 1.0 + 1e-4
