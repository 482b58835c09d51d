"""Float vs int8 on the shipped ResNet config: accuracy at every stage, model size, CPU latency.

Runs the real command-line stages of ``configs/classification/digits_resnet.py`` (float ->
calibration -> qat -> int_infer) in a work dir, then measures:

* validation accuracy (360 images) after float training, after calibration and after QAT (both
  simulated int8, fake quantization) and of the int8 program the ``int_infer`` stage saved;
* model size: bytes of the tensors each model holds and of its ``torch.export`` file (``.pt2``);
* CPU latency with one thread, per batch of 1 and of 64 images, medians of interleaved rounds
  (each round times every variant once, in rotating order): the float model eager and under
  ``torch.compile`` (inductor), and the int8 program as saved (reference quantize/dequantize
  ops) and through inductor as ``hat-predict`` runs it (int8 kernels, freezing; see
  ``hat_ignite.quantization.inductor``). A variant that cannot be built here is reported with
  the reason.

    python bench/convnet_report.py [--work-dir work_dirs/convnet_report] [--reuse] [--rounds 30]

Prints a Markdown table and writes it to WORK_DIR/convnet_report.md. ``--reuse`` skips stages
whose output already exists in the work dir.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

from quant_report import run_stages  # the same four CLI stages, of this config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "classification", "digits_resnet.py")
BATCH_SIZES = (1, 64)


def _compile(model: Any, batch: Any) -> tuple[Callable | None, str]:
    """``torch.compile(model)``, run once; ``(None, reason)`` when inductor cannot build it here."""
    import torch

    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(batch)
        return compiled, ""
    except Exception as exc:  # any build failure is reported, not fatal
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"


def interleaved_medians(variants: dict[str, Callable], batch: Any, rounds: int) -> dict[str, float]:
    """Median seconds per call of each variant; every round times each once, in rotating order."""
    import torch

    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for fn in variants.values():  # warm-up
            for _ in range(3):
                fn(batch)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                start = time.perf_counter()
                variants[name](batch)
                times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) for n, t in times.items()}


def measure(work_dir: str, rounds: int, stage_seconds: dict[str, float]) -> str:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, ROOT)
    from hat_ignite.checkpoint.restore import LoadCheckpoint
    from hat_ignite.config import Config
    from hat_ignite.data import DigitsImageDataset
    from hat_ignite.quantization import load_quantized_model, save_quantized_model, tensor_bytes
    from hat_ignite.hat_alias import install_hat_alias
    from hat_ignite.registry import build_from_cfg

    ckpts = os.path.join(work_dir, "checkpoints")
    metrics = json.load(open(os.path.join(work_dir, "metrics.json")))
    install_hat_alias()  # the config imports from hat.*, as HAT configs do
    cfg = Config.fromfile(CONFIG)
    float_model = LoadCheckpoint(os.path.join(ckpts, "float-checkpoint-best.pth.tar"))(build_from_cfg(cfg["model"])).eval()
    data = DigitsImageDataset(split="val", size=cfg["image_size"])
    batches = {n: {"img": data.images[:n], "labels": data.labels[:n]} for n in BATCH_SIZES}
    float_pt2 = save_quantized_model(float_model, os.path.join(ckpts, "float-model.pt2"), batches[64])
    int8_path = os.path.join(ckpts, "int_infer-model.pt2")
    int8_model = load_quantized_model(int8_path, inductor=False)  # the program as saved
    int8_inductor = load_quantized_model(int8_path)  # as hat-predict runs it: inductor, freezing

    eager = {"float32 eager": float_model, "int8 program (`int_infer`)": int8_model}
    compiled: dict[str, Callable] = {}
    notes = []
    fn, why = _compile(float_model, batches[1])
    if fn is None:
        notes.append(f"float32 `torch.compile`: inductor could not build it here ({why})")
    else:
        compiled["float32 `torch.compile`"] = fn
    with torch.no_grad():
        int8_inductor(batches[1])
    if int8_inductor.inductor.state == "compiled":
        compiled["int8 program, `torch.compile`"] = int8_inductor
    else:
        notes.append(f"int8 program, `torch.compile`: inductor could not build it here ({int8_inductor.inductor.reason})")
    variants = {**eager, **compiled}
    latency = {n: interleaved_medians(variants, batches[n], rounds) for n in BATCH_SIZES}

    acc = {
        "float": metrics["float_train"]["best"]["value"],
        "calibration": metrics["calibration_train"]["val_metrics"]["accuracy"],
        "qat": metrics["qat_train"]["best"]["value"],
        "int8": metrics["int_infer_predict"]["metrics"]["accuracy"],
    }

    def ms(name: str) -> list[str]:
        if name not in variants:
            return ["n/a"] * len(BATCH_SIZES)
        return [f"{1000 * latency[n][name]:.2f} ms" for n in BATCH_SIZES]

    def kib(nbytes: float) -> str:
        return f"{nbytes / 1024:.1f} KiB"

    rows = [
        ("float32 eager", f"{100 * acc['float']:.2f} %", kib(tensor_bytes(float_model)), kib(os.path.getsize(float_pt2)), *ms("float32 eager")),
        ("float32 `torch.compile`", "(same model)", "—", "—", *ms("float32 `torch.compile`")),
        ("int8 simulated, after calibration", f"{100 * acc['calibration']:.2f} %", "—", "—", "—", "—"),
        ("int8 simulated, after QAT (best epoch)", f"{100 * acc['qat']:.2f} %", "—", "—", "—", "—"),
        ("int8 program (`int_infer`)", f"{100 * acc['int8']:.2f} %", kib(tensor_bytes(int8_model)), kib(os.path.getsize(int8_path)), *ms("int8 program (`int_infer`)")),
        ("int8 program, `torch.compile`", "(same model)", "—", "—", *ms("int8 program, `torch.compile`")),
    ]
    head = (
        "| model | val accuracy (360 images) | tensors | `.pt2` file | CPU latency, batch 1 | CPU latency, batch 64 |\n"
        "|---|---|---|---|---|---|"
    )
    lines = [head] + ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    lines.append(
        f"Latency: 1 thread, median of {rounds} interleaved rounds, {torch.__version__}, "
        f"{os.cpu_count()} CPU(s) visible."
    )
    if stage_seconds:
        lines.append("Stage wall times: " + ", ".join(f"{k} {v:.0f} s" for k, v in stage_seconds.items()) + ".")
    lines += notes
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=os.path.join("work_dirs", "convnet_report"))
    parser.add_argument("--reuse", action="store_true", help="skip stages whose output exists")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds (default 30)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    work_dir = os.path.abspath(args.work_dir)
    seconds = run_stages(work_dir, args.reuse, CONFIG)
    table = measure(work_dir, args.rounds, seconds)
    with open(os.path.join(work_dir, "convnet_report.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
