"""HAT's generic helpers that user code imports next to HAT's engine, with HAT's signatures.

Served through the ``hat`` import alias (:mod:`hat_ignite.hat_alias`) as
``hat.utils.seed.seed_everything``, ``hat.utils.logger.init_logger``,
``hat.utils.apply_func.flatten`` / ``regroup``, ``hat.utils.model_helpers.get_binding_module`` /
``has_normalization``,
``hat.utils.hash.get_hash_file_if_hashed_and_local`` and
``hat.utils.package_helper.check_packages_available``. Nothing here runs on import or on the
engine's per-step path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import logging
import operator
import os
import re
import sys
import warnings
from typing import Any, Callable

from hat_ignite.regular_files import open_regular

__all__ = [
    "seed_everything", "init_logger", "flatten", "regroup", "get_binding_module", "has_normalization",
    "get_hash_file_if_hashed_and_local", "check_packages_available",
]

logger = logging.getLogger("hat_ignite.hat_utils")


# -- seed ----------------------------------------------------------------------------------------
def seed_everything(seed: int) -> int:
    """Seed Python's ``random``, numpy, torch (every CUDA device too) and ``PYTHONHASHSEED``.

    Returns the seed, as HAT's does.

    >>> import random
    >>> seed_everything(3) == 3 and random.random() == (seed_everything(3), random.random())[1]
    True
    """
    from ignite.utils import manual_seed  # random, numpy and torch (CUDA included)

    logger.info("Global seed set to %d", seed)
    manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    return seed


# -- logger --------------------------------------------------------------------------------------
class _Levels(logging.Filter):
    """Pass records at or above ``low`` and below ``high``."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__()
        self.low, self.high = low, high

    def filter(self, record: logging.LogRecord) -> bool:
        return self.low <= record.levelno < self.high


def init_logger(log_file: str, logger_name: str | None = None, rank: int = 0, level: int = logging.INFO,
                overwrite: bool = False, clean_handlers: bool = False, filter_warning: bool = False,
                set_stderr: bool = True, set_stdout: bool = True) -> None:
    """Send a logger's records to ``<log_file>.log`` (``<log_file>-rank<N>.log`` off rank 0) and the terminal.

    Each line reads ``time LEVEL [file:line] Node[rank] message``. Errors and worse go to
    stderr, the rest to stdout.

    Args:
        log_file: the file's path without its ``.log`` ending; its directory is made.
        logger_name: the logger to configure (``None``: the root logger).
        rank: the process's rank, in every line and in the file name.
        level: the logger's level.
        overwrite: delete an existing file first (otherwise lines are appended).
        clean_handlers: remove the logger's handlers first (calling twice otherwise doubles lines).
        filter_warning: ignore Python warnings and keep WARNING records off stdout.
        set_stderr, set_stdout: add the terminal handlers.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> init_logger(os.path.join(d, "train"), logger_name="demo", set_stdout=False, set_stderr=False)
    >>> logging.getLogger("demo").info("hello")
    >>> open(os.path.join(d, "train.log")).read().split("] ")[-1]
    'hello\\n'
    """
    path = f"{log_file}-rank{rank}.log" if rank != 0 else f"{log_file}.log"
    if overwrite and os.path.exists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    target = logging.getLogger(logger_name)
    if clean_handlers:
        for handler in list(target.handlers):
            target.removeHandler(handler)
    formatter = logging.Formatter(f"%(asctime)-15s %(levelname)s [%(filename)s:%(lineno)d] Node[{rank}] %(message)s")
    handlers: list[logging.Handler] = [logging.FileHandler(path)]
    if set_stderr:
        err = logging.StreamHandler(sys.stderr)
        err.addFilter(_Levels(logging.ERROR, sys.maxsize))
        handlers.append(err)
    if set_stdout:
        out = logging.StreamHandler(sys.stdout)
        out.addFilter(_Levels(0, logging.ERROR))
        if filter_warning:
            warnings.filterwarnings("ignore")
            out.addFilter(lambda record: record.levelno != logging.WARNING)
        handlers.append(out)
    for handler in handlers:
        handler.setFormatter(formatter)
        target.addHandler(handler)
    target.setLevel(level)


# -- flatten / regroup ---------------------------------------------------------------------------
def flatten(obj: Any) -> tuple[tuple[Any, ...], Any]:
    """The leaves of nested dicts / lists / tuples, in order, and the layout to :func:`regroup` them.

    The layout is HAT's: ``object`` for a leaf, ``(dict, ((key, layout), ...))`` for a dict and
    ``(list or tuple, (layout, ...))`` for a sequence.

    >>> flat, layout = flatten({"a": [1, (2, 3)], "b": 4})
    >>> flat
    (1, 2, 3, 4)
    >>> regroup(flat, layout)
    ({'a': [1, (2, 3)], 'b': 4}, 4)
    """
    if isinstance(obj, dict):
        leaves: list[Any] = []
        items = []
        for key, value in obj.items():
            sub, layout = flatten(value)
            leaves.extend(sub)
            items.append((key, layout))
        return tuple(leaves), (dict, tuple(items))
    if isinstance(obj, (list, tuple)):
        leaves, layouts = [], []
        for value in obj:
            sub, layout = flatten(value)
            leaves.extend(sub)
            layouts.append(layout)
        return tuple(leaves), (type(obj), tuple(layouts))
    return (obj,), object


