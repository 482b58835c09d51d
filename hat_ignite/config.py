"""Python config files, command-line overrides, and a readable dump of the resolved config.

A config is a Python file of plain assignments, as in HAT. It may import modules and define
functions (a ``loss_collector``, an ``update_metric``); every top-level name that does not start
with ``_`` and is not a module becomes a config key. Objects are described by dicts with a ``type``
key and built later by :mod:`hat_ignite.registry`.

Stages are top-level keys named ``{stage}_trainer``, ``{stage}_predictor`` or
``{stage}_calibrator`` (``float_trainer``, ``qat_trainer``, ``int_infer_predictor`` ...).

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "toy.py")
>>> _ = open(path, "w").write("lr = 0.1\\nfloat_trainer = dict(type='Trainer', num_epochs=2)\\n")
>>> cfg = Config.fromfile(path)
>>> cfg.merge_opts(["float_trainer.num_epochs=5", "lr=1e-2"])
>>> cfg["float_trainer"]["num_epochs"], cfg["lr"]
(5, 0.01)
>>> cfg.stages()
{'float': ['float_trainer']}
"""

from __future__ import annotations

import difflib
import enum
import logging
import math
import os
import pprint
import re
import sys
import traceback
import types
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

from hat_ignite.config_cycles import cycle_message, self_reference
from hat_ignite.config_opts import literal, parse_items, parse_opts, path_exists, set_path, split_key
from hat_ignite.errors import ConfigError

__all__ = ["Config", "ConfigVersion", "parse_opts", "STAGE_SUFFIXES"]

logger = logging.getLogger(__name__)

#: Key suffixes that mark a stage's engine config.
STAGE_SUFFIXES: tuple[str, ...] = ("_trainer", "_predictor", "_calibrator")

class ConfigVersion(enum.Enum):
    """HAT's config format versions (HAT configs set ``VERSION = ConfigVersion.v2``)."""

    v1 = 1
    v2 = 2


def _config_package(config_dir: str) -> tuple[str | None, list[str]]:
    """The package a config file runs in, and the directories to put on ``sys.path`` meanwhile.

    A config in a package directory (with ``__init__.py`` up to some root) runs as a module of
    that package, so ``from .models import MyNet`` imports the package's own module. Any other
    config runs in a package made for its directory (``None`` here: it is made once the
    directory is on ``sys.path``, see :mod:`hat_ignite.config_dirs`), so relative imports of
    files next to it work too. The config's directory (and a real package's root) is on
    ``sys.path`` while the file runs, so ``import my_pkg.models`` finds a package next to it, as
    in HAT.
    """
    parts: list[str] = []
    root = config_dir
    while os.path.isfile(os.path.join(root, "__init__.py")) and os.path.basename(root).isidentifier():
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    if parts:
        return ".".join(parts), [config_dir, root]
    return None, [config_dir]


def _imported_from(roots: list[str], before: set[str]) -> list[str]:
    """The ``roots`` that modules imported since ``before`` (names in ``sys.modules``) came from."""
    used: list[str] = []
    for name in set(sys.modules) - before:
        path = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(path, str):
            continue
        used.extend(r for r in roots if r not in used and os.path.abspath(path).startswith(os.path.join(r, "")))
    return used


