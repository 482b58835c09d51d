"""Workloads and runners compared by ``bench/engine_overhead.py``.

Every runner trains the same model on the same batches, and every per-step figure comes from the
same place: :class:`TimedBatches`, the iterable all of them read their batches from, notes the
time when the first timed batch is taken and when the iterable is exhausted. Setup (building an
engine, Lightning's fit preparation) and epoch-end work happen outside that window, so the
figure is the steady-state cost of one step inside an epoch.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

WARMUP = 5  # steps of each run left out of the timed window

#: The clock the timed window reads: ``time.perf_counter`` (wall time, the default) or
#: ``time.process_time`` (CPU time of this process, all its threads: a step's cost without the
#: time the process waited for a core another program held; ``--clock cpu``).
CLOCK = time.perf_counter


class TimedBatches:
    """Yields ``n`` batches (cycling through ``batches``), timing the steps in between.

    The window runs from the request of batch ``WARMUP`` to the request of the last batch, so
    it holds ``n - 1 - WARMUP`` whole steps whether or not the engine reads past the end (Ignite
    stops at ``len()``; Lightning fetches one batch ahead, which shifts both ends alike).
    """

    def __init__(self, batches: list, n: int) -> None:
        self.batches, self.n = batches, n
        self.t0 = self.t1 = 0.0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator:
        batches, k, clock = self.batches, len(self.batches), CLOCK
        last = self.n - 1
        for i in range(self.n):
            if i == WARMUP:
                self.t0 = clock()
            elif i == last:
                self.t1 = clock()
            yield batches[i % k]

    def per_step_us(self) -> float:
        if self.n < WARMUP + 2 or not self.t1:
            raise RuntimeError(f"need at least {WARMUP + 2} steps read to the last batch, got n={self.n}")
        return (self.t1 - self.t0) / (self.n - 1 - WARMUP) * 1e6


# -- models: forward(x, y) -> ({"cls_loss": loss}, logits), HAT style -----------------------
class NoopNet(nn.Module):
    """No model work at all: the no-op workload measures the engines alone."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:  # pragma: no cover - never called
        raise RuntimeError("the no-op workload never calls the model")


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        logits = self.fc2(F.relu(self.fc1(x)))
        return {"cls_loss": F.cross_entropy(logits, y)}, logits


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        logits = self.fc(x.flatten(1))
        return {"cls_loss": F.cross_entropy(logits, y)}, logits


WORKLOADS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], int]] = {
    # name: (model factory, input shape, batch size)
    "noop": (NoopNet, (1,), 1),
    "mlp": (TinyMLP, (32,), 32),
    "cnn": (SmallCNN, (3, 32, 32), 64),
}


def make_batches(workload: str, count: int = 8) -> list:
    _, shape, bs = WORKLOADS[workload]
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(bs, *shape, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(count)]


def make_model(workload: str) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    torch.manual_seed(0)
    model = WORKLOADS[workload][0]()
    params = list(model.parameters())
    return model, (torch.optim.SGD(params, lr=0.01) if params else None)