def regroup(obj: Any, fmts: Any, obj_idx: int = 0) -> tuple[Any, int]:
    """Rebuild what :func:`flatten` flattened from ``obj[obj_idx:]``; return it and the next index.

    A namedtuple or another list / tuple subclass comes back as a plain ``list`` / ``tuple``, as
    in HAT.
    """
    if fmts is object:
        return obj[obj_idx], obj_idx + 1
    if not isinstance(fmts, (list, tuple)) or len(fmts) != 2:
        raise TypeError(f"regroup: {fmts!r} is not a layout made by flatten().")
    kind, parts = fmts
    if kind is dict:
        rebuilt: dict[Any, Any] = {}
        for key, layout in parts:
            rebuilt[key], obj_idx = regroup(obj, layout, obj_idx)
        return rebuilt, obj_idx
    if isinstance(kind, type) and issubclass(kind, (list, tuple)):
        values = []
        for layout in parts:
            value, obj_idx = regroup(obj, layout, obj_idx)
            values.append(value)
        return (tuple(values) if issubclass(kind, tuple) else values), obj_idx
    raise TypeError(f"regroup: unknown container type {kind!r} in the layout.")


# -- model helpers -------------------------------------------------------------------------------
def get_binding_module(model: Any) -> Any:
    """The module inside a ``DataParallel`` / ``DistributedDataParallel`` wrapper, else ``model``.

    >>> import torch
    >>> net = torch.nn.Linear(2, 2)
    >>> get_binding_module(torch.nn.DataParallel(net)) is net, get_binding_module(net) is net
    (True, True)
    """
    from torch import nn

    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


def has_normalization(model: Any, check_list: Any = None) -> bool:
    """Whether ``model`` (unwrapped from DP/DDP) holds a normalization layer of a kind in ``check_list``.

    ``"bn"`` is any BatchNorm layer, ``"gn"`` any GroupNorm layer.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2))
    >>> has_normalization(net, ["bn"]), has_normalization(net, ["gn"])
    (True, False)
    """
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm

    if not check_list:
        raise ValueError("has_normalization(model, check_list): name the kinds to look for, e.g. ['bn'] or ['gn'].")
    kinds = tuple(k for name, k in (("bn", _BatchNorm), ("gn", nn.GroupNorm)) if name in check_list)
    return any(isinstance(m, kinds) for m in get_binding_module(model).modules()) if kinds else False


