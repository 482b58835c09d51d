"""What ``hat-train`` and ``hat-predict`` share: arguments, logging, seeding, work dirs, reports.

This package is the only place in hat-ignite that reads ``sys.argv``, configures logging, seeds
the random generators or touches signal handling.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import traceback
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from hat_ignite.config import Config
from hat_ignite.errors import ConfigError, HatIgniteError

__all__ = [
    "CliError", "make_parser", "load_config", "build_stage", "run_main", "setup_logging", "attach_log_file",
    "teardown_logging",
    "seed_everything", "WorkDir", "write_metrics", "describe_engine", "loss_value",
]

logger = logging.getLogger("hat_ignite.cli")

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class CliError(Exception):
    """A failure to report as one paragraph, without a traceback (unless ``--debug``)."""


# -- arguments --------------------------------------------------------------------------------
def _stages_line(argv: Sequence[str]) -> str:
    """A line listing the stages of the config named in ``argv``, for ``--help``."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("config", nargs="?")
    known, _ = peek.parse_known_args(list(argv))
    if not known.config:
        return "Stages: give CONFIG before --help to list the stages it defines."
    try:
        stages = Config.fromfile(known.config).stages()
    except ConfigError as exc:
        return f"Stages: cannot list them, the config does not load: {exc}"
    listing = "; ".join(f"{name} ({', '.join(keys)})" for name, keys in stages.items()) or "none found"
    return f"Stages in {known.config}: {listing}."


def make_parser(prog: str, description: str, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The arguments both commands take; ``--help`` lists the stages of the given config.

    The config is read for the stage list only when help is asked for, so a normal run executes
    the config file once.
    """
    stages_line = _stages_line(argv) if {"-h", "--help"} & set(argv) else None
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=stages_line,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="path of the .py config file")
    parser.add_argument("--stage", default="float", help="stage to run: its {stage}_trainer / {stage}_predictor key (default: float)")
    parser.add_argument(
        "--opts", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config values, e.g. float_trainer.num_epochs=3 'model.hidden_features=[64, 64]'",
    )
    parser.add_argument("--work-dir", help="directory for logs, checkpoints and metrics (default: the config's work_dir)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug log lines")
    return parser


def load_config(path: str, opts: Sequence[str], work_dir: str | None) -> tuple[Config, str]:
    """Load the config, apply ``--opts``, and settle the work dir.

    The work dir is ``--work-dir``, else the config's ``work_dir`` key, else
    ``./work_dirs/<config name>``. When it differs from the ``work_dir`` the file sets, every
    string of the config at or under the file's ``work_dir`` (checkpoint dirs ...) moves with it.

    Returns:
        The config and the absolute work dir.
    """
    cfg = Config.fromfile(path)
    file_work_dir = cfg.get("work_dir")
    cfg.merge_opts(opts)
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
def run_main(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    """Run ``body(argv)``; turn any failure into one paragraph on stderr and a non-zero exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        return body(args)
    except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:  # the command's last line of defence: report, never a bare traceback
        if debug:
            traceback.print_exc()
        text = str(exc) if isinstance(exc, (CliError, HatIgniteError)) else f"{type(exc).__name__}: {exc}"
        hint = "" if debug else " (run again with --debug for the traceback)"
        print(f"{prog}: error: {text}{hint}", file=sys.stderr)
        return 1
    finally:
        teardown_logging()


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
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(_FORMAT, "%H:%M:%S"))
    _add(console)
    _add(_Buffer())


def attach_log_file(path: str) -> None:
    """Start writing the log to ``path`` (appending), with the records buffered so far."""
    root = logging.getLogger()
    buffers = [h for h in root.handlers if isinstance(h, _Buffer)]
    if _rank() != 0:
        return
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
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
        handler.close()
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
    """Creates the work dir late, and removes it again if this run created it and then failed.

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

    def create(self) -> None:
        """Create the directory (no-op when it exists)."""
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise CliError(f"work dir {self.path} exists and is not a directory; pass another --work-dir.")
        os.makedirs(self.path, exist_ok=True)

    def discard(self) -> None:
        """Remove the directory if this run created it (anything inside is this run's)."""
        if not self.existed and os.path.isdir(self.path):
            shutil.rmtree(self.path, ignore_errors=True)

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
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
            data = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError) as exc:
            logger.warning("%s is unreadable (%s); writing a new one", path, exc)
    data[key] = _finite(dict(record))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


# -- describing an engine (--dry-run) -------------------------------------------------------
def _loader_text(loader: Any) -> str:
    try:
        length = f"{len(loader)} batches"
    except TypeError:
        length = "unknown length"
    batch_size = getattr(loader, "batch_size", None)
    dataset = getattr(loader, "dataset", None)
    extra = f", batch_size={batch_size}" if batch_size is not None else ""
    extra += f", dataset={dataset!r:.80}" if dataset is not None else ""
    return f"{type(loader).__name__} ({length}{extra})"


def describe_engine(engine: Any, stage_key: str) -> str:
    """Describe a built engine and the handlers each HAT event runs, in firing order.

    HAT callbacks are listed under the events of the hooks they override, in config-list order
    (the order they run in). Other handlers in ``callbacks`` are listed with the events they are
    registered on when the handler object itself is the registered callable.
    """
    from ignite.engine import Events

    from hat_ignite.callbacks.base import CallbackMixin
    from hat_ignite.engine.events import HOOK_EVENTS, HatEvents

    model = engine.model
    n_params = sum(p.numel() for p in model.parameters())
    out = [f"{stage_key}: {type(engine).__module__}.{type(engine).__qualname__}"]
    out.append(f"  model: {type(model).__name__} ({n_params:,} parameters)")
    for loader in getattr(engine, "data_loaders", None) or [engine.data_loader]:
        out.append(f"  data_loader: {_loader_text(loader)}")
    if engine.optimizer is not None:
        defaults = {k: v for k, v in engine.optimizer.defaults.items() if isinstance(v, (int, float, bool))}
        out.append(f"  optimizer: {type(engine.optimizer).__name__} {defaults}")
    processor = engine.batch_processor
    out.append(
        f"  batch_processor: {type(processor).__name__}(need_grad_update={getattr(processor, 'need_grad_update', '?')})"
    )
    limit = f"num_epochs={engine.num_epochs}" if engine.stop_by == "epoch" else f"num_steps={engine.num_steps}"
    out.append(f"  stop_by={engine.stop_by}, {limit}, device={engine.torch_device}")

    out.append("Handlers by event, in firing order (callbacks run in config-list order):")
    for hook, event in HOOK_EVENTS.items():
        names = engine.event_handlers(event)
        out.append(f"  {event.name} ({hook}):" + ("" if names else " -"))
        out.extend(f"    {n}. {name}" for n, name in enumerate(names, 1))
    ignite_events = [e for e in Events if e not in HatEvents and engine.event_handlers(e)]
    if ignite_events:
        out.append("Ignite events (engine bookkeeping and handlers attached to them):")
        for event in ignite_events:
            out.append(f"  {event.name}: " + ", ".join(engine.event_handlers(event)))
    registered = {name for event in HatEvents for name in engine.event_handlers(event)}
    unattached = [
        f"callbacks[{i}] {type(cb).__name__}" for i, cb in enumerate(engine.callbacks)
        if isinstance(cb, CallbackMixin) and cb.overridden_hooks()
        and not any(name.startswith(f"{type(cb).__qualname__}.") for name in registered)
    ]
    if unattached:
        out.append("Attached for each data loader while it runs: " + ", ".join(unattached))
    return "\n".join(out)
