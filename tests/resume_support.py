"""A small real training config and helpers for the resume and signal tests (real subprocesses).

The config trains an MLP with dropout on 96 generated points with random augmentation (noise
from torch, scale from python's ``random`` and numpy), shuffled, 6 steps per epoch, 3 epochs,
validating at each epoch end (which draws from torch's generator too), and saves a checkpoint
every 2 steps. The optimizer is fused SGD, as in the shipped configs, so the on-device NaN/Inf
guard (and, on 2 processes, its flag all-reduce beside the stop vote) runs in every signal and
resume test. Environment variables steer a run:

- ``KILL_AT``: ``"step:3"`` sends SIGKILL to the process in ``on_step_end`` of global step 3
  (before that step's checkpoint is written); ``"epoch:1"`` in ``on_epoch_end`` of epoch 1 (after
  its last step's checkpoint, before the epoch-end hooks). Comma-separated; each kill happens
  once (a marker file in ``KILL_MARKERS`` records it), so a resumed run passes the same point.
- ``STEP_SLEEP``: seconds to sleep at each step begin (gives a signal time to arrive); with
  ``STEP_SLEEP_UNTIL`` (a path), only until that file exists (a test lets the run finish at once).
- ``RESUME_VARIANT``: ``"workers0"`` (default: fp32, StepDecayLrUpdater by step, data loaded in
  the main process) or ``"workers2-bf16-ema"`` (2 loader workers, bf16 autocast, CosLrUpdater
  with warm-up, ExponentialMovingAverage).
"""

from __future__ import annotations

import atexit
import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Iterator

import torch
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH, EPOCHS = 6, 3
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS

CONFIG = textwrap.dedent('''
    import os, random, signal, time

    import numpy as np
    import torch
    from hat_ignite.callbacks import CallbackMixin

    seed = 7
    work_dir = "./work_dirs/resume"
    ckpt_dir = os.path.join(work_dir, "checkpoints")
    variant = os.environ.get("RESUME_VARIANT", "workers0")
    num_workers = 2 if "workers2" in variant else 0
    amp = "bf16" in variant
    use_ema = "ema" in variant
    if "bf16" in variant:
        lr_updater = dict(type="CosLrUpdater", warmup_len=3, warmup_by="step", stop_lr=0.01)
    else:
        lr_updater = dict(type="StepDecayLrUpdater", update_by="step", lr_decay_id=[5, 13], lr_decay_factor=0.5)


    class KillAt(CallbackMixin):
        """SIGKILLs this process at the points KILL_AT names, once per work dir."""

        def __init__(self):
            self.marker_dir = os.environ.get("KILL_MARKERS", ".")
            self.points = [p for p in os.environ.get("KILL_AT", "").split(",") if p]

        def _maybe_kill(self, point):
            marker = os.path.join(self.marker_dir, "killed-" + point.replace(":", "-"))
            if point in self.points and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_step_begin(self, **kwargs):
            until = os.environ.get("STEP_SLEEP_UNTIL")
            if not (until and os.path.exists(until)):
                time.sleep(float(os.environ.get("STEP_SLEEP", "0")))

        def on_step_end(self, global_step_id, **kwargs):
            self._maybe_kill(f"step:{global_step_id}")

        def on_epoch_end(self, epoch_id, **kwargs):
            self._maybe_kill(f"epoch:{epoch_id}")


    def update_val(metrics, batch, model_outs):
        for metric in metrics:
            metric.update(batch["labels"], model_outs)


    class NoisyBlobs(torch.utils.data.Dataset):
        """Points of 10 Gaussian blobs in 64-d; every item is augmented at random (torch, python
        and numpy generators)."""

        def __init__(self, size, seed):
            g = torch.Generator().manual_seed(seed)
            self.labels = torch.arange(size) % 10
            self.points = torch.randn(10, 64, generator=g)[self.labels] + 0.7 * torch.randn(size, 64, generator=g)

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            scale = random.uniform(0.9, 1.1) + float(np.random.normal(0.0, 0.02))
            return {"img": self.points[i] * scale + 0.2 * torch.randn(64), "labels": self.labels[i]}


    float_trainer = dict(
        type="Trainer",
        model=dict(type="MLPClassifier", in_features=64, hidden_features=32, num_classes=10, dropout=0.3),
        data_loader=dict(type="torch.utils.data.DataLoader", dataset=dict(type=NoisyBlobs, size=96, seed=0),
                         batch_size=16, shuffle=True,
                         num_workers=num_workers),
        optimizer=dict(type="torch.optim.SGD", lr=0.2, momentum=0.9, weight_decay=1e-4, fused=True),
        batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True, enable_amp=amp,
                             enable_amp_dtype="bfloat16", loss_collector=dict(type="collect_loss_by_index", indexes=0)),
        device=None,
        num_epochs=3,
        callbacks=[lr_updater, KillAt()]
        + ([dict(type="ExponentialMovingAverage", decay=0.9, decay_base=5)] if use_ema else [])
        + [
            dict(type="Validation",
                 data_loader=dict(type="torch.utils.data.DataLoader", dataset=dict(type=NoisyBlobs, size=64, seed=1),
                                  batch_size=32),
                 batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
                 callbacks=[dict(type="MetricUpdater", metric_update_func=update_val, step_log_freq=0,
                                 epoch_log_freq=1, log_prefix="Validation ")],
                 val_interval=1, log_interval=0),
            dict(type="Checkpoint", save_dir=ckpt_dir, interval_by="step", save_interval=2),
        ],
        val_metrics=[dict(type="Accuracy")],
    )
''')


def write_config(directory: pathlib.Path) -> pathlib.Path:
    path = directory / "resume_cfg.py"
    path.write_text(CONFIG)
    return path


def hat_train(config: pathlib.Path, work_dir: pathlib.Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``bin/hat-train`` in a new process and wait for it."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir), *args],
        cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(timeout), env={**os.environ, **(env or {})},
    )


def popen_train(config: pathlib.Path, work_dir: pathlib.Path, *args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir), *args],
        cwd=work_dir.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env},
    )


def step_file(work_dir: pathlib.Path, step: int) -> pathlib.Path:
    found = glob.glob(str(work_dir / "checkpoints" / f"checkpoint-step-{step}-*.pth.tar"))
    assert len(found) == 1, (step, found)
    return pathlib.Path(found[0])


def load(path: pathlib.Path) -> dict:
    return torch.load(path, weights_only=True)


def _flat(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def differences(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """Keys (flattened) whose values are not bitwise equal; ``ignore`` lists key prefixes."""
    fa, fb = dict(_flat(a)), dict(_flat(b))
    out = []
    for key in sorted(set(fa) | set(fb)):
        if any(key.startswith(p) for p in ignore):
            continue
        x, y = fa.get(key, "<missing>"), fb.get(key, "<missing>")
        same = torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else (
            type(x) is type(y) and x == y)
        if not same:
            out.append(key)
    return out


_STRAIGHT: dict[str, pathlib.Path] = {}


def straight_run(variant: str) -> pathlib.Path:
    """Work dir of an uninterrupted run of the config's ``variant`` (cached per test process)."""
    if variant not in _STRAIGHT:
        _STRAIGHT[variant] = _run_straight(variant)
    return _STRAIGHT[variant]


def _run_straight(variant: str) -> pathlib.Path:
    base = pathlib.Path(tempfile.mkdtemp(prefix="hat-straight-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    config = write_config(base)
    work_dir = base / "wd"
    done = hat_train(config, work_dir, env={"RESUME_VARIANT": variant})
    assert done.returncode == 0, done.stderr[-3000:]
    return work_dir
