"""Calibrator: an Ignite engine running observer steps without gradients; misuse errors; checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.engine import BasicBatchProcessor, HatEvents
from hat_ignite.engine.calibrator import Calibrator
from hat_ignite.errors import QuantizationError
from hat_ignite.quantization import Float2Calibration

torch.manual_seed(0)
DATA = [torch.rand(16, 6) * (i + 1) for i in range(4)]


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def calibrator(**kwargs) -> Calibrator:
    args = dict(
        model=make_net(), data_loader=DATA, batch_processor=BasicBatchProcessor(need_grad_update=False),
        model_convert_pipeline=[Float2Calibration(example_inputs=DATA[0])],
    )
    args.update(kwargs)
    return Calibrator(**args)


class Recorder(CallbackMixin):
    def __init__(self):
        self.calls = []

    def on_loop_begin(self, model, **kwargs):
        self.calls.append(("loop_begin", model.training))

    def on_step_end(self, global_step_id, model_outs, **kwargs):
        self.calls.append(("step_end", global_step_id, model_outs.requires_grad))

    def on_epoch_end(self, epoch_id, **kwargs):
        self.calls.append(("epoch_end", epoch_id))

    def on_loop_end(self, **kwargs):
        self.calls.append(("loop_end",))


def test_runs_num_steps_in_eval_without_gradients_firing_hat_events():
    recorder = Recorder()
    cal = calibrator(num_steps=3, callbacks=[recorder])
    ignite_steps = []
    cal.add_event_handler(HatEvents.STEP_END, lambda engine: ignite_steps.append(engine.state.iteration))
    observer = cal.model.graph.activation_post_process_0.activation_post_process
    cal.fit()
    assert recorder.calls == [
        ("loop_begin", False), ("step_end", 0, False), ("step_end", 1, False), ("step_end", 2, False),
        ("epoch_end", 0), ("loop_end",),
    ]
    assert ignite_steps == [1, 2, 3]
    # HAT's default calibration observer, mse: alpha * (min, max) of all three batches, alpha = 1 - k / 100
    seen = torch.cat(DATA[:3])
    alpha = float(observer.max_val) / float(seen.max())
    assert 0.05 < alpha <= 1 and abs(alpha * 100 - round(alpha * 100)) < 1e-3
    assert float(observer.min_val) == pytest.approx(alpha * float(seen.min()), rel=1e-6)
    assert all(p.grad is None for p in cal.model.parameters())


class EpochRecorder(CallbackMixin):
    def __init__(self):
        self.calls = []

    def on_epoch_begin(self, epoch_id, global_step_id, **kwargs):
        self.calls.append(("epoch_begin", epoch_id, global_step_id))

    def on_step_end(self, epoch_id, step_id, global_step_id, **kwargs):
        self.calls.append(("step_end", epoch_id, step_id, global_step_id))

    def on_epoch_end(self, epoch_id, global_step_id, **kwargs):
        self.calls.append(("epoch_end", epoch_id, global_step_id))

    def on_loop_end(self, epoch_id, global_step_id, **kwargs):
        self.calls.append(("loop_end", epoch_id, global_step_id))


def _observer_ranges(cal):
    from hat_ignite.quantization.prepared import prepared_modules

    return [(float(m.min_val), float(m.max_val)) for module in prepared_modules(cal.model)
            for m in module.modules() if hasattr(m, "min_val") and m.min_val.numel() == 1]


def test_num_steps_beyond_the_loader_runs_more_epochs_as_hat_does():
    recorder = EpochRecorder()
    cal = calibrator(num_steps=10, callbacks=[recorder])
    assert cal.fit().iteration == 10
    # HAT's loop (hat/engine/loop_base.py, its fit run on a 4-batch loader with num_steps=10)
    # gives these ids: a new epoch per pass of the loader, the last one cut at num_steps
    steps = lambda epoch, first: [("step_end", epoch, i, first + i) for i in range(4 if epoch < 2 else 2)]  # noqa: E731
    assert recorder.calls == [
        ("epoch_begin", 0, 0), *steps(0, 0), ("epoch_end", 0, 4),
        ("epoch_begin", 1, 4), *steps(1, 4), ("epoch_end", 1, 8),
        ("epoch_begin", 2, 8), *steps(2, 8), ("epoch_end", 2, 10),
        ("loop_end", 3, 10),
    ]
    # the observers saw the batches of a run given those 10 batches in one pass
    once = calibrator(data_loader=DATA + DATA + DATA[:2], num_steps=10)
    once.fit()
    assert _observer_ranges(cal) == _observer_ranges(once) and len(_observer_ranges(cal)) >= 2
    x = torch.rand(5, 6) * 3
    with torch.no_grad():
        assert torch.equal(cal.model(x), once.model(x))
    assert calibrator(num_steps=None).fit().iteration == len(DATA)  # default: one pass


def test_refuses_an_unprepared_model_and_a_training_processor():
    with pytest.raises(QuantizationError, match="Float2Calibration"):
        calibrator(model_convert_pipeline=None)
    with pytest.raises(ValueError, match="need_grad_update=False"):
        calibrator(batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=lambda o: [o.sum()]))


def test_calibrated_checkpoint_reloads_and_keeps_working(tmp_path):
    cal = calibrator(num_steps=4, callbacks=[Checkpoint(tmp_path, name_prefix="calibration-")])
    cal.fit()
    again = LoadCheckpoint(tmp_path / "calibration-checkpoint-last.pth.tar")(
        Float2Calibration(example_inputs=DATA[0])(make_net())
    )
    x = torch.rand(5, 6) * 3
    with torch.no_grad():
        assert torch.equal(again.eval()(x), cal.model.eval()(x))


@pytest.mark.parametrize("interval, logged", [
    # measured with HAT's loop (hat/engine/loop_base.py: step_id % log_interval == 0, step_id inside
    # the epoch) on a 4-batch loader and num_steps=10: (epoch_id, step_id) of each progress line
    (2.5, [(0, 0), (1, 0), (2, 0)]),
    (1.0, [(e, s) for e in range(3) for s in range(4 if e < 2 else 2)]),
    (2, [(0, 0), (0, 2), (1, 0), (1, 2), (2, 0)]),
    (0.0, []),
    (-1, []),
])
def test_a_float_log_interval_logs_the_steps_hat_logs(interval, logged, caplog):
    """HAT configs pass ``log_interval=calibration_step / 10``, a float."""
    cal = calibrator(num_steps=10, log_interval=interval)
    with caplog.at_level("INFO", logger="hat_ignite.engine.Calibrator"):
        cal.fit()
    import re

    lines = [re.match(r"Epoch\[(\d+)\] Step\[(\d+)\]", r.getMessage()) for r in caplog.records
             if r.name == "hat_ignite.engine.Calibrator"]
    assert [(int(m[1]), int(m[2])) for m in lines if m] == logged


def test_log_interval_must_be_a_number():
    with pytest.raises(TypeError, match="log_interval must be a number .* got '10'"):
        calibrator(num_steps=2, log_interval="10")
