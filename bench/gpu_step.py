"""Steps per second of a GPU-bound conv net: a raw loop, a bare Ignite Engine, our Trainer, Lightning.

Run from the repository root on a machine with a GPU::

    .venv/bin/python bench/gpu_step.py                    # ResNet-style net, batch 256 of 3x64x64
    .venv/bin/python bench/gpu_step.py --device cpu --quick   # a smoke run on the CPU (tiny sizes)

The model is a ResNet-style conv net (a stem, three stages of two residual blocks, widths
64/128/256 by default) trained with a fused SGD (momentum 0.9; ``--optimizer sgd`` or ``adamw``
for the plain ones HAT configs use) under bf16 autocast with
channels_last inputs: at batch 256 of 3x64x64 images the GPU bounds the step, so any host-device
sync of the engine shows as lost throughput. The batches are made on the device once (no data
loading in the figures). The variants:

* ``raw``: a hand-written loop (zero_grad, forward, backward, step);
* ``ignite``: the same step as the process function of a bare Ignite ``Engine``;
* ``trainer``: our ``Trainer`` with a ``BasicBatchProcessor`` (default NaN/Inf guard) and the
  shipped configs' per-step callbacks: ``StatsMonitor``, ``StepDecayLrUpdater``, a
  ``MetricUpdater`` of ``LossShow`` and ``Accuracy``, and ``TensorBoard`` (every 50 steps);
* ``lightning``: a ``LightningModule`` doing the raw step, when ``pytorch_lightning`` is installed.

After one untimed round, every round runs each variant once, interleaved (the order rotated each round), for ``--steps`` timed steps after ``--warmup``
steps; each variant's figure is the median over rounds (and the range). Then, on CUDA, each
variant runs its steady-state steps again under ``torch.cuda.set_sync_debug_mode("error")``,
which raises at any synchronizing call: the log intervals are set past those steps, so the
check proves there is no sync between log points.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    """A basic residual block: two 3x3 convs with batch norm, a projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.proj is None else self.proj(x)))


class ConvNet(nn.Module):
    """ResNet-style classifier returning ``({"cls_loss": loss}, logits)`` in training, as HAT models do."""

    def __init__(self, width: int, num_classes: int = 10) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        self.stages = nn.Sequential(Block(w, w, 1), Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 2 * w, 1),
                                    Block(2 * w, 4 * w, 2), Block(4 * w, 4 * w, 1))
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, img: torch.Tensor, label: torch.Tensor) -> Any:
        logits = self.head(self.stages(self.stem(img)).mean((2, 3)))
        return {"cls_loss": nn.functional.cross_entropy(logits.float(), label)}, logits


#: ``--optimizer`` choices: (label, factory). HAT configs use the plain ones.
OPTIMIZERS: dict[str, tuple[str, Callable[[Any], torch.optim.Optimizer]]] = {
    "sgd-fused": ("fused SGD (momentum 0.9)", lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, fused=True)),
    "sgd": ("SGD (momentum 0.9, not fused)", lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
    "adamw": ("AdamW (not fused)", lambda p: torch.optim.AdamW(p, lr=1e-3)),
}


