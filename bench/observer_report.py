"""Calibration accuracy of HAT's calibration observers on a model with outlier activations.

Trains the digits MLP of ``configs/classification/digits_mlp.py`` (64 -> 128 -> 10, its float
stage, through ``hat-train``), then makes its hidden layer's activations outliers: two of the 128
hidden units are rescaled, the weights and bias into them multiplied by ``k`` and the weights out
of them divided by ``k``. ReLU is positively homogeneous, so the float model computes the same
logits for every ``k``, but those two channels' activations are ``k`` times the others' (the
channel-range imbalance that cross-layer equalization removes), and one per-tensor uint8 range
must hold both. The model is calibrated with each activation observer (``min_max``,
``percentile``, ``mse``, ``kl``, ``mix``) on the same 640 training images (10 steps of 64, the
config's calibration) and the fake-quantized int8 model's accuracy is measured on the 360
validation images, for ``k`` = 1 (the trained model), 100, 300 and 1000. Also: the hidden
activation's range at ``k`` = 300 and the time of the 10 calibration steps (``k`` = 1).

    python bench/observer_report.py [--work-dir work_dirs/observer_report] [--reuse]

Prints a Markdown table (the one in docs/quantization.md) and writes it to
WORK_DIR/observer_report.md. ``--reuse`` keeps a float checkpoint already in the work dir.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "classification", "digits_mlp.py")
OBSERVERS = ("min_max", "percentile", "mse", "kl", "mix")
FACTORS = (1.0, 100.0, 300.0, 1000.0)
OUTLIER_UNITS = (0, 1)
STEPS, BATCH = 10, 64


def train_float(work_dir: str, reuse: bool) -> str:
    """The float stage of the digits config through the CLI; returns the best float checkpoint."""
    ckpt = os.path.join(work_dir, "checkpoints", "float-checkpoint-best.pth.tar")
    if not (reuse and os.path.isfile(ckpt)):
        cmd = [sys.executable, os.path.join(ROOT, "bin", "hat-train"), CONFIG, "--stage", "float", "--work-dir", work_dir]
        print("$", " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, check=True)
    return ckpt


class OutlierChannels:
    """A converter: hidden units ``OUTLIER_UNITS`` of the MLP scaled by ``factor`` (same float function)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, model: Any) -> Any:
        import torch

        first, last = model.net[0], model.net[2]
        with torch.no_grad():
            for unit in OUTLIER_UNITS:
                first.weight[unit] *= self.factor
                first.bias[unit] *= self.factor
                last.weight[:, unit] /= self.factor
        return model


def calibration_batches() -> list:
    """The first 640 training images in a seeded order, as 10 batches of 64."""
    import torch

    from hat_ignite.data import DigitsDataset

    data = DigitsDataset(split="train", val_ratio=0.2, seed=0)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[: STEPS * BATCH]
    batch = torch.utils.data.default_collate([data[int(i)] for i in order])
    return [{"img": batch["img"][i:i + BATCH], "labels": batch["labels"][i:i + BATCH]}
            for i in range(0, STEPS * BATCH, BATCH)]


def mlp() -> Any:
    from hat_ignite.models import MLPClassifier

    return MLPClassifier(in_features=64, hidden_features=128, num_classes=10)


def calibrate(observer: str, float_ckpt: str, factor: float, batches: list) -> tuple[Any, float]:
    """A Calibrator run with ``observer``; returns the calibrated model and the seconds its steps took."""
    from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
    from hat_ignite.engine import BasicBatchProcessor
    from hat_ignite.engine.calibrator import Calibrator
    from hat_ignite.quantization import Float2Calibration, ModelConvertPipeline

    calibrator = Calibrator(
        model=mlp(), data_loader=batches, batch_processor=BasicBatchProcessor(need_grad_update=False),
        num_steps=STEPS,
        model_convert_pipeline=ModelConvertPipeline(
            converters=[LoadCheckpoint(float_ckpt), OutlierChannels(factor),
                        Float2Calibration(example_inputs=batches[0], modules=["net"])],
            qconfig_params=dict(activation_calibration_observer=observer),
        ),
    )
    start = time.perf_counter()
    calibrator.fit()  # the ranges are written at its end
    return calibrator.model, time.perf_counter() - start


def accuracy(model: Any, val: dict) -> float:
    import torch

    with torch.no_grad():
        return float((model.eval()(val).argmax(dim=1) == val["labels"]).float().mean())


def hidden_range(model: Any) -> str:
    """The range of the hidden activation (the second Linear's input)."""
    graph = model.net.graph
    name = next(n.target for n in graph.graph.nodes
                if n.op == "call_module" and "activation_post_process" in str(n.target)
                and any("relu" in str(a) for a in n.args))
    observed = graph.get_submodule(name).activation_post_process
    return f"[{float(observed.min_val):.1f}, {float(observed.max_val):.1f}]"


def measure(float_ckpt: str) -> str:
    import torch

    sys.path.insert(0, ROOT)
    from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
    from hat_ignite.data import DigitsDataset

    torch.set_num_threads(1)
    data = DigitsDataset(split="val", val_ratio=0.2, seed=0)
    val = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    batches = calibration_batches()
    floats = [accuracy(OutlierChannels(k)(LoadCheckpoint(float_ckpt)(mlp())), val) for k in FACTORS]
    calibrate("min_max", float_ckpt, 1.0, batches)  # warm-up: the first run imports and compiles
    rows = []
    for observer in OBSERVERS:
        cells, ranges, seconds = [], "", 0.0
        for k in FACTORS:
            model, took = calibrate(observer, float_ckpt, k, batches)
            cells.append(f"{100 * accuracy(model, val):.2f} %")
            seconds = took if k == 1.0 else seconds
            ranges = hidden_range(model) if k == 300.0 else ranges
        rows.append(f"| `{observer}` | {' | '.join(cells)} | {ranges} | {seconds:.2f} s |")
    same = "the same" if len(set(floats)) == 1 else "not the same: " + ", ".join(f"{100 * a:.2f} %" for a in floats)
    head = (
        f"float model: {100 * floats[0]:.2f} % on the {len(data)} validation images at every k ({same}); "
        f"int8 fake-quantized after 10 calibration steps of 64 training images; "
        f"{platform.machine()}, torch {torch.__version__}, 1 thread\n\n"
        "| observer | k = 1 | k = 100 | k = 300 | k = 1000 | hidden range, k = 300 | 10 steps, k = 1 |\n"
        "|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=os.path.join("work_dirs", "observer_report"))
    parser.add_argument("--reuse", action="store_true", help="keep a float checkpoint already in the work dir")
    args = parser.parse_args()
    work_dir = os.path.abspath(args.work_dir)
    table = measure(train_float(work_dir, args.reuse))
    with open(os.path.join(work_dir, "observer_report.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
