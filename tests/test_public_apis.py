"""The engine replaces no private Ignite method but ``_fire_event``, and the bench measures the
TensorBoard point both ways.

TensorBoard scalars are written on the calling thread through tensorboardX's ``EventsWriter``
(see :mod:`hat_ignite.callbacks.tensorboard_scalars` for why the public ``add_summary`` path is not
used: its ``flush()`` does not wait for the writer's queue, so points written just before an
epoch-end flush could still be lost by a kill).
"""

from __future__ import annotations

import inspect
import pathlib

import pytest
from ignite.engine import Engine

from hat_ignite.engine import Calibrator, Predictor, Trainer

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("engine_class", [Trainer, Predictor, Calibrator])
def test_engines_replace_no_private_ignite_method_but_fire_event(engine_class):
    # _fire_event is kept on purpose (Ignite's debug f-string costs 2.6-2.9 µs a step, see
    # docs/benchmarks.md); any other private method of Ignite's Engine stays Ignite's
    replaced = [
        name for name, value in vars(Engine).items()
        if name.startswith("_") and not name.startswith("__") and callable(value)
        and inspect.getattr_static(engine_class, name) is not value
    ]
    assert replaced == ["_fire_event"]


def test_ignites_fire_event_is_still_the_one_the_engine_mirrors():
    # the engine's _fire_event repeats Ignite 0.5.x's handler loop; if Ignite changes it, re-read it
    source = inspect.getsource(Engine._fire_event)
    for line in (
        "self.last_event_name = event_name",
        "for func, args, kwargs in self._event_handlers[event_name]:",
        "kwargs.update(event_kwargs)",
        "if args and isinstance(args[0], weakref.ref):",
        "first, others = ((resolved_engine,), args[1:])",
        "first, others = (tuple(), args)",
        "func(*first, *(event_args + others), **kwargs)",
    ):
        assert line in source, f"Ignite's Engine._fire_event changed: {line!r} is gone"


# that the handlers are called as a bare Engine calls them: tests/test_ignite_compat.py


def test_the_bench_measures_a_tensorboard_point_both_ways():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_overhead.py"), "--tb-point", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| StepScalars") or line.startswith("| add_scalar")]
    assert len(rows) == 2 and all(float(row.split("|")[2].split()[0]) > 0 for row in rows)
