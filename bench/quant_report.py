"""Float vs int8 on the shipped digits config: validation accuracy and model size, measured.

Runs the real command-line stages (float -> calibration -> qat -> int_infer) in a work dir, then
measures both models: the float model (best float checkpoint) and the int8 model the int_infer
stage saved, each as a torch.export program (.pt2) and as the bytes of the tensors it holds.

    python bench/quant_report.py [--work-dir work_dirs/quant_report] [--reuse]

Prints a Markdown table (the one in README.md) and writes it to WORK_DIR/quant_report.md.
``--reuse`` skips stages whose output already exists in the work dir.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "classification", "digits_mlp.py")
STAGES = (
    ("hat-train", "float", "float-checkpoint-best.pth.tar"),
    ("hat-train", "calibration", "calibration-checkpoint-best.pth.tar"),
    ("hat-train", "qat", "qat-checkpoint-best.pth.tar"),
    ("hat-predict", "int_infer", "int_infer-model.pt2"),
)


def run_stages(work_dir: str, reuse: bool, config: str = CONFIG) -> dict[str, float]:
    """Run the four stages of ``config`` through the CLI; return each stage's wall time (s).

    With ``reuse``, a stage whose output is already in the work dir is skipped (and absent).
    """
    seconds = {}
    for tool, stage, output in STAGES:
        if reuse and os.path.isfile(os.path.join(work_dir, "checkpoints", output)):
            continue
        cmd = [sys.executable, os.path.join(ROOT, "bin", tool), config, "--stage", stage, "--work-dir", work_dir]
        print("$", " ".join(cmd[1:]), file=sys.stderr)
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        seconds[stage] = time.perf_counter() - start
    return seconds


def measure(work_dir: str) -> str:
    import torch

    sys.path.insert(0, ROOT)
    from hat_ignite.checkpoint.restore import LoadCheckpoint
    from hat_ignite.config import Config
    from hat_ignite.data import DigitsDataset
    from hat_ignite.quantization import load_quantized_model, save_quantized_model, tensor_bytes
    from hat_ignite.registry import build_from_cfg

    ckpts = os.path.join(work_dir, "checkpoints")
    metrics = json.load(open(os.path.join(work_dir, "metrics.json")))
    cfg = Config.fromfile(CONFIG)
    float_model = LoadCheckpoint(os.path.join(ckpts, "float-checkpoint-best.pth.tar"))(build_from_cfg(cfg["model"]))
    data = DigitsDataset(split="val")
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    float_pt2 = save_quantized_model(float_model, os.path.join(ckpts, "float-model.pt2"), batch)
    int8_path = os.path.join(ckpts, "int_infer-model.pt2")
    int8_model = load_quantized_model(int8_path)
    rows = []
    for name, model, pt2, acc in (
        ("float32", float_model.eval(), float_pt2, metrics["float_train"]["best"]["value"]),
        ("int8 after calibration", None, None, metrics["calibration_train"]["val_metrics"]["accuracy"]),
        ("int8 after QAT (`int_infer`)", int8_model, int8_path, metrics["int_infer_predict"]["metrics"]["accuracy"]),
    ):
        weights = f"{tensor_bytes(model) / 1024:.1f} KiB" if model is not None else "—"
        size = f"{os.path.getsize(pt2) / 1024:.1f} KiB" if pt2 else "—"
        rows.append(f"| {name} | {100 * acc:.2f} % | {weights} | {size} |")
    head = (
        "| model | val accuracy (360 images) | tensors | `.pt2` file |\n"
        "|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=os.path.join("work_dirs", "quant_report"))
    parser.add_argument("--reuse", action="store_true", help="skip stages whose output exists")
    args = parser.parse_args()
    work_dir = os.path.abspath(args.work_dir)
    run_stages(work_dir, args.reuse)
    table = measure(work_dir)
    with open(os.path.join(work_dir, "quant_report.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