# -- (a) the hand-written loop and (b) a bare Ignite Engine share this step -----------------
def make_step(workload: str, model: nn.Module, opt: torch.optim.Optimizer | None) -> Callable[[Any], Any]:
    if workload == "noop":
        return lambda batch: None

    def step(batch: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        losses, logits = model(*batch)
        losses["cls_loss"].backward()
        opt.step()
        return losses, logits

    return step


def run_hand_loop(workload: str, data: TimedBatches) -> None:
    step = make_step(workload, *make_model(workload))
    for batch in data:
        step(batch)


def run_ignite(workload: str, data: TimedBatches) -> None:
    from ignite.engine import Engine

    step = make_step(workload, *make_model(workload))
    Engine(lambda engine, batch: step(batch)).run(data, max_epochs=1)


def run_ignite_metrics(workload: str, data: TimedBatches) -> None:
    """(b) with Ignite's own metrics for the values (d)'s ``MetricUpdater`` keeps: the accuracy and
    a running average of the loss, each updated every step (a breakdown row, for comparison)."""
    from ignite.engine import Engine
    from ignite.metrics import Accuracy as IgniteAccuracy
    from ignite.metrics import RunningAverage

    step = make_step(workload, *make_model(workload))

    def process(engine: Any, batch: Any) -> Any:
        losses, logits = step(batch)
        return losses["cls_loss"].detach(), logits.detach(), batch[1]

    engine = Engine(process)
    IgniteAccuracy(output_transform=lambda out: (out[1], out[2])).attach(engine, "accuracy")
    RunningAverage(output_transform=lambda out: out[0]).attach(engine, "loss")
    engine.run(data, max_epochs=1)


def digits_metric_update(metrics: Any, batch: Any, model_outs: Any) -> None:
    """The digits config's ``metric_update_func``: the losses into ``LossShow``, the logits into
    ``Accuracy``. (d) runs it in ``MetricUpdater``, (b+u) in Ignite's process function."""
    losses, logits = model_outs
    metrics[0].update(losses)
    metrics[1].update(batch[1], logits)


def run_ignite_updates(workload: str, data: TimedBatches) -> None:
    """(b) doing the metric work (d) does: the digits config's update of hat_ignite's ``LossShow``
    and ``Accuracy``, every step, in the process function, with no callback around it.

    (d) minus this row is what the engine and its callbacks add around the same work.
    """
    from ignite.engine import Engine, Events

    from hat_ignite.metrics import Accuracy, LossShow

    step = make_step(workload, *make_model(workload))
    metrics = [LossShow(), Accuracy()]

    def process(engine: Any, batch: Any) -> Any:
        model_outs = step(batch)
        digits_metric_update(metrics, batch, model_outs)
        return model_outs

    engine = Engine(process)
    engine.add_event_handler(Events.EPOCH_COMPLETED, lambda _: [m.get() for m in metrics])  # as (d) logs them
    engine.run(data, max_epochs=1)


def run_ignite_checked(workload: str, data: TimedBatches) -> None:
    """(b) with the checks (c)'s batch processor makes by default: the loss is read and tested
    before the backward, the gradients through ``grads_finite`` before the optimizer step."""
    from ignite.engine import Engine

    from hat_ignite.engine.processors.nonfinite import grads_finite

    model, opt = make_model(workload)
    params = [p for group in opt.param_groups for p in group["params"]]

    def process(engine: Any, batch: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        losses, logits = model(*batch)
        loss = losses["cls_loss"]
        if not math.isfinite(loss.item()):
            raise FloatingPointError("non-finite loss")
        loss.backward()
        grads = []  # gathered as the batch processor's check gathers them: a plain loop
        for p in params:
            grad = p.grad
            if grad is not None:
                grads.append(grad)
        if not grads_finite(grads):
            raise FloatingPointError("non-finite gradient")
        opt.step()
        return losses, logits

    Engine(process).run(data, max_epochs=1)


# -- (c) Trainer, (c10) with ten trivial callbacks, (d) with the digits config's callbacks --
def _noop_processor() -> Any:
    from hat_ignite.engine.events import HatEvents
    from hat_ignite.engine.processors import BatchProcessorMixin

    class NoopProcessor(BatchProcessorMixin):
        """Fires the three per-batch events and does nothing else."""

        need_grad_update, grad_scaler = True, None

        def __call__(self, engine: Any, batch: Any) -> Any:
            fire = engine.fire_event
            fire(HatEvents.BATCH_BEGIN)
            fire(HatEvents.BACKWARD_END)
            fire(HatEvents.BATCH_END)

    return NoopProcessor()


def _ten_trivial_callbacks(keep_kwargs: bool = False) -> list:
    """Ten callbacks, two on each step-level hook: five fires, ten handler calls per step.

    Each counts its calls. With ``keep_kwargs`` each also keeps the keyword dict it was given,
    which makes it need the whole dict (a hook that only reads keys by name gets just those).
    """
    from hat_ignite.callbacks import CallbackMixin

    hooks = ("on_step_begin", "on_batch_begin", "on_backward_end", "on_batch_end", "on_step_end")

    def trivial(self: Any, **kwargs: Any) -> None:
        self.calls += 1

    def keeping(self: Any, **kwargs: Any) -> None:
        self.calls += 1
        self.last = kwargs

    callbacks = []
    for i in range(10):
        cls = type(f"Trivial{i}", (CallbackMixin,), {hooks[i % 5]: keeping if keep_kwargs else trivial, "calls": 0})
        callbacks.append(cls())
    return callbacks


def _digits_callbacks(ckpt_dir: str, tb_every: int = 50) -> list:
    """The shipped digits config's training callbacks (validation left out: epoch-level work), with
    TensorBoard writing every ``tb_every`` steps (the config itself writes every 5)."""
    import importlib.util

    from hat_ignite.callbacks import Checkpoint, MetricUpdater, StatsMonitor, StepDecayLrUpdater

    callbacks = [
        StatsMonitor(log_freq=0),
        StepDecayLrUpdater(warmup_by="epoch", warmup_len=1, lr_decay_id=[12, 17], step_log_interval=100),
        MetricUpdater(metric_update_func=digits_metric_update, step_log_freq=0, epoch_log_freq=5,
                      storage_key="train_monitor_obj"),
        Checkpoint(save_dir=ckpt_dir, name_prefix="bench-", save_interval=1, interval_by="epoch", keep_n=1),
    ]
    if importlib.util.find_spec("hat_ignite.callbacks.tensorboard") is not None:
        from hat_ignite.callbacks import tensorboard as tb_module

        tb_cls = getattr(tb_module, "TensorBoard", None)
        if tb_cls is not None:
            tb_dir = os.path.join(ckpt_dir, "tensorboard")
            callbacks.append(tb_cls(save_dir=tb_dir, overwrite=True, update_freq=tb_every))
    return callbacks


def run_trainer(workload: str, data: TimedBatches, callbacks: str = "none", checks: bool = True,
                without: str | None = None, tb_every: int = 50) -> None:
    """(c)-style runs; ``checks=False`` turns the finite-loss/gradient checks off, ``without`` drops
    the digits callback of that class name."""
    from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

    model, opt = make_model(workload)
    if workload == "noop":
        processor = _noop_processor()
    else:
        processor = BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0),
                                        check_finite_loss=checks)
    extra: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if callbacks in ("ten", "ten-full"):
            cbs = _ten_trivial_callbacks(keep_kwargs=callbacks == "ten-full")
        elif callbacks == "digits":
            from hat_ignite.metrics import Accuracy, LossShow

            cbs = [cb for cb in _digits_callbacks(tmp, tb_every) if type(cb).__name__ != without]
            if without != "MetricUpdater":  # without their updater the metrics would stay empty (NaN)
                extra["train_metrics"] = [LossShow(), Accuracy()]
        else:
            cbs = []
        Trainer(model=model, data_loader=data, optimizer=opt, batch_processor=processor, device=None,
                num_epochs=1, callbacks=cbs, **extra).fit()


