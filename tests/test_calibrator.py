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
    # moving-average ranges: the first batch sets them, later (larger) batches pull them up
    assert float(DATA[0].max()) < float(observer.max_val) < float(DATA[2].max())
    assert all(p.grad is None for p in cal.model.parameters())


def test_num_steps_beyond_the_loader_needs_cycle_data_loader():
    with pytest.raises(ValueError, match="num_steps=6.*4 per pass.*cycle_data_loader=True"):
        calibrator(num_steps=6)
    cal = calibrator(num_steps=6, cycle_data_loader=True)
    assert cal.fit().iteration == 6
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
