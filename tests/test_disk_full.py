"""A full disk at each writer of a run: the message names the file, no temporary file is left, the
exit code is non-zero, and nothing prints a bare traceback or a logging error per record.

The disk fills for real, as far as a process can see: ``RLIMIT_FSIZE`` set inside the process
(``resource.setrlimit``, with ``SIGXFSZ`` ignored) makes every write that grows a file past the
limit fail with ``EFBIG`` ("File too large"), the error a full disk gives as ``ENOSPC``, through
the same code paths. The whole-run tests use the shipped digits config with one more callback,
``LimitWrites``, which sets the limit at a chosen step (or at the loop's end, after the last
checkpoint), or make one file unwritable; the writers of a run's end are also driven one by one
in a subprocess, over a finished run, to show the previous file is kept whole.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "classification" / "digits_mlp.py"

LIMIT_WRITES = textwrap.dedent('''

    import logging as _logging
    import resource as _resource
    import signal as _signal
    from hat_ignite.callbacks import CallbackMixin


    class LimitWrites(CallbackMixin):
        """No file grows past LIMIT_BYTES from global step LIMIT_AT (or from the loop's end) on."""

        def _limit(self):
            _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
            hard = _resource.getrlimit(_resource.RLIMIT_FSIZE)[1]
            _resource.setrlimit(_resource.RLIMIT_FSIZE, (int(os.environ.get("LIMIT_BYTES", "0")), hard))

        def on_step_begin(self, global_step_id, **kwargs):
            if os.environ.get("LIMIT_AT") == str(global_step_id):
                self._limit()

        def on_loop_end(self, **kwargs):
            if os.environ.get("LIMIT_AT") == "end":
                self._limit()
                for _ in range(3):  # log lines the full disk refuses: reported once, not three times
                    _logging.getLogger("hat_ignite.tests").info("the disk is full from here on")


    if os.environ.get("LIMIT_AT") == "load":  # from the config's load on: before the resolved config is written
        LimitWrites()._limit()


    class BlockFile(CallbackMixin):
        """At the loop's end, a directory takes the place of BLOCK_PATH: writing that file fails."""

        def on_loop_end(self, **kwargs):
            if os.environ.get("BLOCK_PATH"):
                os.makedirs(os.environ["BLOCK_PATH"])


    def _add_custom(writer, step_id):  # a tb_update_funcs function: the callback makes a SummaryWriter for it
        writer.add_histogram("custom/weights", [float(step_id)] * 64, step_id)
        writer.flush()


    _drop = os.environ.get("DROP_CALLBACKS", "").split(",")
    float_trainer["callbacks"] = [LimitWrites(), BlockFile()] + [
        c for c in float_trainer["callbacks"] if c["type"] not in _drop
    ]
    if os.environ.get("TB_FUNCS"):
        for _cb in float_trainer["callbacks"]:
            if isinstance(_cb, dict) and _cb.get("type") == "TensorBoard":
                _cb["tb_update_funcs"] = [_add_custom]
''')


@pytest.fixture
def limited_config(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "digits_limited.py"
    path.write_text(DIGITS.read_text() + LIMIT_WRITES)
    return path


def _train(config: pathlib.Path, work_dir: pathlib.Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(config), "--work-dir", str(work_dir),
         "--opts", "float_trainer.num_epochs=2"],
        cwd=work_dir.parent, capture_output=True, text=True, timeout=time_limit(180), env={**os.environ, **env},
    )


def _temp_files(work_dir: pathlib.Path) -> list[str]:
    return [str(p) for p in work_dir.rglob("*") if ".tmp" in p.name]


def _no_storm(err: str) -> None:
    assert "Traceback" not in err and "Logging error" not in err and "Exception ignored" not in err, err[-3000:]


def test_a_full_disk_at_the_end_of_a_run_names_metrics_json_and_the_log_once(limited_config, tmp_path):
    work_dir = tmp_path / "wd"
    done = _train(limited_config, work_dir, {"LIMIT_AT": "end", "DROP_CALLBACKS": "TensorBoard"})
    assert done.returncode == 1
    _no_storm(done.stderr)
    assert done.stderr.count(f"error: cannot write the log file {work_dir / 'float_train.log'}: File too large") == 1
    assert (f"hat-train: error: training float_trainer finished and its checkpoints are saved, but cannot write "
            f"{work_dir / 'metrics.json'}: File too large") in done.stderr, done.stderr[-2000:]
    assert _temp_files(work_dir) == []
    assert not (work_dir / "metrics.json").exists()
    assert (work_dir / "checkpoints" / "float-checkpoint-last.pth.tar").is_file()  # the work itself is safe


def test_a_full_tensorboard_dir_names_the_event_file(limited_config, tmp_path):
    work_dir = tmp_path / "wd"
    done = _train(limited_config, work_dir, {"LIMIT_AT": "30", "DROP_CALLBACKS": "Checkpoint"})
    assert done.returncode == 1
    _no_storm(done.stderr)  # includes tensorboardX's exit hook, which would flush the full file again
    events = list((work_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    assert (f"training float_trainer failed at epoch_id=1, global_step_id=45: OSError: [Errno 27] File too large "
            f"(writing {events[0]})") in done.stderr, done.stderr[-2000:]
    assert _temp_files(work_dir) == []


def test_a_full_tensorboard_dir_with_a_summary_writer_fails_once(limited_config, tmp_path):
    # a tb_update_funcs function writes through the SummaryWriter the callback makes for it: its
    # file and the scalars file both fail, and neither tensorboardX's exit hook nor its logger
    # thread prints a traceback after the report
    work_dir = tmp_path / "wd"
    done = _train(limited_config, work_dir, {"LIMIT_AT": "30", "DROP_CALLBACKS": "Checkpoint", "TB_FUNCS": "1"})
    assert done.returncode == 1
    _no_storm(done.stderr)
    events = sorted((work_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 2  # the scalars file, then the SummaryWriter's
    assert "training float_trainer failed at epoch_id=1" in done.stderr, done.stderr[-2000:]
    assert "File too large (writing " in done.stderr and any(str(e) in done.stderr for e in events), done.stderr[-2000:]
    assert _temp_files(work_dir) == []


@pytest.mark.parametrize("which", ["config", "curves", "lineage"])
def test_each_writer_of_a_run_names_its_file_through_hat_train(limited_config, tmp_path, which):
    """The resolved config (written first), the curves PNG and lineage.json (written last) each fail
    in a real hat-train run: the file is named, no temporary file is left, the exit code is 1."""
    work_dir = tmp_path / "wd"
    env = {
        "config": {"LIMIT_AT": "load", "LIMIT_BYTES": "8000"},  # the log fits, the ~16 kB resolved config not
        "curves": {"LIMIT_AT": "end", "LIMIT_BYTES": "20000"},  # metrics.json fits, the ~70 kB PNG not
        "lineage": {"BLOCK_PATH": str(work_dir / "lineage.json")},  # an injected OSError at its write
    }[which]
    done = _train(limited_config, work_dir, env)
    assert done.returncode == 1, done.stderr[-2000:]
    _no_storm(done.stderr)
    expected = {
        "config": f"cannot write the resolved config {work_dir / 'float_train_config.py'}: File too large",
        "curves": f"cannot write the training curves {work_dir / 'float_training_curves.png'}: File too large",
        "lineage": f"cannot write {work_dir / 'lineage.json'}: Is a directory",
    }[which]
    assert "hat-train: error: " in done.stderr and expected in done.stderr, done.stderr[-2000:]
    assert _temp_files(work_dir) == []
    if which != "config":  # the training itself is safe
        assert (work_dir / "checkpoints" / "float-checkpoint-last.pth.tar").is_file()


END_WRITERS = textwrap.dedent('''
    import os, resource, signal, sys
    from hat_ignite.cli.common import CliError, dump_config
    from hat_ignite.cli.curves import write_run_curves
    from hat_ignite.cli.stages import record_lineage
    from hat_ignite.config import Config

    work, which, events = sys.argv[1], sys.argv[2], sys.argv[3]
    cfg = Config.fromfile(os.path.join(work, "float_train_config.py"))

    from types import SimpleNamespace
    from hat_ignite.callbacks.tensorboard import TensorBoard
    trainer = SimpleNamespace(callbacks=[TensorBoard(save_dir=events)])  # what write_run_curves reads
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        if which == "lineage":
            record_lineage(work, "float", "hat-train", "cfg.py", os.path.join(work, "float_train_config.py"), [], [])
        elif which == "config":
            dump_config(cfg, os.path.join(work, "float_train_config.py"))
        else:
            write_run_curves(trainer, work, "float")
    except CliError as exc:
        print(exc)
        sys.exit(1)
''')


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The work dir of one complete run of the shipped config, for each test to copy and write over."""
    work_dir = tmp_path_factory.mktemp("complete") / "wd"
    done = _train(DIGITS, work_dir, {})
    assert done.returncode == 0, done.stderr[-2000:]
    return work_dir


@pytest.mark.parametrize("which, name", [("lineage", "lineage.json"), ("config", "float_train_config.py"),
                                         ("curves", "float_training_curves.png")])
def test_each_end_of_run_writer_names_its_file_and_leaves_no_temp_file(complete_run, tmp_path, which, name):
    work_dir = tmp_path / "wd"
    shutil.copytree(complete_run, work_dir)
    before = (work_dir / name).read_bytes()
    script = tmp_path / "writer.py"
    script.write_text(END_WRITERS)
    run = subprocess.run([sys.executable, str(script), str(work_dir), which, str(work_dir / "tensorboard")],
                         capture_output=True, text=True, timeout=time_limit(120), env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert f"cannot write {'the resolved config ' if which == 'config' else 'the training curves ' if which == 'curves' else ''}" \
           f"{work_dir / name}: File too large" in run.stdout, run.stdout
    assert "Traceback" not in run.stderr
    assert _temp_files(work_dir) == []
    assert (work_dir / name).read_bytes() == before  # the previous file is kept whole


@pytest.fixture
def small_disk(tmp_path: pathlib.Path):
    """A real 256 KiB file system (tmpfs) mounted for the test: it fills as a disk does."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); a real full disk needs one")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True)


def test_a_checkpoint_write_on_a_full_disk_says_no_space_left(small_disk):
    """torch's zip writer reports some short writes as ``unexpected pos N vs M``: whatever the fill,
    the error says the device is full, names the file, keeps the previous checkpoint and leaves
    no temporary file."""
    import torch

    from hat_ignite.callbacks.checkpoint_io import atomic_save, load_checkpoint
    from hat_ignite.errors import CheckpointError

    target = small_disk / "float-checkpoint-last.pth.tar"
    atomic_save({"state_dict": {"w": torch.zeros(10)}}, target)  # the previous checkpoint
    payload = {"state_dict": {"w": torch.randn(40_000)}}  # about 160 KB: more than is left below
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    messages = []
    for left in range(0, 96 * 1024, 3 * 1024):  # bytes left free before the write
        filler = small_disk / "filler"
        with open(filler, "wb") as f:
            f.write(b"\0" * max(free - left - 64 * 1024, 0))  # with the old checkpoint's room kept free
        try:
            atomic_save(payload, target)
        except CheckpointError as exc:
            messages.append(str(exc))
        finally:
            filler.unlink()
        assert [p.name for p in small_disk.iterdir()] == [target.name]  # no temporary file left
        assert load_checkpoint(target)["state_dict"]["w"].shape == (10,)  # the previous one, whole
    assert len(messages) >= 20
    for message in messages:
        assert message.startswith(f"Could not write checkpoint {target}: no space left on the device"), message
