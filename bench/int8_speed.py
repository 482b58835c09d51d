"""CPU latency of a ResNet18-sized model at 224 px: float and int8, eager and through inductor.

Builds a torchvision-shaped ResNet18 (7x7 stem, max pool, four stages of two ``BasicBlock``s of
64-512 channels, 1000 classes; random weights, batch-norm statistics and int8 ranges taken from
generated images), takes it to int8 as the ``int_infer`` stage does (``Float2Calibration``,
calibration, ``QAT2Quantize``, ``save_quantized_model``) and times, per batch of 1 and of 32
images, with 1 thread and with every core (each in its own process):

* float32 eager; float32 under ``torch.compile`` (inductor defaults) and with ``freezing``;
* the int8 program as saved (``load_quantized_model(path, inductor=False)``: reference
  quantize/dequantize ops);
* the int8 program through inductor, as ``hat-predict --stage int_infer`` and
  ``load_quantized_model`` run it by default (:mod:`hat_ignite.quantization.inductor`).

Times are medians of interleaved rounds (each round times every variant once, in rotating
order). Also printed: the CPU's int8-relevant flags, the ISA oneDNN reports, compile times and
how close the int8 logits are to the float ones.

    python bench/int8_speed.py [--work-dir work_dirs/int8_speed] [--rounds 7] [--threads 1,ALL]

Prints a Markdown table and writes it to WORK_DIR/int8_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from typing import Any, Callable

from convnet_report import interleaved_medians  # the same interleaved timing as the conv-net report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 224
BATCH_SIZES = (1, 32)
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile")
ROWS = (
    ("float32 eager", "float"),
    ("float32 `torch.compile`", "float_compiled"),
    ("float32 `torch.compile`, freezing", "float_frozen"),
    ("int8 program as saved", "int8_saved"),
    ("int8 through inductor (what `hat-predict -s int_infer` runs)", "int8_inductor"),
)


def resnet18(num_classes: int = 1000) -> Any:
    """torchvision's ResNet18 layer for layer (each ReLU its own module), built here."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu2 = nn.ReLU(inplace=True)
            self.downsample = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout else None
            )

        def forward(self, x: Any) -> Any:
            out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
            return self.relu2(out + (x if self.downsample is None else self.downsample(x)))

    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(3, 64, 7, 2, 3, bias=False)), ("bn1", nn.BatchNorm2d(64)),
        ("relu", nn.ReLU(inplace=True)), ("maxpool", nn.MaxPool2d(3, 2, 1)),
    ]
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        layers.append((f"layer{i + 1}", nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1))))
        cin = cout
    layers += [("avgpool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten(1)), ("fc", nn.Linear(512, num_classes))]
    return nn.Sequential(OrderedDict(layers))


def images(n: int, seed: int) -> Any:
    """``n`` generated 224 px RGB images: smooth random patterns, normalized like ImageNet inputs."""
    import torch
    from torch.nn import functional as F

    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 3, 14, 14, generator=g)
    x = F.interpolate(low, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    x = x + 0.05 * torch.randn(x.shape, generator=g)
    return (x - 0.45) / 0.25


def prepare(work_dir: str) -> dict[str, Any]:
    """Float model (BN statistics from generated images) -> calibrated int8 program, saved."""
    import torch
    from torch import nn

    sys.path.insert(0, ROOT)
    from hat_ignite.quantization import Float2Calibration, QAT2Quantize, observing, save_quantized_model

    torch.manual_seed(0)
    net = resnet18()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = None  # cumulative average over the batches below
    net.train()
    with torch.no_grad():
        for i in range(8):
            net(images(16, seed=i))
    net.eval()
    os.makedirs(work_dir, exist_ok=True)
    torch.save(net.state_dict(), os.path.join(work_dir, "float.pt"))
    model = nn.Sequential(OrderedDict(net=net))  # the model around the quantized network, as in HAT
    start = time.perf_counter()
    model = Float2Calibration(example_inputs=images(2, seed=100), modules=["net"])(model)
    prepared = time.perf_counter() - start
    with observing(model), torch.no_grad():
        for i in range(8):
            model(images(8, seed=200 + i))
    start = time.perf_counter()
    model = QAT2Quantize(inductor=False)(model)
    converted = time.perf_counter() - start
    path = save_quantized_model(model, os.path.join(work_dir, "int8.pt2"), images(2, seed=300))
    return {"prepare_s": prepared, "convert_s": converted, "pt2": path}


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name and which of :data:`INT8_FLAGS` it has (Linux ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return "unknown CPU", []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "unknown CPU")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return name, [f for f in INT8_FLAGS if f in flags]


def onednn_isa() -> str:
    """The ISA line oneDNN prints for its first primitive (``ONEDNN_VERBOSE=1``)."""
    code = "import torch; torch.nn.functional.conv2d(torch.rand(1, 64, 56, 56), torch.rand(64, 64, 3, 3))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, ONEDNN_VERBOSE="1"))
    line = next((ln for ln in out.stdout.splitlines() if ",info,cpu,isa:" in ln), "")
    return line.split("isa:", 1)[1].strip() if line else "(not reported)"


def measure(work_dir: str, threads: int, rounds: int) -> dict[str, Any]:
    """Time every variant at every batch size with ``threads`` intra-op threads (in this process)."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, ROOT)
    from hat_ignite.quantization import load_quantized_model

    net = resnet18()
    net.load_state_dict(torch.load(os.path.join(work_dir, "float.pt"), weights_only=True))
    net.eval()
    path = os.path.join(work_dir, "int8.pt2")
    int8_saved = load_quantized_model(path, inductor=False)
    int8_inductor = load_quantized_model(path, inductor=True)
    variants: dict[str, Callable] = {
        "float": net, "float_compiled": torch.compile(net), "int8_saved": int8_saved, "int8_inductor": int8_inductor,
    }
    # its own function: torch.compile(net) a second time would reuse the first one's compiled code
    frozen = torch.compile(lambda x: net(x))

    def float_frozen(x: Any) -> Any:
        with torch._inductor.config.patch(freezing=True):
            return frozen(x)

    variants["float_frozen"] = float_frozen
    compile_s = {}
    with torch.no_grad():  # compile each at the largest batch first (as a predictor's first batch)
        first = images(max(BATCH_SIZES), seed=1)
        for name, fn in variants.items():
            start = time.perf_counter()
            fn(first)
            compile_s[name] = time.perf_counter() - start
        ref = net(first)
        out = int8_inductor(first)
    cosine = torch.nn.functional.cosine_similarity(ref.flatten(1), out.flatten(1)).mean().item()
    agree = (ref.argmax(1) == out.argmax(1)).float().mean().item()
    load = os.getloadavg()[0]
    latency = {n: interleaved_medians(variants, images(n, seed=2), rounds) for n in BATCH_SIZES}
    runner = int8_inductor.inductor
    return {
        "threads": threads, "latency": latency, "first_call_s": compile_s, "cosine": cosine, "top1_agree": agree,
        "inductor_state": runner.state, "inductor_reason": runner.reason, "load": [load, os.getloadavg()[0]],
    }


def table(results: list[dict[str, Any]], info: dict[str, Any], rounds: int) -> str:
    import torch

    heads = [f"batch {b}, {r['threads']} thread{'s' if r['threads'] > 1 else ''}" for r in results for b in BATCH_SIZES]
    lines = ["| ResNet18, 224 px | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for label, key in ROWS:
        cells = []
        for r in results:
            for b in BATCH_SIZES:
                ms = 1000 * r["latency"][str(b)][key]
                speedup = r["latency"][str(b)]["float"] / r["latency"][str(b)][key]
                cells.append(f"{ms:.1f} ms ({speedup:.2f}×)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(×: float32 eager's time divided by the row's; above 1 is faster than float eager.)",
        f"Medians of {rounds} interleaved rounds; torch {torch.__version__}; {info['cpu']}, {os.cpu_count()} "
        f"CPU(s) visible, flags {', '.join(info['flags']) or 'none of ' + ', '.join(INT8_FLAGS)}; oneDNN ISA: "
        f"{info['isa']}; torch CPU capability {info['capability']}. 1-minute load average before and after "
        "the timed rounds: " + "; ".join(f"{r['threads']} thread(s) {r['load'][0]:.1f} / {r['load'][1]:.1f}"
                                          for r in results) + ".",
        f"Preparing took {info['prepare_s']:.0f} s, converting {info['convert_s']:.0f} s; first call "
        "(compile + run, batch 32): " + "; ".join(
            f"{r['threads']} thread(s): float {r['first_call_s']['float_compiled']:.0f} s, float frozen "
            f"{r['first_call_s']['float_frozen']:.0f} s, int8 {r['first_call_s']['int8_inductor']:.0f} s" for r in results
        ) + ".",
        f"int8 vs float logits (batch 32, generated images): cosine {results[0]['cosine']:.4f}, "
        f"top-1 agreement {100 * results[0]['top1_agree']:.0f} %.",
    ]
    for r in results:
        if r["inductor_state"] != "compiled":
            lines.append(f"int8 through inductor, {r['threads']} thread(s): {r['inductor_state']} ({r['inductor_reason']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=os.path.join("work_dirs", "int8_speed"))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                        help="comma-separated thread counts, each timed in its own process (default 1 and all cores)")
    parser.add_argument("--measure-threads", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        threads = sorted({int(t) for t in args.threads.split(",")})
    except ValueError:
        parser.error(f"--threads {args.threads!r}: give comma-separated integers, e.g. 1,4")
    if min(threads) < 1:
        parser.error("--threads: each count must be at least 1")
    work_dir = os.path.abspath(args.work_dir)
    if args.measure_threads:
        print(json.dumps(measure(work_dir, args.measure_threads, args.rounds)))
        return
    import torch

    info = prepare(work_dir)
    cpu, flags = cpu_info()
    info.update(cpu=cpu, flags=flags, isa=onednn_isa(), capability=torch.backends.cpu.get_cpu_capability())
    results = []
    for n in threads:
        cmd = [sys.executable, os.path.abspath(__file__), "--work-dir", work_dir, "--rounds", str(args.rounds),
               "--measure-threads", str(n)]
        print(f"$ {' '.join(cmd[1:])}", file=sys.stderr)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    text = table(results, info, args.rounds)
    with open(os.path.join(work_dir, "int8_speed.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
