"""What ``hat-train`` and ``hat-predict`` share: arguments, logging, seeding, work dirs, reports.

This package is the only place in hat-ignite that reads ``sys.argv``, configures logging, seeds
the random generators or touches signal handling.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from hat_ignite.cli.arguments import (
    export_hat_environment, make_parser, parse_arguments, prepare_config_imports, use_hat_alias,
)
from hat_ignite.cli.describe import describe_engine
from hat_ignite.cli.write_errors import LogFile, log_file_failures
from hat_ignite.config import Config
from hat_ignite.errors import ConfigError, HatIgniteError
from hat_ignite.regular_files import open_regular

__all__ = [
    "CliError", "make_parser", "parse_arguments", "export_hat_environment", "use_hat_alias", "load_config",
    "build_stage", "run_main", "setup_logging", "attach_log_file", "teardown_logging",
    "seed_everything", "WorkDir", "write_metrics", "describe_engine", "loss_value", "command_line",
    "log_file_failures", "dump_config",
]

logger = logging.getLogger("hat_ignite.cli")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class CliError(Exception):
    """A failure to report as one paragraph, without a traceback (unless ``--debug``)."""


# -- arguments --------------------------------------------------------------------------------
def load_config(
    path: str, opts: Sequence[str], work_dir: str | None, hat_alias: bool = True, overwrite: bool = True,
) -> tuple[Config, str]:
    """Load the config, apply ``--opts``, and settle the work dir.

    The work dir is ``--work-dir``, else the config's ``work_dir`` key, else
    ``./work_dirs/<config name>``. When it differs from the ``work_dir`` the file sets, every
    string of the config at or under the file's ``work_dir`` (checkpoint dirs ...) moves with it.
    With ``hat_alias`` the config and the modules it imports may import from ``hat.*``
    (:func:`hat_ignite.hat_alias.install_hat_alias`); the config may import the modules of the
    directory the command runs from (:func:`~hat_ignite.cli.arguments.prepare_config_imports`). ``overwrite=False`` is HAT's
    ``--opts-overwrite False``: overrides of keys the config has are skipped.

    Returns:
        The config and the absolute work dir.
    """
    prepare_config_imports(hat_alias)
    cfg = Config.fromfile(path)
    file_work_dir = cfg.get("work_dir")
    cfg.merge_opts(opts, overwrite=overwrite)
    if work_dir is None:
        work_dir = cfg.get("work_dir")
    if work_dir is None:
        work_dir = os.path.join("work_dirs", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(work_dir, str) or not work_dir:
        raise ConfigError(f"{cfg.filename}: work_dir must be a path string, got {work_dir!r}.")
    if isinstance(file_work_dir, str) and file_work_dir:
        cfg.relocate_paths(file_work_dir, work_dir)
    cfg["work_dir"] = work_dir
    return cfg, os.path.abspath(work_dir)


# -- running ----------------------------------------------------------------------------------
def report_failure(prog: str, exc: BaseException, debug: bool) -> None:
    """Print a command's failure as one paragraph on stderr (after the traceback with ``debug``).

    Args:
        prog: how the line starts, e.g. ``"hat-train"`` or ``"hat-train (rank 1)"``.
        exc: the exception the command ended with (being handled, for the traceback).
        debug: print the traceback first, and no hint to rerun with ``--debug``.
    """
    if debug:
        traceback.print_exc()
    text = str(exc) if isinstance(exc, (CliError, HatIgniteError)) else f"{type(exc).__name__}: {exc}"
    hint = "" if debug else " (run again with --debug for the traceback)"
    print(f"{prog}: error: {text}{hint}", file=sys.stderr, flush=True)


def run_main(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    """Run ``body(argv)``; turn any failure into one paragraph on stderr and a non-zero exit."""
    from hat_ignite.hat_alias import hat_alias_installed, uninstall_hat_alias

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    alias_before = hat_alias_installed()  # a command run from Python leaves the import hook as it found it
    path_before = set(sys.path)  # ... and sys.path without the working directory it adds
    log_file_failures()
    try:
        code = body(args)
        failed = log_file_failures()
        if code == 0 and failed:
            print(f"{prog}: error: the run finished but its log could not be written: {'; '.join(failed)}. "
                  f"Free space for the work dir and look at the console output for the log.", file=sys.stderr)
            return 1
        return code
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:  # the command's last line of defence: report, never a bare traceback
        report_failure(prog, exc, debug)
        return 1
    finally:
        from hat_ignite.cli.workdir_lock import release_held_locks

        release_held_locks()
        teardown_logging()
        if not alias_before and hat_alias_installed():
            uninstall_hat_alias()
        _forget_working_directory(path_before)


def _forget_working_directory(path_before: set[str]) -> None:
    """Take off ``sys.path`` the working directory the command added to it (see
    :func:`~hat_ignite.cli.arguments.prepare_config_imports`)."""
    try:
        here = os.getcwd()
    except OSError:
        return
    if here not in path_before and here in sys.path:
        sys.path.remove(here)


def command_line(prog: str, argv: Sequence[str]) -> str:
    """``prog`` and ``argv`` as one shell-quoted line.

    >>> command_line("hat-train", ["cfg.py", "--work-dir", "a b"])
    "hat-train cfg.py --work-dir 'a b'"
    """
    import shlex

    return " ".join([prog, *map(shlex.quote, argv)])


def build_stage(cfg: Config, stage_key: str) -> Any:
    """Build the engine of ``cfg[stage_key]`` with the registry.

    Raises:
        CliError: the config does not build; the message names the config file and the key path.
    """
    node = cfg[stage_key]
    if "type" not in node:
        raise CliError(
            f"{cfg.filename}: {stage_key} has no 'type' key; set it to the engine to build, e.g. "
            f"type='Trainer' or type='Predictor'."
        )
    try:
        engine = cfg.build(stage_key)
    except ConfigError as exc:  # names the file and the key path already
        raise CliError(str(exc)) from exc
    except Exception as exc:  # a constructor failing for another reason than its arguments
        raise CliError(f"{cfg.filename}: building {stage_key} failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(engine, "fit", None)):
        raise CliError(
            f"{cfg.filename}: {stage_key} built a {type(engine).__name__}, which has no fit(); its "
            f"type must be an engine such as Trainer or Predictor."
        )
    return engine


class _Buffer(logging.Handler):
    """Holds log records until the work dir (and its log file) may be created."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_OWN = "_hat_ignite_cli"  # marks the handlers a command adds, so it removes exactly those


