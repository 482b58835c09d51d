"""The engine replaces no private Ignite method; TensorBoard's scalars use only
tensorboardX's public API; the bench measures the TensorBoard point both ways.

TensorBoard scalars are written on the calling thread through an ``EventsWriter`` of their own,
tensorboardX's public synchronous writer, into a file of their own (see
:mod:`hat_ignite.callbacks.tensorboard_scalars` for why not through the ``SummaryWriter``).
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest
from ignite.engine import Engine

from hat_ignite.engine import Calibrator, Predictor, Trainer
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("engine_class", [Trainer, Predictor, Calibrator])
def test_engines_replace_no_private_ignite_method(engine_class):
    # Ignite fires its own events with its own Engine._fire_event (its per-event debug message
    # costs ≈ 2.7 µs a step on the no-op bench; docs/benchmarks.md)
    replaced = [
        name for name, value in vars(Engine).items()
        if name.startswith("_") and not name.startswith("__") and callable(value)
        and inspect.getattr_static(engine_class, name) is not value
    ]
    assert replaced == []


# that the handlers are called as a bare Engine calls them: tests/test_ignite_compat.py


def _private_uses(source: str) -> list[str]:
    """``obj._name`` attribute reads and ``getattr``/``hasattr``/``setattr`` of ``"_name"`` on
    anything but ``self``, and names imported with a leading underscore."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr") and len(node.args) > 1:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("_"):
                found.append(f"line {node.lineno}: {node.func.id}(..., {name.value!r})")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tensorboardX"):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_tensorboard_scalars_use_no_private_tensorboardx_attribute():
    # the scalars file goes through tensorboardX's public EventsWriter (write_event, flush, close)
    source = (ROOT / "hat_ignite" / "callbacks" / "tensorboard_scalars.py").read_text()
    assert _private_uses(source) == []
    for name in ("_ev_writer", "_lock", "_closed", "_worker", "_py_recordio_writer", "_file_name", "_event_queue"):
        assert name not in source, name
    # the check finds what the module did before
    old = "events = getattr(event_file_writer, '_ev_writer', None)\nclosed = event_file_writer._closed\n"
    assert _private_uses(old) == ["line 1: getattr(..., '_ev_writer')", "line 2: ._closed"]


def test_the_callback_s_other_tensorboard_modules_use_no_private_tensorboardx_attribute():
    for name in ("tensorboard.py", "tensorboard_history.py", "tensorboard_values.py"):
        assert _private_uses((ROOT / "hat_ignite" / "callbacks" / name).read_text()) == [], name


def test_the_bench_measures_a_tensorboard_point_both_ways():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_overhead.py"), "--tb-point", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=time_limit(120))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| StepScalars (public EventsWriter")
            or line.startswith("| add_scalar")]
    assert len(rows) == 2 and all(float(row.split("|")[2].split()[0]) > 0 for row in rows)