# -- hashed file names ---------------------------------------------------------------------------
_REMOTE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_EXTENSION = re.compile(r"(\.[^./]+)*$")
#: The hash HAT and hat-ignite put at the end of a saved file's name (8 hex digits), and the
#: 8-digit counter of a periodic name without a hash (``checkpoint-step-12345678``), which is not one.
_HASH_AT_END = re.compile(r"-([a-f0-9]{8})$")
_COUNTER_AT_END = re.compile(r"-(?:epoch|step)-[0-9]{8}$")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open_regular(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _content_hash_of_checkpoint(path: str) -> str | None:
    """The verified content hash of a checkpoint hat-ignite wrote, else ``None``.

    hat-ignite names its checkpoints after the hash of what they hold (the same bytes for the
    same state, whatever the zip container), not after the file's SHA-256, and record it in the
    file; it is recomputed here from what the file holds: ``None`` for a checkpoint whose content does
    not match it, and for any other file.
    """
    from hat_ignite.checkpoint.hashing import HASH_KEY, content_hash
    from hat_ignite.checkpoint.loading import load_checkpoint
    from hat_ignite.errors import CheckpointError

    try:  # the name is judged by the caller: only the content is checked against the recorded hash here
        saved = load_checkpoint(path, check_hash=False)
    except (CheckpointError, OSError):
        return None
    recorded = saved.get(HASH_KEY) if isinstance(saved, dict) else None
    if not isinstance(recorded, str):
        return None
    try:
        actual = content_hash(saved)
    except TypeError:  # a value no checkpoint of hat-ignite's holds
        return None
    return recorded if actual == recorded else None


def _check_named_hash(path: str, named: str) -> None:
    """Refuse ``path`` unless ``named``, the hash in its name, starts its content's hash.

    The content's hash is the file's SHA-256 (HAT's names) or, for a checkpoint hat-ignite
    wrote, its verified content hash (hat-ignite's names), whatever the name's form: periodic,
    ``best``, ``last``, with or without a prefix.
    """
    sha = _sha256(path)
    if sha.startswith(named):
        return
    content = _content_hash_of_checkpoint(path)
    if content is not None and content.startswith(named):
        return
    width = len(named)
    found = f"its SHA-256 starts with {sha[:width]!r}"
    if content is not None:
        found += f" and its content hash (what hat-ignite names checkpoints after) with {content[:width]!r}"
    raise ValueError(
        f"{os.path.abspath(path)} does not match the hash in its name: the name carries {named!r}, {found}. "
        f"The file is damaged, was renamed or is not the one saved. Use a good copy, or check_hash=False."
    )


def get_hash_file_if_hashed_and_local(in_file: str, check_hash: bool = True) -> str:
    """The local file to read for ``in_file``: itself, or its hashed name (``name-<sha256 prefix>.ext``).

    HAT saves checkpoints as ``float-checkpoint-best-1d3765fc.pth.tar`` and configs name them
    ``float-checkpoint-best.pth.tar``. A path with a scheme (``hdfs://``, ``http://``) is returned
    as it is. When ``in_file`` does not exist, a file of its directory named
    ``<name>-<hex>.<ext>`` is used (its name starts with ``<name>``: ``checkpoint-best.pth.tar``
    never resolves to ``float-checkpoint-best-<hex>.pth.tar``). With ``check_hash``, the hex in the
    name of the file found, or the 8 hex digits ending the name of an ``in_file`` that exists
    (``float-checkpoint-best-1d3765fc.pth.tar``), must start the content's hash: the file's
    SHA-256, or, for a checkpoint hat-ignite wrote, its verified content hash (what hat-ignite
    names checkpoints after). Every form of name is checked alike: periodic, ``best``, ``last``,
    with or without a prefix.

    Raises:
        ValueError: neither the file nor a hashed one exists, or the hash does not match (the
            message names the name's hash and the content's).
    """
    in_file = str(in_file)
    if _REMOTE.match(in_file):
        return in_file
    directory, name = os.path.split(in_file)
    ext = _EXTENSION.search(name).group(0)  # type: ignore[union-attr]  # matches at least ""
    stem = name[: len(name) - len(ext)]
    pattern = re.compile(re.escape(stem) + r"-([a-f0-9]*)\.")
    named = ""
    if os.path.exists(in_file):
        found = name
        own = _HASH_AT_END.search(stem)
        if own and not _COUNTER_AT_END.search(stem):
            named = own.group(1)
    else:
        found = ""
        for candidate in sorted(os.listdir(directory or ".")):
            match = pattern.match(candidate)
            if match:
                found, named = candidate, match.group(1)
        if not found:
            raise ValueError(
                f"{os.path.abspath(in_file)} does not exist, nor a hashed file {stem}-<sha256>{ext} next to it."
            )
    path = os.path.join(directory, found)
    if check_hash and named:
        _check_named_hash(path, named)
    elif check_hash:
        logger.warning("%s has no hash in its name; its content is not checked.", path)
    return path


# -- packages ------------------------------------------------------------------------------------
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}
_SPEC = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(==|!=|<=|>=|<|>)?\s*([^\s]*)\s*$")


def _check_one(spec: str) -> tuple[bool, str]:
    from packaging.version import Version

    match = _SPEC.match(spec)
    if match is None:
        return False, f"{spec!r} is not a requirement such as 'torch' or 'torch>=2.0'"
    name, op, wanted = match.groups()
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if not op:
        return True, f"{name} is available"
    found = getattr(module, "__version__", None) or importlib.metadata.version(name)
    if _OPERATORS[op](Version(str(found).split("+")[0]), Version(wanted)):
        return True, f"{spec} is available ({name} {found})"
    return False, f"{spec} is required, {name} {found} is installed"


@functools.lru_cache(maxsize=None)
def check_packages_available(*package_versions: str, raise_exception: bool = True, raise_msg: str = "") -> bool:
    """Whether every package or module (``"torch"``, ``"torch>=2.0"``, ``"torch.nn"``) imports, at that version.

    Args:
        package_versions: requirements, a name with an optional ``== != <= >= < >`` version.
        raise_exception: raise ``ModuleNotFoundError`` listing what is missing (else log a
            warning and return ``False``).
        raise_msg: what to do about it, added to the message.

    >>> check_packages_available("torch>=1.0", "torch.nn")
    True
    >>> check_packages_available("torch>=1000", raise_exception=False)
    False
    """
    missing = [message for ok, message in map(_check_one, package_versions) if not ok]
    if not missing:
        return True
    msg = "Required dependencies are not available: " + "; ".join(missing) + (f". {raise_msg}" if raise_msg else ".")
    if raise_exception:
        raise ModuleNotFoundError(msg)
    logger.warning(msg)
    return False