def _exec_error(path: str, exc: BaseException) -> ConfigError:
    """Name the config line an exception was raised on."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == path:
            line = frame.lineno
    where = f"{path}:{line}" if line else path
    hint = ""
    if isinstance(exc, ModuleNotFoundError) and (exc.name == "hat" or str(exc.name).startswith("hat.")):
        hint = (
            " The config (or a module it imports) imports from HAT: install HAT, or let hat-ignite serve "
            "hat.* (hat-train/hat-predict do unless --no-hat-alias; in Python call "
            "hat_ignite.hat_alias.install_hat_alias())."
        )
    text = str(exc).rstrip()
    end = "" if text.endswith((".", "?", "!")) else "."
    return ConfigError(f"{where}: running the config raised {type(exc).__name__}: {text}{end}{hint}")


class Config(Mapping):
    """The top-level names of a config file, plus the file they came from.

    A mapping of the config's values, which are plain dicts, lists and objects as the file made
    them; :meth:`merge_opts` applies ``--opts`` overrides to them in place.

    Args:
        data: the config values.
        filename: the file they were read from (used in error messages and the dump).
    """

    def __init__(self, data: Mapping[str, Any], filename: str = "<config>") -> None:
        self._data = dict(data)
        self.filename = filename
        self.overrides: list[str] = []

    # -- loading ---------------------------------------------------------------------------
    @classmethod
    def fromfile(cls, path: str | os.PathLike) -> Config:
        """Run a ``.py`` config file and collect its top-level names.

        The config's directory (and its package's root) is on ``sys.path`` while the file runs.
        When the file imported modules from there, the directory stays on ``sys.path``
        afterwards, so that processes started later with ``spawn`` or ``forkserver`` (DDP ranks,
        DataLoader workers unpickling a dataset defined there), which get this ``sys.path``,
        import those modules too, as a module on ``PYTHONPATH`` would be.

        Raises:
            ConfigError: the file is missing or not ``.py``, has a syntax error (with the line
                and column), raises while it runs (with the line), or makes a value that contains
                itself (with both key paths).
        """
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            what = "is a directory" if os.path.isdir(path) else "does not exist"
            raise ConfigError(f"config file {path} {what}. Pass the path of a .py config file.")
        if not path.endswith(".py"):
            raise ConfigError(f"config file {path} is not a .py file; configs are Python files of assignments.")
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path} cannot be read as UTF-8 text: {exc}.") from None
        nul = source.find("\0")
        if nul >= 0:  # compile() says so without a line
            row, column = source.count("\n", 0, nul) + 1, nul - source.rfind("\n", 0, nul)
            raise ConfigError(
                f"{path}:{row}:{column}: the file holds a NUL byte (\\x00), which Python source cannot contain "
                f"(a binary or damaged file, or a bad copy). Remove it and run again."
            )
        try:
            code = compile(source, path, "exec")
        except (ValueError, MemoryError, RecursionError) as exc:  # e.g. a null byte, absurd nesting
            raise ConfigError(f"{path}: cannot compile the config: {type(exc).__name__}: {exc}.") from None
        except SyntaxError as exc:
            line = (exc.text or "").rstrip("\n")
            shown = line.lstrip()
            column = max((exc.offset or 1) - 1 - (len(line) - len(shown)), 0)
            caret = f"\n    {shown}\n    {' ' * column}^" if shown else ""
            where = f"{path}:{exc.lineno}" if exc.lineno else path
            raise ConfigError(f"{where}: syntax error: {exc.msg}.{caret}\nFix that line and run again.") from None
        stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        config_dir = os.path.dirname(path)
        package, roots = _config_package(config_dir)
        added = [d for d in roots if d not in sys.path]
        sys.path[:0] = added  # as HAT: modules next to the config import while it runs
        before = set(sys.modules)
        kept: list[str] = []
        try:
            if package is None:
                from hat_ignite.config_dirs import package_for

                package = package_for(config_dir)
            namespace: dict[str, Any] = {
                "__file__": path, "__name__": f"hat_config.{stem}", "__package__": package,
                "__builtins__": __builtins__,
            }
            exec(code, namespace)
            kept = _imported_from(added, before)
        except (Exception, SystemExit) as exc:  # any error the user's file raises, exit() included
            raise _exec_error(path, exc) from exc
        finally:
            for entry in added:  # a directory the config imported modules from stays (spawned processes)
                if entry in sys.path and entry not in kept:
                    sys.path.remove(entry)
        data = {
            k: v for k, v in namespace.items() if not k.startswith("_") and not isinstance(v, types.ModuleType)
        }
        found = self_reference(data)
        if found:  # before anything walks it: each walk would end in a RecursionError
            raise ConfigError(f"{path}: {cycle_message(found)}")
        return cls(data, filename=path)

    # -- mapping ---------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            raise KeyError(self._missing(key)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setitem__(self, key: str, value: Any) -> None:
        self._data[key] = value

    def __getattr__(self, key: str) -> Any:
        """``cfg.float_trainer`` as well as ``cfg["float_trainer"]`` (as HAT's Config)."""
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(self._missing(key)) from None

    def _missing(self, key: str) -> str:
        close = difflib.get_close_matches(key, list(self._data), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        return f"{self.filename} has no key {key!r}.{hint}"

    def to_dict(self) -> dict[str, Any]:
        """The config values as a plain dict (not a copy of the values)."""
        return dict(self._data)

    # -- building --------------------------------------------------------------------------
    def build(self, key: str) -> Any:
        """Build the object the value at ``key`` describes (with the registry).

        Every build error names this config's file and the key path inside it.

        Raises:
            ConfigError: ``"<file>: <key path>: <problem and fix>"``, e.g. an unknown type or an
                argument its constructor rejects; also when ``key`` is not in the config.

        >>> cfg = Config({"delay": {"type": "datetime.timedelta", "minutes": 2}}, filename="cfg.py")
        >>> cfg.build("delay").total_seconds()
        120.0
        >>> cfg["delay"]["type"] = "Trainr"
        >>> cfg.build("delay")
        Traceback (most recent call last):
        ...
        hat_ignite.errors.ConfigError: cfg.py: delay.type: unknown type 'Trainr': ... Did you mean 'Trainer'? ...
        """
        from hat_ignite.registry import build_from_cfg  # the registry imports configs' values lazily

        if key not in self._data:
            raise ConfigError(self._missing(key))
        try:
            return build_from_cfg(self._data[key], key_path=key)
        except ConfigError as exc:
            raise ConfigError(f"{self.filename}: {exc}") from exc

    # -- stages ----------------------------------------------------------------------------
    def stages(self) -> dict[str, list[str]]:
        """Map each stage name to its engine keys, in config order.

        >>> Config({"float_trainer": {}, "float_predictor": {}, "qat_trainer": {}, "lr": 1}).stages()
        {'float': ['float_trainer', 'float_predictor'], 'qat': ['qat_trainer']}
        """
        found: dict[str, list[str]] = {}
        for key, value in self._data.items():
            for suffix in STAGE_SUFFIXES:
                if key.endswith(suffix) and len(key) > len(suffix) and isinstance(value, Mapping):
                    found.setdefault(key[: -len(suffix)], []).append(key)
        return found

    def stage_key(self, stage: str, kind: str) -> str:
        """The key of ``stage``'s ``kind`` engine (``"trainer"``, ``"predictor"``), checked.

        Raises:
            ConfigError: the config has no such key; the message lists the stages it has.
        """
        key = f"{stage}_{kind}"
        if isinstance(self._data.get(key), Mapping):
            return key
        with_kind = [s for s, keys in self.stages().items() if f"{s}_{kind}" in keys]
        listing = ", ".join(with_kind) if with_kind else "none"
        raise ConfigError(
            f"{self.filename} has no {key!r}: stage {stage!r} has no {kind}. Stages with a {kind}: "
            f"{listing}. Pick one with --stage."
        )

    # -- overrides -------------------------------------------------------------------------
    def merge_opts(self, opts: Sequence[str], overwrite: bool = True) -> None:
        """Apply ``--opts`` items (``KEY=VALUE``) in place, in order.

        Each value replaces what is at its key path after the file ran (changing ``lr`` does not
        change a ``float_trainer`` dict that already copied the old ``lr``). The last part of a
        path may be a new dict key; every earlier part must exist.

        With ``overwrite=False`` (HAT's ``--opts-overwrite False``) an item whose key path
        already exists is skipped, with a warning.

        Raises:
            ConfigError: a malformed item or a key path that does not exist.
        """
        for parts, value, item in parse_items(opts):
            if not overwrite and path_exists(self._data, parts):
                logger.warning("--opts %s: the config sets this key and overwrite is off: keeping its value", item)
                continue
            self._set(parts, value, item)
            self.overrides.append(item)

    def merge_from_list_or_dict(self, cfg_opts: Sequence[str] | Mapping[str, Any], overwrite: bool = False) -> None:
        """HAT's spelling: merge ``[key, value, key, value ...]`` or ``{key: value}`` in place.

        String values are read as in :meth:`merge_opts`; other values are used as they are.
        As in HAT, keys that already exist keep their value unless ``overwrite=True``.

        >>> cfg = Config({"model": {"depth": 18}})
        >>> cfg.merge_from_list_or_dict(["model.depth", "50", "model.width", "64"], overwrite=True)
        >>> cfg.merge_from_list_or_dict({"model.depth": 101})
        >>> cfg["model"]
        {'depth': 50, 'width': 64}
        """
        if not isinstance(cfg_opts, Mapping) and len(cfg_opts) % 2:
            raise ConfigError(f"merge_from_list_or_dict: {list(cfg_opts)!r} has an odd length; give key, value pairs.")
        pairs = cfg_opts.items() if isinstance(cfg_opts, Mapping) else zip(cfg_opts[0::2], cfg_opts[1::2])
        for key, value in pairs:
            parts = split_key(str(key), str(key))
            if overwrite or not path_exists(self._data, parts):
                self._set(parts, literal(value) if isinstance(value, str) else value, f"{key} {value!r}")
                self.overrides.append(f"{key} {value!r}")

    def _set(self, parts: list[str | int], value: Any, item: str) -> None:
        set_path(self._data, parts, value, item, self.filename)

    def relocate_paths(self, old: str, new: str) -> int:
        """Move every string path at or under ``old`` to the same place under ``new``, in place.

        Used when the work dir is changed from the command line: a checkpoint dir written as
        ``os.path.join(work_dir, "ckpt")`` in the file follows the new work dir.

        Returns:
            How many strings were changed.

        >>> cfg = Config({"work_dir": "./runs/a", "ckpt": {"save_dir": "runs/a/ckpt"}, "name": "a"})
        >>> cfg.relocate_paths("./runs/a", "/tmp/b")
        2
        >>> cfg["ckpt"]["save_dir"], cfg["work_dir"], cfg["name"]
        ('/tmp/b/ckpt', '/tmp/b', 'a')
        """
        old_norm = os.path.normpath(old)
        if os.path.normpath(new) == old_norm:
            return 0
        count = 0
        visited: set[int] = set()  # containers shared in the config are moved once

        def move(value: Any) -> Any:
            nonlocal count
            if isinstance(value, (dict, list)):
                if id(value) in visited:
                    return value
                visited.add(id(value))
            if isinstance(value, str):
                norm = os.path.normpath(value) if value else value
                if norm == old_norm:
                    count += 1
                    return new
                if norm.startswith(old_norm + os.sep):
                    count += 1
                    return os.path.join(new, norm[len(old_norm) + 1:])
                return value
            if isinstance(value, dict):
                for k, v in value.items():
                    value[k] = move(v)
            elif isinstance(value, list):
                value[:] = [move(v) for v in value]
            elif isinstance(value, tuple) and not hasattr(value, "_fields"):
                return tuple(move(v) for v in value)
            return value

        for key, value in self._data.items():
            self._data[key] = move(value)
        return count

    # -- dumping ---------------------------------------------------------------------------
    def dumps(self) -> str:
        """The config as readable Python source: one assignment per key.

        Plain values are written as literals, dicts in the config's key order. Classes and
        functions are written as the string ``"module.qualname"``; other objects as their
        ``repr`` in a string.

        >>> import torch
        >>> print(Config({"opt": {"type": torch.optim.SGD, "lr": 0.1}}, "x.py").dumps())
        # Resolved config of x.py
        opt = {'type': 'torch.optim.sgd.SGD', 'lr': 0.1}
        <BLANKLINE>
        """
        lines = [f"# Resolved config of {self.filename}"]
        if self.overrides:
            lines.append(f"# --opts {' '.join(self.overrides)}")
        for key, value in self._data.items():
            text = pprint.pformat(_plain(value, set()), width=100, sort_dicts=False)
            lines.append(f"{key} = {text}")
        return "\n".join(lines) + "\n"

    def dump(self, path: str | os.PathLike) -> None:
        """Write :meth:`dumps` to ``path`` (through a temporary file, so it is never half written)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.dumps())
        os.replace(tmp, path)

    def __repr__(self) -> str:
        return f"Config({self.filename!r}, keys={list(self._data)})"


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    return f"{module}.{name}" if module and name else repr(obj)


def _plain(value: Any, seen: set[int]) -> Any:
    """A copy of ``value`` made of literals only (for :meth:`Config.dumps`)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, (Mapping, list, tuple, set)):
        if id(value) in seen:
            return "<recursive reference>"
        seen = seen | {id(value)}
        if isinstance(value, Mapping):
            return {str(k): _plain(v, seen) for k, v in value.items()}
        items = [_plain(v, seen) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return _qualified_name(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return _qualified_name(value)
    return repr(value)
