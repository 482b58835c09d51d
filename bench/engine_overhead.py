"""What the engine costs per step, against a hand-written loop, a bare Ignite Engine and Lightning.

Run from the repository root::

    .venv/bin/python bench/engine_overhead.py            # the full table (a few minutes)
    .venv/bin/python bench/engine_overhead.py --quick    # a smoke run (seconds; numbers meaningless)

This machine's speed swings by 1.5-2x within seconds, so no figure is taken alone: every round
runs each variant once, interleaved (a b b+u c c10 c10f d e a b ...), and each variant is reported as
the median over rounds of its difference to the (a) and (b) run *of the same round*, with the
range (min..max) of those differences. All runs use one intra-op thread, the same model, the
same batches and one epoch; the per-step figure is the steady state inside the epoch (see
``bench/workloads.py``). Then: the start-up time of ``hat-train --help`` and of imports, and the
peak resident memory of each variant in a fresh process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import workloads  # noqa: E402
from workloads import (  # noqa: E402
    BREAKDOWN_VARIANTS, NEEDS_MODEL_OUTPUTS, VARIANTS, WORKLOADS, TimedBatches, lightning_available, make_batches,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = {"noop": 400, "mlp": 200, "cnn": 40}


def _ten_hat_style_callbacks() -> list:
    """(c10)'s ten callbacks written as HAT users write them: each subclasses a plain base with
    all thirteen hooks as no-ops (HAT's ``CallbackMixin``), has no ``attach``, and implements one
    step-level hook that counts its calls. Only the implemented hooks may cost anything."""

    def noop(self: object, **kwargs: object) -> None:
        pass

    hooks = ("on_loop_begin", "on_epoch_begin", "on_step_begin", "on_batch_begin", "on_forward_begin",
             "on_forward_end", "on_backward_begin", "on_backward_end", "on_optimizer_step_begin",
             "on_batch_end", "on_step_end", "on_epoch_end", "on_loop_end")
    base = type("HatCallbackBase", (), {hook: noop for hook in hooks})
    used = ("on_step_begin", "on_batch_begin", "on_backward_end", "on_batch_end", "on_step_end")

    def trivial(self: object, **kwargs: object) -> None:
        self.calls += 1  # type: ignore[attr-defined]

    return [type(f"HatTrivial{i}", (base,), {used[i % 5]: trivial, "calls": 0})() for i in range(10)]


def run_trainer_hat_style(workload: str, data: TimedBatches) -> None:
    """(c10) with :func:`_ten_hat_style_callbacks` instead of CallbackMixin subclasses."""
    from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

    model, opt = workloads.make_model(workload)
    if workload == "noop":
        processor = workloads._noop_processor()
    else:
        processor = BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    Trainer(model=model, data_loader=data, optimizer=opt, batch_processor=processor, device=None,
            num_epochs=1, callbacks=_ten_hat_style_callbacks()).fit()


BREAKDOWN_VARIANTS["c10h"] = ("(c10h) (c10) written as HAT callbacks (13 no-op base hooks, no attach)",
                              run_trainer_hat_style)
#: every row there is, before ``--variants`` narrows VARIANTS down
ALL_VARIANTS = {**VARIANTS, **BREAKDOWN_VARIANTS}


def variants_for(workload: str) -> list[str]:
    keys = [k for k in VARIANTS if not (k in NEEDS_MODEL_OUTPUTS and workload == "noop")]
    return [k for k in keys if k != "e" or lightning_available()]


def measure(workload: str, rounds: int, steps: int, warm: bool = True) -> dict[str, list[float]]:
    """µs/step of each variant, one list entry per round, runs interleaved round by round."""
    batches = make_batches(workload)
    keys = variants_for(workload)
    out: dict[str, list[float]] = {k: [] for k in keys}
    for k in keys if warm else ():  # one untimed run each: imports, allocator and caches warm
        VARIANTS[k][1](workload, TimedBatches(batches, min(steps, 20)))
    for _ in range(rounds):
        for k in keys:
            data = TimedBatches(batches, steps)
            VARIANTS[k][1](workload, data)
            out[k].append(data.per_step_us())
    return out


def _paired(xs: list[float], base: list[float]) -> str:
    diffs = sorted(x - b for x, b in zip(xs, base))
    return f"{statistics.median(diffs):+8.1f} [{diffs[0]:+.1f}..{diffs[-1]:+.1f}]"


def _low(xs: list[float]) -> float:
    """The 10th percentile of a variant's runs: its cost with the least interference."""
    return sorted(xs)[len(xs) // 10]


def print_step_table(workload: str, res: dict[str, list[float]], steps: int) -> None:
    print(f"\n### workload `{workload}` ({len(res['a'])} rounds, {steps} steps per run)\n")
    print("| variant | median µs/step | minus (a), median [min..max] | minus (b), median [min..max] "
          "| p10 minus p10 of (b) |")
    print("|---|---:|---:|---:|---:|")
    for k, xs in res.items():
        label = VARIANTS[k][0]
        print(f"| {label} | {statistics.median(xs):.1f} | {_paired(xs, res['a'])} | {_paired(xs, res['b'])} "
              f"| {_low(xs) - _low(res['b']):+.1f} |")
    if "d" in res and "bu" in res:  # the same metric work on both sides: what the engine adds around it
        print(f"\n(d) minus (b+u), paired median [min..max]: {_paired(res['d'], res['bu']).strip()}; "
              f"p10 minus p10: {_low(res['d']) - _low(res['bu']):+.1f}")


# -- start-up time ------------------------------------------------------------------------------
def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return time.perf_counter() - t


def startup(repeats: int, quick: bool) -> None:
    py = sys.executable
    hat_train = os.path.join(os.path.dirname(py), "hat-train")
    train_cmd = [hat_train, "--help"] if os.path.exists(hat_train) else [py, "-m", "hat_ignite.cli.train", "--help"]
    cmds = {
        "python -c 'import torch'": [py, "-c", "import torch"],
        "python -c 'import ignite.engine'": [py, "-c", "import ignite.engine"],
        "python -c 'import hat_ignite'": [py, "-c", "import hat_ignite"],
        "python -c 'import hat_ignite.engine, hat_ignite.callbacks'": [py, "-c", "import hat_ignite.engine, hat_ignite.callbacks"],
        "hat-train --help": train_cmd,
    }
    if quick:  # the three that the targets compare
        cmds = {k: v for k, v in cmds.items() if "torch" not in k and "callbacks" not in k}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(repeats):  # interleaved too
        for k, cmd in cmds.items():
            times[k].append(_wall(cmd))
    base = times["python -c 'import ignite.engine'"]
    print(f"\n### start-up ({repeats} runs each, interleaved)\n")
    print("| command | median s | minus `import ignite.engine`, median [min..max] |")
    print("|---|---:|---:|")
    for k, ts in times.items():
        diffs = sorted(t - b for t, b in zip(ts, base))
        print(f"| `{k}` | {statistics.median(ts):.3f} | {statistics.median(diffs):+.3f} [{diffs[0]:+.3f}..{diffs[-1]:+.3f}] |")


# -- peak memory ----------------------------------------------------------------------------------
def _peak_rss_mib() -> float:
    # VmHWM starts afresh at exec; ru_maxrss would carry the forking parent's peak over.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_child(workload: str, key: str, steps: int) -> None:
    """Run one variant in this (fresh) process and print its peak RSS in MiB."""
    torch.set_num_threads(1)
    ALL_VARIANTS[key][1](workload, TimedBatches(make_batches(workload), steps))
    print(f"{_peak_rss_mib():.1f}")


def peak_rss(workload: str, steps: int, keys: list[str]) -> None:
    print(f"\n### peak RSS, workload `{workload}` (one fresh process per variant)\n")
    print("| variant | peak RSS MiB | minus (b) MiB |")
    print("|---|---:|---:|")
    got = {}
    for k in keys:
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--rss-child", workload, k, "--steps", str(steps)],
            cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
        )
        got[k] = float(out.stdout.strip().splitlines()[-1])
    for k, mib in got.items():
        print(f"| {ALL_VARIANTS[k][0]} | {mib:.1f} | {mib - got['b']:+.1f} |")


def versions() -> str:
    import ignite

    parts = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"pytorch-ignite {ignite.__version__}"]
    if lightning_available():
        import pytorch_lightning

        parts.append(f"pytorch-lightning {pytorch_lightning.__version__}")
    return ", ".join(parts)


