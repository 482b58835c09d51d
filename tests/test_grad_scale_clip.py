"""Gradient clipping of the batch processors and the GradScale callback, on a real conv net and digits."""

from __future__ import annotations

import copy

import pytest
import torch
from control_helpers import ConvBNNet, digits_loader, digits_tensors, make_trainer

from hat_ignite.callbacks import CallbackMixin, GradScale
from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, collect_loss_by_index


class GradRecorder(CallbackMixin):
    """Keeps the gradients after each backward (before clipping) and the ones each optimizer step uses."""

    def __init__(self) -> None:
        self.after_backward: list[list[torch.Tensor | None]] = []
        self.scales: list[float] = []
        self.at_step: list[list[torch.Tensor | None]] = []
        self._handle = None

    def on_loop_begin(self, optimizer, **kwargs):
        def pre_hook(opt, args, kw):
            self.at_step.append(self._grads(opt))
            self.pending_before.append(self.after_backward[-1])
            self.pending_scale.append(self.scales[-1])

        self.pending_before, self.pending_scale = [], []
        self._handle = optimizer.register_step_pre_hook(pre_hook)

    @staticmethod
    def _grads(opt):
        return [None if p.grad is None else p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]

    def on_backward_end(self, optimizer, grad_scaler, **kwargs):
        self.after_backward.append(self._grads(optimizer))
        self.scales.append(grad_scaler.get_scale() if grad_scaler is not None and grad_scaler.is_enabled() else 1.0)

    def on_loop_end(self, **kwargs):
        self._handle.remove()


def _expected(before, scale, clip):
    grads = [None if g is None else (g / scale).clone() for g in before]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads if g is not None]
    for p, g in zip(params, [g for g in grads if g is not None]):
        p.grad = g
    clip(params)
    return [p.grad for p in params]


CASES = {
    "fp32": dict(),
    "accumulate2": dict(grad_accumulation_step=2),
    "bf16": dict(enable_amp=True, enable_amp_dtype=torch.bfloat16),
    "bf16_accumulate2": dict(enable_amp=True, enable_amp_dtype="bfloat16", grad_accumulation_step=2),
    "fp16_scaler": dict(enable_amp=True, enable_amp_dtype=torch.float16),
}


COMBINATIONS = [(case, "norm") for case in CASES] + [
    ("fp32", "value"), ("accumulate2", "value_pair"), ("bf16", "norm_inf"), ("fp16_scaler", "value"),
]


@pytest.mark.parametrize(("case", "mode"), COMBINATIONS)
def test_processor_clipping_gives_what_torch_clip_gives(case, mode):
    clip_args = {
        "norm": dict(clip_grad_norm=0.5),
        "norm_inf": dict(clip_grad_norm=0.01, clip_norm_type="inf"),
        "value": dict(clip_grad_value=0.002),
        "value_pair": dict(clip_grad_value=(-0.001, 0.003)),
    }[mode]
    torch_clip = {
        "norm": lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.5),
        "norm_inf": lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.01, norm_type=float("inf")),
        "value": lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.002),
        "value_pair": lambda ps: [p.grad.clamp_(-0.001, 0.003) for p in ps],
    }[mode]
    recorder = GradRecorder()
    trainer = make_trainer([recorder], processor={**CASES[case], **clip_args}, num_epochs=1, loader=digits_loader(n=96))
    trainer.fit()
    accumulate = CASES[case].get("grad_accumulation_step", 1)
    assert len(recorder.at_step) == -(-3 // accumulate)  # one update per group; the last, short one too
    changed = 0
    for used, before, scale in zip(recorder.at_step, recorder.pending_before, recorder.pending_scale):
        want = _expected(before, scale, torch_clip)
        got = [g for g in used if g is not None]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-8)
        raw = [g / scale for g in before if g is not None]
        changed += any(not torch.allclose(r, w) for r, w in zip(raw, want))
    assert changed == len(recorder.at_step)  # the limits were low enough to clip every update
    if mode.startswith("norm"):
        assert isinstance(trainer.state.grad_norm, torch.Tensor)