def _rank() -> int:
    for var in ("RANK", "LOCAL_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _add(handler: logging.Handler) -> None:
    setattr(handler, _OWN, True)
    logging.getLogger().addHandler(handler)


def setup_logging(debug: bool) -> None:
    """Log to stderr (rank 0 only) and buffer the records for the log file.

    Only the handlers added here are touched; :func:`teardown_logging` removes them again.
    """
    teardown_logging()
    root = logging.getLogger()
    setattr(root, _OWN + "_level", root.level)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    if _rank() != 0:
        _add(logging.NullHandler())
        return
    from hat_ignite.cli.progress import ConsoleHandler

    console = ConsoleHandler(sys.stderr)  # on a terminal, lines go around the progress bar
    console.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
    _add(console)
    _add(_Buffer())


def attach_log_file(path: str) -> None:
    """Start writing the log to ``path`` (appending), with the records buffered so far."""
    root = logging.getLogger()
    buffers = [h for h in root.handlers if isinstance(h, _Buffer)]
    if _rank() != 0:
        return
    try:
        handler = LogFile(path, mode="a", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot open the log file {path}: {exc.strerror or exc}. Check the free space and "
                       f"permissions of the work dir.") from exc
    handler.setFormatter(logging.Formatter(_FORMAT))
    for buf in buffers:
        for record in buf.records:
            handler.handle(record)
        root.removeHandler(buf)
    _add(handler)


def teardown_logging() -> None:
    """Remove and close the handlers :func:`setup_logging` added; restore the root level."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _OWN, False)]:
        root.removeHandler(handler)
        try:
            handler.close()
        except (OSError, ValueError):  # a console that went away; a log file reports its own failure
            pass
    level = getattr(root, _OWN + "_level", None)
    if level is not None:
        root.setLevel(level)
        delattr(root, _OWN + "_level")


def seed_everything(cfg: Config) -> None:
    """Seed python, numpy and torch from the config's ``seed`` (``None`` or absent: no seeding)."""
    seed = cfg.get("seed")
    if seed is None:
        logger.info("no seed in the config: the run is not reproducible")
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{cfg.filename}: seed must be an int or None, got {seed!r}.")
    from ignite.utils import manual_seed

    manual_seed(seed)
    logger.info("seed: %d", seed)


class WorkDir:
    """Creates the work dir late; a run that created it and then failed removes its empty folders.

    Args:
        path: the absolute work dir.

    >>> import tempfile
    >>> parent = tempfile.mkdtemp()
    >>> new = WorkDir(os.path.join(parent, "run"))
    >>> new.create(); os.path.isdir(new.path)
    True
    >>> new.discard(); os.path.exists(new.path)   # this run created it: removed
    False
    >>> old = WorkDir(parent)
    >>> old.discard(); os.path.isdir(parent)      # it existed before: left alone
    True
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.existed = os.path.exists(path)

    def create(self, lock_command: str | None = None) -> None:
        """Create the directory (no-op when it exists).

        Args:
            lock_command: when given, take the work dir's lock for the rest of the command
                (:mod:`hat_ignite.cli.workdir_lock`), recording this command line in it.

        Raises:
            CliError: the path is a file, the directory cannot be created, or another run
                holds its lock (naming that run's process id and host).
        """
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise CliError(f"work dir {self.path} exists and is not a directory; pass another --work-dir.")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot create the work dir {self.path}: {exc.strerror or exc}.") from exc
        if lock_command is not None:
            from hat_ignite.cli.workdir_lock import hold_work_dir

            try:
                hold_work_dir(self.path, lock_command)
            except OSError as exc:
                raise CliError(f"{exc.strerror or exc}. Check the free space and permissions of the work dir.") from exc

    def discard(self) -> None:
        """Undo what this run made of a work dir it created: its empty directories, nothing else.

        Building a stage creates directories (a checkpoint or TensorBoard folder), never files.
        Another run may have taken the same new dir since this run started and written into
        it, so files are never removed, and nothing at all while another run holds its lock.
        """
        if self.existed or not os.path.isdir(self.path):
            return
        from hat_ignite.cli.workdir_lock import held_by_another_run

        if held_by_another_run(self.path):
            return
        for folder, _, _ in os.walk(self.path, topdown=False):
            try:
                os.rmdir(folder)  # fails on a folder that holds anything
            except OSError:
                pass

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


def write_metrics(path: str, key: str, record: Mapping[str, Any]) -> None:
    """Store ``record`` under ``key`` in the JSON file ``path``, keeping the other keys.

    NaN/Inf values (a metric that saw no data) are written as ``null``. The file is replaced
    atomically; an unreadable old file is replaced, with a warning.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.json")
    >>> write_metrics(path, "float_train", {"accuracy": 0.97})
    >>> write_metrics(path, "float_predict", {"accuracy": float("nan")})
    >>> json.load(open(path))
    {'float_predict': {'accuracy': None}, 'float_train': {'accuracy': 0.97}}
    """
    data: dict[str, Any] = {}
    if os.path.exists(path):
        try:
            with open_regular(path) as f:
                loaded = json.load(f)
            data = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError) as exc:
            logger.warning("%s is unreadable (%s); writing a new one", path, exc)
    data[key] = _finite(dict(record))
    text = json.dumps(data, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n"
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise CliError(
            f"cannot write {path}: {exc.strerror or exc}; the previous {os.path.basename(path)} (if any) is "
            f"unchanged. Check the free space and permissions of {os.path.dirname(path)}."
        ) from exc


def dump_config(cfg: Config, path: str) -> None:
    """Write the resolved config to ``path``; a failed write names the file and leaves none behind.

    Raises:
        CliError: the file cannot be written (a full or read-only disk).
    """
    try:
        cfg.dump(path)
    except OSError as exc:
        try:
            os.remove(f"{path}.tmp{os.getpid()}")  # Config.dump's temporary file; the old copy is kept
        except OSError:
            pass
        raise CliError(f"cannot write the resolved config {path}: {exc.strerror or exc}. Check the free space "
                       f"and permissions of {os.path.dirname(path)}.") from exc


def _finite(value: Any) -> Any:
    """``value`` with NaN/Inf floats replaced by ``None`` (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def loss_value(losses: Any) -> float | None:
    """The sum of the loss tensors of the latest step (``engine.state.losses``), or ``None``.

    >>> import torch
    >>> loss_value([torch.tensor(0.5), torch.tensor([0.25, 0.25])]), loss_value({"a": torch.tensor(2.0)})
    (1.0, 2.0)
    >>> loss_value(None) is None
    True
    """
    import torch

    if isinstance(losses, torch.Tensor):
        return float(losses.detach().float().sum())
    items = losses.values() if isinstance(losses, Mapping) else losses
    if isinstance(items, (list, tuple)) or isinstance(losses, Mapping):
        values = [float(t.detach().float().sum()) for t in items if isinstance(t, torch.Tensor)]
        return sum(values) if values else None
    return None
