"""The engine and the TensorBoard scalars use Ignite's and tensorboardX's public APIs only."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest
from ignite.engine import Engine

from hat_ignite.callbacks.tensorboard_scalars import StepScalars
from hat_ignite.engine import Calibrator, Predictor, Trainer
from hat_ignite.visualize.event_file import event_files, iter_events, read_scalars

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _private_attributes_of_others(path: pathlib.Path) -> list[str]:
    """``x._name`` reads in ``path`` where ``x`` is not ``self`` / ``cls`` (dunders aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_tensorboard_scalars_touch_no_private_tensorboardx_attribute():
    assert _private_attributes_of_others(ROOT / "hat_ignite" / "callbacks" / "tensorboard_scalars.py") == []


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


def test_step_scalars_reach_the_file_through_the_writer(tmp_path):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(tmp_path), max_queue=2)
    scalars = StepScalars(writer)
    for step in range(50):
        writer.add_scalar("queued", float(step), step)  # tensorboardX's own path, side by side
        scalars.add("loss/cls", float(-step), step)
        scalars.add("lr group 0", 0.5, step)
        scalars.flush()
    writer.close()  # tensorboardX writes its queue out on close (flush() does not wait for the queue)
    found = read_scalars(str(tmp_path))
    assert found["loss/cls"] == [(s, float(-s)) for s in range(50)]
    assert found["lr_group_0"] == [(s, 0.5) for s in range(50)]
    assert found["queued"] == [(s, float(s)) for s in range(50)]
    (path,) = event_files(str(tmp_path))
    events = list(iter_events(path))  # checks every record's checksum
    assert events[0].file_version == "brain.Event:2"
    assert sum(1 for e in events if e.HasField("summary") and len(e.summary.value) == 2) == 50  # one event a step


@pytest.mark.parametrize("writer_kwargs", [{"purge_step": 5}, {"write_to_disk": False}])
def test_step_scalars_with_a_purge_step_or_no_file(tmp_path, writer_kwargs):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(tmp_path), **writer_kwargs)
    scalars = StepScalars(writer)
    scalars.add("loss", 1.5, 7)
    scalars.flush()
    writer.close()
    if writer_kwargs.get("write_to_disk") is False:
        assert event_files(str(tmp_path)) == []
    else:
        (path,) = event_files(str(tmp_path))
        events = list(iter_events(path))
        assert [e.session_log.status for e in events if e.HasField("session_log")] == [1]  # START, at purge_step
        assert read_scalars(str(tmp_path)) == {"loss": [(7, 1.5)]}


def test_step_scalars_write_nothing_once_the_writer_is_closed(tmp_path):
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(tmp_path))
    scalars = StepScalars(writer)
    scalars.add("loss", 1.0, 0)
    scalars.flush()
    writer.close()
    scalars.add("loss", 2.0, 1)
    scalars.flush()  # no error, and the closed file is left as it was
    assert read_scalars(str(tmp_path)) == {"loss": [(0, 1.0)]}


def test_the_bench_measures_a_tensorboard_point_both_ways():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_overhead.py"), "--tb-point", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| StepScalars") or line.startswith("| add_scalar")]
    assert len(rows) == 2 and all(float(row.split("|")[2].split()[0]) > 0 for row in rows)
