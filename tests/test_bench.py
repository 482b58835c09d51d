"""The overhead benchmark runs end to end (``--quick``) and prints every table row; no timing is checked."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import ROOT, time_limit


def test_quick_benchmark_prints_every_variant_row():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_overhead.py"), "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=time_limit(400),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    rows = ["(a) hand-written loop", "(b) bare Ignite Engine", "(c) Trainer, no callbacks",
            "(c10) Trainer + 10 trivial callbacks", "(c10f) … each keeping its whole kwargs dict"]
    if importlib.util.find_spec("pytorch_lightning") is not None:
        rows.append("(e) PyTorch Lightning")
    else:
        assert "(e) skipped" in out
    tables = out.split("### ")
    for workload in ("noop", "mlp", "cnn"):
        table = next(t for t in tables if t.startswith(f"workload `{workload}`"))
        with_outputs = ["(b+u) (b) with the digits config's metric updates", "(d) Trainer + digits callbacks"]
        expected = rows + ([] if workload == "noop" else with_outputs)
        for row in expected:
            line = next((ln for ln in table.splitlines() if ln.startswith(f"| {row} |")), None)
            assert line is not None, (workload, row)
            assert line.count("|") == 6 and "[" in line, line  # median, paired medians [min..max], p10 difference
        if workload != "noop":
            assert "(d) minus (b+u), paired median [min..max]: " in table
    for command in ("`python -c 'import ignite.engine'`", "`python -c 'import hat_ignite'`", "`hat-train --help`"):
        assert f"| {command} |" in out
    rss = next(t for t in tables if t.startswith("peak RSS"))
    assert "| (b) bare Ignite Engine |" in rss and "| (c) Trainer, no callbacks |" in rss


def test_quick_startup_benchmark_prints_every_figure_for_this_tree():
    """bench/startup.py end to end on this tree alone (``--before none``: one column, no git needed;
    a second tree runs the same commands in a second column)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup.py"), "--quick", "--before", "none"],
        cwd=ROOT, capture_output=True, text=True, timeout=time_limit(400),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("### ")
    startup = next(t for t in tables if t.startswith("start-up"))
    for row in ("`python -c 'import torch, ignite.engine'` (the floor)", "`hat-train CONFIG --help`",
                "shipped config: time to the first step", "shipped config: CPU time to the first step over the floor's",
                "shipped config: after the last step (loop end to exit)",
                "one-process DDP stage: its step ran in the command's process (1 = yes)"):
        line = next((ln for ln in startup.splitlines() if ln.startswith(f"| {row} |")), None)
        assert line is not None, row
        assert line.count("|") == 3 and line.count("[") == 1, line  # one tree: median [min..max]
    assert f"| figure, seconds: median [min..max] | this tree: {ROOT} |" in startup
    in_process = next(ln for ln in startup.splitlines() if "its step ran in the command's process" in ln)
    assert in_process.endswith("| 1.00 [1.00..1.00] |")
    for title in ("imports of `hat-train CONFIG --help`", "imports of the shipped config's run before its first step",
                  "imports of the shipped config's run after its loop's end"):
        table = next(t for t in tables if t.startswith(title))
        assert "\n| all |" in table
        if "before its first step" in title:
            assert "| torch |" in table and "| of which modules `import torch, ignite.engine` does not import |" in table