def tensorboard_point_cost(rounds: int, points: int) -> None:
    """µs of the calling thread per TensorBoard point of four scalars (the digits config's point).

    ``StepScalars`` (one ``Summary`` per point, written on the calling thread through
    tensorboardX's public ``EventsWriter`` into a file of its own, as the ``TensorBoard``
    callback writes) against four ``add_scalar`` calls on a ``SummaryWriter`` (its queue, feeder
    and logger threads); medians over ``rounds`` of ``points`` points each, the two interleaved.
    Making and closing the writers is outside the timed window.
    """
    import tempfile

    from tensorboardX import SummaryWriter

    from hat_ignite.callbacks.tensorboard_scalars import StepScalars

    tags = ("lr/group_0", "cls_loss", "accuracy", "loss/total")

    def step_scalars(logdir: str) -> float:
        scalars = StepScalars(logdir)
        start = time.perf_counter()
        for step in range(points):
            for i, tag in enumerate(tags):
                scalars.add(tag, 0.5 + i, step)
            scalars.write()
        elapsed = time.perf_counter() - start
        scalars.close()
        return elapsed

    def add_scalar(logdir: str) -> float:
        writer = SummaryWriter(logdir=logdir)
        start = time.perf_counter()
        for step in range(points):
            for i, tag in enumerate(tags):
                writer.add_scalar(tag, 0.5 + i, step)
        elapsed = time.perf_counter() - start
        writer.close()
        return elapsed

    results: dict[str, list[float]] = {"StepScalars (public EventsWriter, own file)": [], "add_scalar x4": []}
    for _ in range(rounds):
        for name, write in zip(results, (step_scalars, add_scalar)):
            with tempfile.TemporaryDirectory() as logdir:
                results[name].append(write(logdir) / points * 1e6)
    print(f"\n### TensorBoard point of {len(tags)} scalars ({rounds} rounds, {points} points per run, wall clock)\n")
    print("| writer | median µs/point [min..max] |\n|---|---:|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.1f} [{min(values):.1f}..{max(values):.1f}] |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of short runs, no warm-up, fewer start-up and memory rows")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per workload (default 25)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default per workload)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: noop,mlp,cnn")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time steps by the wall clock (default) or by this process's CPU time (robust to other load)")
    parser.add_argument("--variants", default=None, help="comma-separated subset of: " + ",".join(VARIANTS)
                        + "; breakdown rows, only when named: " + ",".join(BREAKDOWN_VARIANTS))
    parser.add_argument("--steps-only", action="store_true", help="only the per-step tables: no start-up or memory rows")
    parser.add_argument("--tb-point", action="store_true",
                        help="only the cost of a TensorBoard point (StepScalars against add_scalar)")
    parser.add_argument("--rss-child", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.clock == "cpu":
        workloads.CLOCK = time.process_time
    if args.variants:
        only = set(args.variants.split(",")) | {"a", "b"}  # the pairs every row is taken against
        unknown = only - set(VARIANTS) - set(BREAKDOWN_VARIANTS)
        if unknown:
            parser.error(f"--variants: unknown {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join([*VARIANTS, *BREAKDOWN_VARIANTS])}")
        VARIANTS.update({k: v for k, v in BREAKDOWN_VARIANTS.items() if k in only})
        for key in [k for k in VARIANTS if k not in only]:
            del VARIANTS[key]
    if args.rss_child:
        rss_child(*args.rss_child, steps=args.steps or 50)
        return
    rounds = args.rounds or (1 if args.quick else 25)
    if args.tb_point:
        tensorboard_point_cost(rounds, 20 if args.quick else 400)
        return
    print(f"# engine overhead — {datetime.datetime.now().isoformat(timespec='minutes')}")
    print(f"\n{versions()}; {platform.machine()}, {os.cpu_count()} CPUs, torch threads = {torch.get_num_threads()}, "
          f"clock: {'CPU time of the process' if args.clock == 'cpu' else 'wall'}")
    if not lightning_available():
        print("(e) skipped: pytorch-lightning is not installed (pip install -e '.[bench]').")
    for workload in args.workloads.split(","):
        steps = args.steps or (12 if args.quick else STEPS[workload])
        print_step_table(workload, measure(workload, rounds, steps, warm=not args.quick), steps)
    if args.steps_only:
        return
    startup(1 if args.quick else 7, args.quick)
    # the quick run measures the pair the memory target compares; the full run every variant
    peak_rss("mlp", 20 if args.quick else 200, ["b", "c"] if args.quick else variants_for("mlp"))


if __name__ == "__main__":
    main()
