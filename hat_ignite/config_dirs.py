"""The packages configs run in, importable in every process a run starts.

A config outside any package runs in a package made for its directory, so that
``from .my_models import MyNet`` imports ``my_models.py`` beside it (see
:mod:`hat_ignite.config`). That package is ``hat_ignite.config_dirs.d<hash of the directory>``,
a child of this module, and the modules it imports are its children
(``hat_ignite.config_dirs.d1a2b….my_models``): a class defined there is pickled under that name.

A process started with ``spawn`` or ``forkserver`` (a DDP rank, a DataLoader worker unpickling
the dataset) gets the parent's ``sys.path`` but none of its modules. Unpickling such a class
there imports this module first, which serves each ``d<hash>`` child from the directory on
``sys.path`` whose hash it is (the config keeps its directory there once it imported a module
from it). Importing this module adds that finder to ``sys.meta_path`` (once); it answers only
for names under this module.

>>> import os, tempfile
>>> folder = os.path.realpath(tempfile.mkdtemp())
>>> _ = open(os.path.join(folder, "consts.py"), "w").write("WIDTH = 7\\n")
>>> name = package_for(folder)
>>> import importlib
>>> importlib.import_module(name + ".consts").WIDTH
7
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Sequence

__all__ = ["package_for", "package_name"]

#: A package: its children are the config directories, served by :class:`_ConfigDirFinder`.
__path__: list[str] = []

#: Directories :func:`package_for` made packages for in this process, by package name.
_KNOWN: dict[str, str] = {}


def package_name(directory: str) -> str:
    """The name of the package made for ``directory`` (an absolute path).

    >>> package_name("/projects/shapes")
    'hat_ignite.config_dirs.dd4a85ca6faf9a44b'
    """
    digest = hashlib.sha1(directory.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{__name__}.d{digest}"


def _directory_of(name: str) -> str | None:
    """The directory the package ``name`` is made for: one :func:`package_for` was given, or a
    ``sys.path`` entry whose :func:`package_name` is ``name``."""
    if name in _KNOWN:
        return _KNOWN[name]
    for entry in sys.path:
        if isinstance(entry, str) and os.path.isabs(entry) and package_name(entry) == name and os.path.isdir(entry):
            return entry
    return None


class _ConfigDirFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``hat_ignite.config_dirs.d<hash>``: a package whose modules are its directory's files."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.rpartition(".")[0] != __name__:
            return None
        directory = _directory_of(fullname)
        if directory is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=directory, is_package=True)
        spec.submodule_search_locations = [directory]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = f"The config directory {module.__spec__.origin} (relative imports of configs)."  # type: ignore[union-attr]


def _install() -> None:
    if not any(isinstance(finder, _ConfigDirFinder) for finder in sys.meta_path):
        sys.meta_path.append(_ConfigDirFinder())


def package_for(directory: str) -> str:
    """Import (once) and return the name of the package made for ``directory`` (absolute)."""
    name = package_name(directory)
    _KNOWN[name] = directory
    importlib.import_module(name)
    return name


_install()
