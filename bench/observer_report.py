"""Calibration accuracy of HAT's calibration observers on a model with outlier activations.

Trains the digits MLP of ``configs/classification/digits_mlp.py`` (its float stage, through
``hat-train``), then calibrates it with each activation observer (``min_max``, ``percentile``,
``mse``, ``kl``, ``mix``) on the same 640 training images (10 steps of 64, the config's
calibration), twice: as they are, and with hot pixels (one pixel at 30 times full scale in
one image in 40, as a saturated sensor gives): those images make outliers in the input and in
every activation after it. For each run: the accuracy of the calibrated model, fake-quantized as
int8, on the 360 clean validation images (the float model's accuracy beside it), the range the
input quantizer took, and the time the 10 calibration steps took.

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "classification", "digits_mlp.py")
OBSERVERS = ("min_max", "percentile", "mse", "kl", "mix")
STEPS, BATCH = 10, 64
HOT_VALUE, HOT_EVERY = 30.0, 40


def train_float(work_dir: str, reuse: bool) -> str:
    """The float stage of the digits config through the CLI; returns the best float checkpoint."""
    ckpt = os.path.join(work_dir, "checkpoints", "float-checkpoint-best.pth.tar")
    if not (reuse and os.path.isfile(ckpt)):
        cmd = [sys.executable, os.path.join(ROOT, "bin", "hat-train"), CONFIG, "--stage", "float", "--work-dir", work_dir]
        print("$", " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, check=True)
    return ckpt


def calibration_batches(hot: bool) -> list:
    """The first 640 training images in a seeded order, as 10 batches; ``hot``: with hot pixels."""
    import torch

    from hat_ignite.data import DigitsDataset

    data = DigitsDataset(split="train", val_ratio=0.2, seed=0)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))[: STEPS * BATCH]
    images = torch.stack([data[int(i)]["img"] for i in order])
    labels = torch.tensor([int(data[int(i)]["labels"]) for i in order])
    if hot:
        g = torch.Generator().manual_seed(1)
        rows = torch.arange(0, len(images), HOT_EVERY)
        images[rows, torch.randint(0, images.shape[1], (len(rows),), generator=g)] = HOT_VALUE
    return [{"img": images[i:i + BATCH], "labels": labels[i:i + BATCH]} for i in range(0, len(images), BATCH)]


def calibrate(observer: str, float_ckpt: str, batches: list) -> tuple[object, float]:
    """A Calibrator run with ``observer``; returns the calibrated model and the seconds its steps took."""
    from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
    from hat_ignite.engine import BasicBatchProcessor
    from hat_ignite.engine.calibrator import Calibrator
    from hat_ignite.models import MLPClassifier
    from hat_ignite.quantization import Float2Calibration, ModelConvertPipeline

    calibrator = Calibrator(
        model=MLPClassifier(in_features=64, hidden_features=128, num_classes=10), data_loader=batches,
        batch_processor=BasicBatchProcessor(need_grad_update=False), num_steps=STEPS,
        model_convert_pipeline=ModelConvertPipeline(
            converters=[LoadCheckpoint(float_ckpt), Float2Calibration(example_inputs=batches[0], modules=["net"])],
            qconfig_params=dict(activation_calibration_observer=observer),
        ),
    )
    start = time.perf_counter()
    calibrator.fit()  # the ranges are written at its end
    return calibrator.model, time.perf_counter() - start


def accuracy(model, val: dict) -> float:
    import torch

    with torch.no_grad():
        return float((model.eval()(val).argmax(dim=1) == val["labels"]).float().mean())


def input_range(model) -> str:
    observed = model.net.graph.activation_post_process_0.activation_post_process
    return f"[{float(observed.min_val):.2f}, {float(observed.max_val):.2f}]"


def measure(float_ckpt: str) -> str:
    import torch

    sys.path.insert(0, ROOT)
    from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
    from hat_ignite.data import DigitsDataset
    from hat_ignite.models import MLPClassifier

    torch.set_num_threads(1)
    data = DigitsDataset(split="val", val_ratio=0.2, seed=0)
    val = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    float_model = LoadCheckpoint(float_ckpt)(MLPClassifier(in_features=64, hidden_features=128, num_classes=10))
    rows = []
    for observer in OBSERVERS:
        cells = []
        for hot in (False, True):
            model, seconds = calibrate(observer, float_ckpt, calibration_batches(hot))
            cells.append((accuracy(model, val), input_range(model), seconds))
        (clean, clean_range, clean_s), (hot, hot_range, hot_s) = cells
        rows.append(f"| `{observer}` | {100 * clean:.2f} % | {clean_range} | {clean_s:.2f} s | "
                    f"{100 * hot:.2f} % | {hot_range} | {hot_s:.2f} s |")
    head = (
        f"float model: {100 * accuracy(float_model, val):.2f} % on the {len(data)} validation images; "
        f"int8 (fake-quantized) after 10 calibration steps of 64 training images; "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread\n\n"
        "| observer | clean: accuracy | input range | steps | hot pixels: accuracy | input range | steps |\n"
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