# -- (e) PyTorch Lightning, everything optional off --------------------------------------------
def lightning_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytorch_lightning") is not None


def run_lightning(workload: str, data: TimedBatches) -> None:
    import pytorch_lightning as pl

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    model, opt = make_model(workload)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model
            self.automatic_optimization = workload != "noop"

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if workload == "noop":
                return None
            losses, _ = self.net(*batch)
            return losses["cls_loss"]

        def configure_optimizers(self) -> Any:
            return opt if opt is not None else torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.0)

    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, deterministic=False, benchmark=False,
    )
    trainer.fit(Module(), train_dataloaders=data)


#: variant key -> (label, runner(workload, data)); the order rows are printed in.
VARIANTS: dict[str, tuple[str, Callable[[str, TimedBatches], None]]] = {
    "a": ("(a) hand-written loop", run_hand_loop),
    "b": ("(b) bare Ignite Engine", run_ignite),
    "bu": ("(b+u) (b) with the digits config's metric updates", run_ignite_updates),
    "c": ("(c) Trainer, no callbacks", run_trainer),
    "c10": ("(c10) Trainer + 10 trivial callbacks", lambda w, d: run_trainer(w, d, "ten")),
    "c10f": ("(c10f) … each keeping its whole kwargs dict", lambda w, d: run_trainer(w, d, "ten-full")),
    "d": ("(d) Trainer + digits callbacks", lambda w, d: run_trainer(w, d, "digits")),
    "e": ("(e) PyTorch Lightning", run_lightning),
}

#: Rows that take (c) and (d) apart; run only when ``--variants`` names them.
BREAKDOWN_VARIANTS: dict[str, tuple[str, Callable[[str, TimedBatches], None]]] = {
    "c0": ("(c0) (c) with the finite-loss/gradient checks off", lambda w, d: run_trainer(w, d, checks=False)),
    "dM": ("(d−M) (d) without MetricUpdater", lambda w, d: run_trainer(w, d, "digits", without="MetricUpdater")),
    "dS": ("(d−S) (d) without StatsMonitor", lambda w, d: run_trainer(w, d, "digits", without="StatsMonitor")),
    "dT": ("(d−T) (d) without TensorBoard", lambda w, d: run_trainer(w, d, "digits", without="TensorBoard")),
    "d5": ("(d5) (d) with TensorBoard every 5 steps, as the digits config",
           lambda w, d: run_trainer(w, d, "digits", tb_every=5)),
    "bM": ("(b+M) (b) with Ignite's Accuracy and RunningAverage of the loss", run_ignite_metrics),
    "bk": ("(b+k) (b) with (c)'s finite-loss and finite-gradient checks", run_ignite_checked),
}

#: Rows that need model outputs, so the no-op workload leaves them out.
NEEDS_MODEL_OUTPUTS = frozenset({"bu", "bk", "d", "dM", "dS", "dT", "d5", "bM"})
