"""Start-up, time to first step and install size of hat-ignite: two trees side by side, or one alone.

Run from the repository root::

    .venv/bin/python bench/startup.py                  # before = main (git archive), after = this tree
    .venv/bin/python bench/startup.py --before REF     # any commit, branch, or a directory holding a tree
    .venv/bin/python bench/startup.py --before none    # this tree alone (one column)
    .venv/bin/python bench/startup.py --quick          # a smoke run (tests/test_bench.py): numbers meaningless
    .venv/bin/python bench/startup.py --install-size   # also: what `pip install TREE` brings (minutes)

Both trees run with this Python and its packages (only ``PYTHONPATH`` differs), one command of
each tree after the other, round after round, so that both see the same machine load; every
figure is the median over the rounds with its range. The figures:

* ``python -c 'import torch'`` and ``python -c 'import torch, ignite.engine'``: the floor any
  Ignite program pays (the same for every tree), and the same with one SGD optimizer built,
  whose first ``add_param_group`` makes torch import ``torch._dynamo`` (any torch training pays it);
* ``python -c 'import hat_ignite'`` and ``hat-train CONFIG --help``;
* the shipped config (``configs/classification/digits_mlp.py``, stage ``float``) trained through
  ``bin/hat-train``: the time from the command's start to its first step, the training itself
  (first step to the loop's end), the time after the last step (loop end to the process's exit)
  and the whole wall time. The moments come from a plain HAT-style callback appended to the
  config (``bench/startup_clock.py``); "first step over the floor" subtracts the same round's
  ``import torch, ignite.engine``. Each also in CPU time (``time.process_time()`` of the process
  at that moment), which a loaded machine disturbs far less than the wall clock;
* the same config with ``type="DistributedDataParallelTrainer"`` and no process option (one
  process): the same moments, and whether its step ran in the command's own process;
* ``-X importtime`` of one run of each command: where the import time goes, summed per
  top-level package (each module's own time, so no package is counted twice);
* with ``--install-size``: each tree installed with ``pip install TREE`` (no extras) into a
  throwaway venv under ``--scratch``, after torch as ``scripts/setup.sh`` installs it, the size of
  every installed distribution read from its RECORD, with and without torch; the venvs are
  deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
CONFIG = os.path.join("configs", "classification", "digits_mlp.py")
TIMEOUT = 600
FLOOR = "`python -c 'import torch, ignite.engine'` (the floor)"


# -- the two trees ----------------------------------------------------------------------------
def export_tree(ref: str, dest: str) -> str:
    """A copy of ``ref`` to run: a directory as it is, else ``git archive`` of the commit into ``dest``."""
    if os.path.isdir(ref):
        return os.path.abspath(ref)
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return dest


def trees_to_measure(before: str, after: str, scratch: str) -> dict[str, str]:
    """``{"before: REF": path, "after: REF": path}``: each ref exported under ``scratch`` (a directory
    as it is); with ``before="none"`` the after tree alone, as ``{"this tree: REF": path}``."""
    if before == "none":
        return {f"this tree: {describe(after)}": export_tree(after, os.path.join(scratch, "after"))}
    return {
        f"before: {describe(before)}": export_tree(before, os.path.join(scratch, "before")),
        f"after: {describe(after)}": export_tree(after, os.path.join(scratch, "after")),
    }


def describe(ref: str) -> str:
    if os.path.isdir(ref):
        return ref
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", ref], capture_output=True, text=True)
    return f"{ref} ({sha.stdout.strip()})" if sha.returncode == 0 else ref


def tree_env(tree: str) -> dict[str, str]:
    """The environment a tree's commands run in: the tree first on the path, then bench/ (the clock)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([tree, BENCH])
    return env


def clock_config(tree: str, dest: str, clock_file: str, ddp: bool) -> str:
    """The tree's shipped config, plus the clock callback (and the DDP type with ``ddp``), at ``dest``."""
    with open(os.path.join(tree, CONFIG)) as f:
        text = f.read()
    if ddp:
        text = text.replace('type="Trainer"', 'type="DistributedDataParallelTrainer"', 1)
    text += ("\nfloat_trainer['callbacks'] = list(float_trainer['callbacks']) + "
             f"[dict(type='startup_clock.StartupClock', out_file={clock_file!r})]\n")
    with open(dest, "w") as f:
        f.write(text)
    return dest


