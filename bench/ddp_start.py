"""Start-up and epoch start of a two-process stage: two trees side by side.

Run from the repository root, on an otherwise idle machine::

    .venv/bin/python bench/ddp_start.py --before REF      # REF: a commit, branch, or a directory
    .venv/bin/python bench/ddp_start.py --before REF --rounds 5 --epochs 3

The shipped config (``configs/classification/digits_mlp.py``) as a
``DistributedDataParallelTrainer``, its two loaders given ``num_workers=2`` as a HAT project's
are, trained through each tree's ``bin/hat-train --nproc 2`` for ``--epochs`` epochs, one command
of each tree after the other, round after round (the helpers of ``bench/startup.py``). Figures,
wall clock, median [min..max] over the rounds:

* time to the first step: from the command's start to the first step of the first rank;
* training: from that first step to the last rank's loop end; each epoch starts its loaders'
  worker processes (and the validation's), so how fast a rank starts them is in it;
* the whole command.

No CPU time is given: ranks forked from a ``forkserver`` are not the command's children, so
``RUSAGE_CHILDREN`` does not see them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from startup import CONFIG, ROOT, TIMEOUT, clock_config, print_rows, tree_env, trees_to_measure


def _config(tree: str, run_dir: str, clock_file: str) -> str:
    path = clock_config(tree, os.path.join(run_dir, "digits_mlp.py"), clock_file, ddp=True)
    with open(path) as f:
        text = f.read()
    train, val = "batch_size=batch_size, shuffle=True,", "batch_size=256, shuffle=False)"
    if train not in text or val not in text:
        raise RuntimeError(f"{CONFIG}: its training and validation DataLoaders are no longer written as expected")
    text = text.replace(train, train + " num_workers=2,").replace(val, val[:-1] + ", num_workers=2)")
    with open(path, "w") as f:
        f.write(text)
    return path


def ddp_run(tree: str, scratch: str, epochs: int) -> dict[str, float]:
    """One ``hat-train CONFIG --nproc 2`` run of the tree; its moments, in seconds."""
    run_dir = tempfile.mkdtemp(dir=scratch)
    clock_file = os.path.join(run_dir, "clock.jsonl")
    cmd = [sys.executable, os.path.join(tree, "bin", "hat-train"), _config(tree, run_dir, clock_file),
           "--work-dir", os.path.join(run_dir, "work"), "--nproc", "2", "--opts", f"float_trainer.num_epochs={epochs}"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=run_dir, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=TIMEOUT)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    with open(clock_file) as f:
        moments = [json.loads(line) for line in f]  # each rank writes its own
    shutil.rmtree(run_dir, ignore_errors=True)
    first = min(m["t"] for m in moments if m["moment"] == "first_step")
    last = max(m["t"] for m in moments if m["moment"] == "loop_end")
    return {"time to the first step": first - start, "training": last - first, "whole command": end - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="the tree to compare with: a git ref or a directory (default main)")
    parser.add_argument("--after", default=ROOT, help="the tree measured after (default: this tree)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs trained (default 3)")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="hat-ddp-start-")
    try:
        trees = trees_to_measure(args.before, args.after, scratch)
        rows: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                for label, value in ddp_run(tree, scratch, args.epochs).items():
                    rows.setdefault(label, {}).setdefault(name, []).append(value)
        print(f"# hat-train --nproc 2, {time.strftime('%Y-%m-%d %H:%M')}, Python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs")
        print_rows(f"{args.rounds} interleaved rounds; CONFIG = `{CONFIG}` as a DistributedDataParallelTrainer, "
                   f"num_workers=2, {args.epochs} epochs, `--nproc 2`", rows, list(trees))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