def test_multibatch_processor_clips_once_after_the_last_batch():
    recorder = GradRecorder()
    x, y = digits_tensors(n=96)
    loader = [((x[i:i + 16], y[i:i + 16]), (x[i + 16:i + 32], y[i + 16:i + 32])) for i in range(0, 96, 32)]
    processor = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), clip_grad_norm=0.3)
    make_trainer([recorder], loader=loader, processor=processor, num_epochs=1).fit()
    assert len(recorder.after_backward) == 6 and len(recorder.at_step) == 3
    for used, before in zip(recorder.at_step, recorder.pending_before):
        want = _expected(before, 1.0, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.3))
        for g, w in zip([g for g in used if g is not None], want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-8)


def test_bad_clip_arguments_are_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="clip_grad_norm"):
        BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), clip_grad_norm=-1)
    with pytest.raises(ValueError, match="lower < upper"):
        BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), clip_grad_value=(1, -1))
    with pytest.raises(ValueError, match="clip_norm_type"):
        MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), clip_norm_type=0)


# -- GradScale ----------------------------------------------------------------------------------
def _first_step_grads(callbacks, processor=None, loader=None):
    recorder = GradRecorder()
    trainer = make_trainer([*callbacks, recorder], num_steps=1, processor=processor, loader=loader)
    trainer.fit()
    names = [n for n, _ in trainer.model.named_parameters()]
    return dict(zip(names, recorder.at_step[0]))


def test_grad_scale_scales_the_named_module_by_exactly_the_factor():
    plain = _first_step_grads([])
    scaled = _first_step_grads([GradScale(module_and_scale=[("backbone", 0.1), ("head.1", 3.0)])])
    for name, g in plain.items():
        factor = 0.1 if name.startswith("backbone.") else 3.0 if name.startswith("head.1.") else 1.0
        assert torch.equal(scaled[name], g * factor) if factor != 1.0 else torch.equal(scaled[name], g), name


def test_grad_scale_clips_the_scaled_gradients_like_torch():
    plain = _first_step_grads([])
    clipped = _first_step_grads([GradScale(module_and_scale=[("backbone", 0.5)], clip_grad_norm=0.2)])
    params = []
    for name, g in plain.items():
        p = torch.nn.Parameter(torch.zeros_like(g))
        p.grad = g * 0.5 if name.startswith("backbone.") else g.clone()
        params.append(p)
    norm = torch.nn.utils.clip_grad_norm_(params, 0.2)
    assert norm > 0.2
    for p, got in zip(params, clipped.values()):
        torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-8)


def test_grad_scale_per_task_scales_only_that_tasks_share_of_an_accumulated_gradient():
    x, y = digits_tensors(n=32)
    task_a = {"task_name": "a", "img": x[:16], "labels": y[:16]}
    task_b = {"task_name": "b", "img": x[16:], "labels": y[16:]}
    processor = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    got = _first_step_grads(
        [GradScale(module_and_scale=[("backbone", 0.25, "b")])], processor=processor, loader=[(task_a, task_b)]
    )
    torch.manual_seed(0)
    reference = ConvBNNet().train()
    shares = []
    for batch in (task_a, task_b):
        model = copy.deepcopy(reference)
        model(batch)[0].backward()
        shares.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in got.items():
        factor = 0.25 if name.startswith("backbone.") else 1.0
        torch.testing.assert_close(g, shares[0][name] + factor * shares[1][name], rtol=1e-5, atol=1e-7)


def test_grad_scale_warns_at_loop_begin_about_an_entry_that_matches_no_parameter(caplog):
    # HAT matches names as substrings and ignores an entry that matches nothing; we run as HAT
    # does, but say so in the log
    with caplog.at_level("WARNING", logger="hat_ignite.callbacks.grad_scale"):
        make_trainer([GradScale(module_and_scale=[("neck", 0.1)])], num_steps=1).fit()
    assert "('neck', 0.1, None) matches no parameter name" in caplog.text
    with pytest.raises(ValueError, match="each entry"):
        GradScale(module_and_scale=[("backbone",)])