def make_setup(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """A fresh model and optimizer (same seed for every variant) and the device batches."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = ConvNet(args.width).to(device).to(memory_format=torch.channels_last)
    optimizer = OPTIMIZERS[args.optimizer][1](model.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(args.batch, 3, args.size, args.size, generator=g).to(device).contiguous(
            memory_format=torch.channels_last), torch.randint(0, 10, (args.batch,), generator=g).to(device))
        for _ in range(4)
    ]
    return model, optimizer, batches


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _autocast(args: argparse.Namespace) -> Any:
    return torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=not args.no_amp)


class Clock:
    """Wall time of the steps after the warm-up (the device drained at both ends)."""

    def __init__(self, args: argparse.Namespace, sync_check: bool) -> None:
        self.args, self.sync_check, self.start = args, sync_check, 0.0
        self.total = args.warmup + args.steps

    def step(self, done: int) -> None:
        """Call after ``done`` steps were queued."""
        if done == self.args.warmup:
            _sync(self.args.device)
            if self.sync_check:
                torch.cuda.set_sync_debug_mode("error")
            self.start = time.perf_counter()
        elif done == self.total:
            if self.sync_check:
                torch.cuda.set_sync_debug_mode("default")
            _sync(self.args.device)
            self.start = time.perf_counter() - self.start

    @property
    def steps_per_s(self) -> float:
        return self.args.steps / self.start


def _batches(batches: list, n: int) -> list:
    return [batches[i % len(batches)] for i in range(n)]


def run_raw(args: argparse.Namespace, clock: Clock) -> None:
    model, optimizer, batches = make_setup(args)
    model.train()
    for i, (img, label) in enumerate(_batches(batches, clock.total)):
        optimizer.zero_grad(set_to_none=True)
        with _autocast(args):
            losses, _ = model(img, label)
        losses["cls_loss"].backward()
        optimizer.step()
        clock.step(i + 1)


def run_ignite(args: argparse.Namespace, clock: Clock) -> None:
    from ignite.engine import Engine, Events

    model, optimizer, batches = make_setup(args)
    model.train()

    def process(engine: Engine, batch: Any) -> Any:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(args):
            losses, _ = model(*batch)
        losses["cls_loss"].backward()
        optimizer.step()
        return losses

    engine = Engine(process)
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: clock.step(e.state.iteration))
    engine.run(_batches(batches, clock.total), max_epochs=1)


def run_trainer(args: argparse.Namespace, clock: Clock) -> None:
    from hat_ignite.callbacks import MetricUpdater, StatsMonitor, StepDecayLrUpdater, TensorBoard
    from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
    from hat_ignite.engine.events import HatEvents
    from hat_ignite.metrics import Accuracy, LossShow

    model, optimizer, batches = make_setup(args)
    far = clock.total + 1 if clock.sync_check else 50  # no log point inside the checked steps

    def update_metrics(metrics: Any, batch: Any, model_outs: Any) -> None:
        losses, logits = model_outs
        metrics[0].update(losses)
        metrics[1].update(batch[1], logits)

    with tempfile.TemporaryDirectory() as tmp:
        callbacks = [
            StatsMonitor(log_freq=far),
            StepDecayLrUpdater(warmup_by="step", warmup_len=5, lr_decay_id=[10**6], step_log_interval=far),
            MetricUpdater(metric_update_func=update_metrics, step_log_freq=far, epoch_log_freq=1, log_prefix="Train "),
            TensorBoard(save_dir=os.path.join(tmp, "tb"), update_freq=far),
        ]
        device = torch.device(args.device)
        trainer = Trainer(
            model=model, data_loader=_batches(batches, clock.total), optimizer=optimizer,
            batch_processor=BasicBatchProcessor(
                need_grad_update=True, loss_collector=collect_loss_by_index(0), enable_amp=not args.no_amp,
                enable_amp_dtype=torch.bfloat16, enable_channels_last=True,
            ),
            device=device.index or 0 if device.type == "cuda" else None, num_epochs=1, callbacks=callbacks,
            train_metrics=[LossShow(), Accuracy()],
        )
        trainer.add_event_handler(HatEvents.STEP_END, lambda e: clock.step(e.state.iteration))
        trainer.fit()


class _Stream:
    """An iterable of batches that is not a list: Lightning takes a list for several loaders."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def run_lightning(args: argparse.Namespace, clock: Clock) -> None:
    import pytorch_lightning as pl

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    model, optimizer, batches = make_setup(args)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            with _autocast(args):
                losses, _ = self.net(*batch)
            return losses["cls_loss"]

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            clock.step(batch_idx + 1)

        def configure_optimizers(self) -> Any:
            return optimizer

    device = torch.device(args.device)
    pl.Trainer(
        max_epochs=1, accelerator="gpu" if device.type == "cuda" else "cpu", devices=[device.index or 0]
        if device.type == "cuda" else 1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    ).fit(Module(), train_dataloaders=_Stream(_batches(batches, clock.total)))


VARIANTS: dict[str, tuple[str, Callable[[argparse.Namespace, Clock], None]]] = {
    "raw": ("raw loop", run_raw),
    "ignite": ("bare Ignite Engine", run_ignite),
    "trainer": ("Trainer + shipped per-step callbacks", run_trainer),
    "lightning": ("PyTorch Lightning", run_lightning),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=64, help="image side (default 64: 3x64x64)")
    parser.add_argument("--width", type=int, default=64, help="channels of the first stage (default 64)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--optimizer", choices=list(OPTIMIZERS), default="sgd-fused",
                        help="sgd-fused (default), sgd or adamw (plain, as HAT configs use)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: batch 4 of 3x16x16, width 4, 3 steps, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.size, args.width, args.steps, args.warmup, args.rounds = 4, 16, 4, 3, 2, 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; pass --device cpu (with --quick for a smoke run)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("hat_ignite").setLevel(logging.WARNING)
    torch.backends.cudnn.benchmark = True
    names = [n for n in VARIANTS if n != "lightning" or importlib.util.find_spec("pytorch_lightning")]
    device = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
    print(f"# gpu_step: {device}, torch {torch.__version__}, batch {args.batch} of 3x{args.size}x{args.size}, "
          f"width {args.width}, {'fp32' if args.no_amp else 'bf16 autocast'}, channels_last, "
          f"{OPTIMIZERS[args.optimizer][0]}; "
          f"{args.rounds} rounds x {args.steps} steps (+{args.warmup} warm-up)")
    if "lightning" not in names:
        print("# pytorch_lightning is not installed: no Lightning row")
    figures: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # an untimed round first: kernel selection and caches warm for every variant
        VARIANTS[name][1](args, Clock(args, sync_check=False))
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # interleaved, each round rotated
            clock = Clock(args, sync_check=False)
            VARIANTS[name][1](args, clock)
            figures[name].append(clock.steps_per_s)
    base = statistics.median(figures["raw"])
    print(f"{'variant':<42} {'steps/s (median)':>17} {'range':>17} {'vs raw':>8}")
    for name in names:
        values = figures[name]
        median = statistics.median(values)
        print(f"{VARIANTS[name][0]:<42} {median:>17.2f} {min(values):>8.2f}..{max(values):<8.2f} {median / base:>8.3f}")
    if not args.device.startswith("cuda"):
        print("sync check: skipped (torch.cuda.set_sync_debug_mode needs a CUDA device)")
        return
    for name in names:
        clock = Clock(args, sync_check=True)
        try:
            VARIANTS[name][1](args, clock)
            verdict = f"no sync in {args.steps} steady-state steps"
        except RuntimeError as exc:
            verdict = f"SYNC: {str(exc).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        print(f"sync check, {VARIANTS[name][0]}: {verdict}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