# -- one measurement ---------------------------------------------------------------------------
def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(cmd: list[str], env: dict[str, str], cwd: str, output: bool = False) -> tuple[float, float]:
    """The wall time of one run of ``cmd``, and its CPU time: what it printed last with ``output``
    (its ``time.process_time()`` before it exits), else user + system time of all its processes."""
    t, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.PIPE if output else subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, timeout=TIMEOUT, text=True)
    elapsed, used = time.perf_counter() - t, _children_cpu() - cpu
    return elapsed, float(proc.stdout.split()[-1]) if output else used


def train_run(tree: str, scratch: str, ddp: bool, extra: list[str]) -> dict[str, float]:
    """Train the shipped config once through the tree's ``bin/hat-train``; the moments, in seconds."""
    run_dir = tempfile.mkdtemp(dir=scratch)
    clock_file = os.path.join(run_dir, "clock.jsonl")
    config = clock_config(tree, os.path.join(run_dir, "digits_mlp.py"), clock_file, ddp)
    cmd = [sys.executable, os.path.join(tree, "bin", "hat-train"), config, "--work-dir",
           os.path.join(run_dir, "work"), *extra]
    start, cpu = time.time(), _children_cpu()
    proc = subprocess.Popen(cmd, cwd=run_dir, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    _, err = proc.communicate(timeout=TIMEOUT)
    end, cpu = time.time(), _children_cpu() - cpu
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{err[-3000:]}")
    with open(clock_file) as f:
        moments = {m["moment"]: m for m in map(json.loads, f)}
    shutil.rmtree(run_dir, ignore_errors=True)
    first, last = moments["first_step"], moments["loop_end"]
    return {
        "first_step": first["t"] - start,
        "training": last["t"] - first["t"],
        "after": end - last["t"],
        "total": end - start,
        "cpu_first_step": first["cpu"],  # of the process that steps (a spawned rank: its own only)
        "cpu_total": cpu,  # every process of the command
        "in_process": float(first["pid"] == proc.pid),
        "spawn_line": float("Spawn function" in err),
    }


def importtime(cmd: list[str], env: dict[str, str], cwd: str) -> list[tuple[str, float, str]]:
    """``-X importtime`` of ``cmd``: ``(module, own seconds, phase)`` for every import, in order.

    The phase is ``start-up`` until the clock callback's ``first_step`` line, then ``training``,
    then ``end`` after its ``loop_end`` line (commands without the clock are all start-up).
    """
    proc = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    phase, rows = "start-up", []
    for line in proc.stderr.splitlines():
        if line.startswith("startup_clock: "):
            phase = "training" if line.endswith("first_step") else "end"
        elif line.startswith("import time:") and "self [us]" not in line:
            self_us, _cumulative, name = line[len("import time:"):].split("|", 2)
            rows.append((name.strip(), int(self_us) / 1e6, phase))
    return rows


def _by_package(rows: list[tuple[str, float, str]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for name, seconds, _phase in rows:
        root = name.split(".")[0]
        totals[root] = totals.get(root, 0.0) + seconds
    return totals


# -- tables ---------------------------------------------------------------------------------
def _cell(values: list[float]) -> str:
    values = sorted(values)
    return f"{statistics.median(values):.2f} [{values[0]:.2f}..{values[-1]:.2f}]"


def print_rows(title: str, rows: dict[str, dict[str, list[float]]], names: list[str]) -> None:
    print(f"\n### {title}\n")
    print("| figure, seconds: median [min..max] | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, by_tree in rows.items():
        cells = [_cell(by_tree[n]) if by_tree.get(n) else "—" for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")


def startup(trees: dict[str, str], rounds: int, epochs: int | None, scratch: str) -> None:
    py = sys.executable
    names = list(trees)
    extra = ["--opts", f"float_trainer.num_epochs={epochs}"] if epochs else []
    config_text = CONFIG if not epochs else f"{CONFIG} --opts float_trainer.num_epochs={epochs}"
    cpu_now = "; import time; print(time.process_time())"  # the CPU time as the clock reads it at the first step
    floor_cmds: dict[str, list[str]] = {
        "`python -c 'import torch'`": [py, "-c", "import torch" + cpu_now],
        FLOOR: [py, "-c", "import torch, ignite.engine" + cpu_now],
        "… and one SGD optimizer built (its first `add_param_group` imports `torch._dynamo`)": [
            py, "-c", "import torch, ignite.engine; torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)" + cpu_now],
    }
    rows: dict[str, dict[str, list[float]]] = {}

    def add(label: str, name: str, value: float) -> None:
        rows.setdefault(label, {}).setdefault(name, []).append(value)

    train_labels = {
        "first_step": "time to the first step", "training": "training (first step to loop end)",
        "after": "after the last step (loop end to exit)", "total": "whole command",
    }
    for _ in range(rounds):
        floor = floor_cpu = 0.0
        for label, cmd in floor_cmds.items():  # the same for every tree: one run a round, shown in every column
            value, cpu = wall(cmd, tree_env(ROOT), ROOT, output=True)
            if label == FLOOR:
                floor, floor_cpu = value, cpu
            for name in names:
                add(label, name, value)
                add(f"{label}, CPU time", name, cpu)
        for name, tree in trees.items():
            env = tree_env(tree)
            add("`python -c 'import hat_ignite'`", name, wall([py, "-c", "import hat_ignite"], env, tree)[0])
            add("`hat-train CONFIG --help`", name,
                wall([py, os.path.join(tree, "bin", "hat-train"), CONFIG, "--help"], env, tree)[0])
            for ddp in (False, True):
                run = train_run(tree, scratch, ddp, extra)
                kind = "one-process DDP stage" if ddp else "shipped config"
                for key, label in train_labels.items():
                    add(f"{kind}: {label}", name, run[key])
                add(f"{kind}: first step over the floor", name, run["first_step"] - floor)
                if ddp:
                    add(f"{kind}: CPU time of the whole command, all processes", name, run["cpu_total"])
                    add(f"{kind}: its step ran in the command's process (1 = yes)", name, run["in_process"])
                    add(f"{kind}: Ignite printed 'Spawn function' (1 = yes)", name, run["spawn_line"])
                else:
                    add(f"{kind}: CPU time to the first step", name, run["cpu_first_step"])
                    add(f"{kind}: CPU time to the first step over the floor's", name,
                        run["cpu_first_step"] - floor_cpu)
    order = [*floor_cmds, *(f"{k}, CPU time" for k in floor_cmds), "`python -c 'import hat_ignite'`",
             "`hat-train CONFIG --help`"]
    order += [k for k in rows if k not in order]
    print_rows(f"start-up, {rounds} interleaved rounds; CONFIG = `{config_text}`", {k: rows[k] for k in order}, names)


def _package_table(title: str, by_tree: dict[str, dict[str, float]], top: int, extra: dict[str, list[str]]) -> None:
    names = list(by_tree)
    packages = sorted({p for t in by_tree.values() for p in t}, key=lambda p: -max(t.get(p, 0) for t in by_tree.values()))
    print(f"\n### {title}\n")
    print("| package | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for package in packages[:top]:
        print(f"| {package} | " + " | ".join(f"{by_tree[n].get(package, 0.0):.3f}" for n in names) + " |")
    print("| all | " + " | ".join(f"{sum(by_tree[n].values()):.3f}" for n in names) + " |")
    for label, cells in extra.items():
        print(f"| {label} | " + " | ".join(cells) + " |")


def import_breakdown(trees: dict[str, str], epochs: int | None, scratch: str, top: int) -> None:
    """Where the import time goes: ``-X importtime`` of one run of each command, per tree, by phase.

    Each module's own time is summed per top-level package (so no package is counted twice);
    ``-X importtime`` itself slows imports down, so compare these sums with each other only.
    """
    py = sys.executable
    extra = ["--opts", f"float_trainer.num_epochs={epochs}"] if epochs else []
    floor = {name for name, _s, _p in importtime([py, "-c", "import torch, ignite.engine"], tree_env(ROOT), ROOT)}
    helps, starts, ends = {}, {}, {}
    beyond: list[str] = []
    for name, tree in trees.items():
        helps[name] = _by_package(importtime(
            [py, os.path.join(tree, "bin", "hat-train"), CONFIG, "--help"], tree_env(tree), tree))
        run_dir = tempfile.mkdtemp(dir=scratch)
        config = clock_config(tree, os.path.join(run_dir, "digits_mlp.py"), os.path.join(run_dir, "clock.jsonl"), False)
        rows = importtime([py, os.path.join(tree, "bin", "hat-train"), config, "--work-dir",
                           os.path.join(run_dir, "work"), *extra], tree_env(tree), run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        starts[name] = _by_package([r for r in rows if r[2] == "start-up"])
        ends[name] = _by_package([r for r in rows if r[2] == "end"])
        beyond.append(f"{sum(s for m, s, p in rows if p == 'start-up' and m not in floor):.3f}")
    note = "own import time per top-level package, seconds, one run under `-X importtime`"
    _package_table(f"imports of `hat-train CONFIG --help`: {note}", helps, top, {})
    _package_table(f"imports of the shipped config's run before its first step: {note}", starts, top,
                   {"of which modules `import torch, ignite.engine` does not import": beyond})
    _package_table(f"imports of the shipped config's run after its loop's end: {note}", ends, top, {})


# -- install size ---------------------------------------------------------------------------
_SIZES = r"""
import json, os, importlib.metadata as md
out = {}
for dist in md.distributions():
    total = 0
    for f in dist.files or []:
        p = dist.locate_file(f)
        if os.path.isfile(p):
            total += os.path.getsize(p)
    out[dist.metadata["Name"]] = total
print(json.dumps(out))
"""


def install_sizes(trees: dict[str, str], scratch: str, python: str, torch_spec: str, top: int) -> None:
    """``pip install TREE`` (no extras) into a fresh venv per tree; each distribution's size.

    torch is installed first as ``scripts/setup.sh`` installs it (``torch_spec``, the CPU wheel
    where the machine has one), so that ``pip install TREE`` keeps it rather than fetching a CUDA build.
    """
    sizes: dict[str, dict[str, int]] = {}
    for name, tree in trees.items():
        venv = tempfile.mkdtemp(prefix="venv-", dir=scratch)
        try:
            subprocess.run([python, "-m", "venv", venv], check=True)
            vpy = os.path.join(venv, "bin", "python")
            subprocess.run([vpy, "-m", "pip", "install", "--quiet", torch_spec], check=True, timeout=1800)
            subprocess.run([vpy, "-m", "pip", "install", "--quiet", tree], check=True, timeout=1800)
            got = subprocess.run([vpy, "-c", _SIZES], check=True, capture_output=True, text=True)
            sizes[name] = {k: v for k, v in json.loads(got.stdout).items() if k not in ("pip", "setuptools")}
        finally:
            shutil.rmtree(venv, ignore_errors=True)
    names = list(trees)
    mib = 1024 * 1024
    print(f"\n### install size: `pip install '{torch_spec}'`, then `pip install TREE`, into a fresh venv "
          f"(pip and setuptools left out), MiB\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    print("| distributions installed | " + " | ".join(str(len(sizes[n])) for n in names) + " |")
    print("| all | " + " | ".join(f"{sum(sizes[n].values()) / mib:.0f}" for n in names) + " |")
    print("| all but torch | " + " | ".join(
        f"{sum(v for k, v in sizes[n].items() if k != 'torch') / mib:.0f}" for n in names) + " |")
    dists = sorted({d for s in sizes.values() for d in s}, key=lambda d: -max(s.get(d, 0) for s in sizes.values()))
    for dist in dists[:top]:
        print(f"| {dist} | " + " | ".join(
            f"{sizes[n][dist] / mib:.1f}" if dist in sizes[n] else "—" for n in names) + " |")
    only = {n: sorted(set(sizes[n]) - set().union(*(sizes[m] for m in names if m != n))) for n in names}
    for n in names:
        print(f"\nonly in {n}: {', '.join(only[n]) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main",
                        help="the tree to compare with: a git ref or a directory (default main); none: this tree alone")
    parser.add_argument("--after", default=ROOT, help="the tree measured after (default: this tree)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--epochs", type=int, default=None, help="train this many epochs instead of the config's 20")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 epoch (numbers meaningless)")
    parser.add_argument("--install-size", action="store_true", help="also install each tree into a throwaway venv")
    parser.add_argument("--python", default="python3", help="the Python making the throwaway venvs (default python3)")
    parser.add_argument("--torch", default="torch==2.13.0",
                        help="what the throwaway venvs install as torch first (default torch==2.13.0, as scripts/setup.sh)")
    parser.add_argument("--scratch", default=None, help="where the trees, runs and venvs go (default: a temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.epochs = 1, 1
    scratch = tempfile.mkdtemp(prefix="hat-startup-", dir=args.scratch)
    try:
        trees = trees_to_measure(args.before, args.after, scratch)
        print(f"# start-up of hat-train, {time.strftime('%Y-%m-%d %H:%M')}, Python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs")
        startup(trees, args.rounds, args.epochs, scratch)
        import_breakdown(trees, args.epochs, scratch, top=12)
        if args.install_size:
            install_sizes(trees, scratch, args.python, args.torch, top=15)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
