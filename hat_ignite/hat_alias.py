"""``import hat`` for HAT configs and callback files: a virtual ``hat`` package serving hat-ignite.

HAT configs and user modules import from HAT: ``from hat.registry import OBJECT_REGISTRY``,
``from hat.engine.processors.loss_collector import collect_loss_by_index``,
``from hat.callbacks import CallbackMixin``. :func:`install_hat_alias` adds an import hook
(a ``sys.meta_path`` finder) that serves every ``hat.*`` module as a virtual package whose names
are hat-ignite's objects (the table is :data:`hat_ignite.hat_alias_names.HAT_MODULES`). So a
class registered with ``hat.registry.OBJECT_REGISTRY`` is registered with
:data:`hat_ignite.registry.OBJECT_REGISTRY`, and ``hat.callbacks.CallbackMixin`` *is*
:class:`hat_ignite.callbacks.CallbackMixin`.

* Opt-in: importing hat-ignite installs nothing. ``hat-train`` / ``hat-predict`` install it
  unless given ``--no-hat-alias``; Python code calls :func:`install_hat_alias` itself.
* It never shadows HAT: when a real ``hat`` package is importable, nothing is installed and
  the returned :class:`HatSource` says which ``hat`` is used. The finder sits last on
  ``sys.meta_path``, so a ``hat`` on ``sys.path`` wins even if it appears later.
* Names hat-ignite does not provide (``hat.models.backbones.ResNet18``, ``hat.data...``) fail
  when imported, with a message naming the missing name and how to register one of your own:
  ``from hat.x import Name`` raises an ``ImportError`` with it, and ``hat.x.Name`` a
  :class:`~hat_ignite.errors.MissingHatNameError` (an ``AttributeError``), so ``hasattr`` and
  ``getattr(module, name, default)`` answer as on any module.
* It holds in every process the run starts. A forked process inherits the hook. A process
  started with ``spawn`` or ``forkserver`` (DDP ranks, DataLoader workers with ``num_workers``
  > 0 unpickling a dataset class whose module imports ``hat``) gets only the parent's
  ``sys.path``: while the alias is installed, ``sys.path`` ends with the directory
  :data:`ALIAS_PATH`, whose ``hat`` package installs the hook in that process and becomes the
  same virtual package. It is never taken for a real HAT.

Example:
    >>> source = install_hat_alias()
    >>> source.alias
    True
    >>> from hat.registry import OBJECT_REGISTRY
    >>> from hat_ignite import registry
    >>> OBJECT_REGISTRY is registry.OBJECT_REGISTRY
    True
    >>> from hat.models.backbones import ResNet18
    Traceback (most recent call last):
    ...
    ImportError: hat.models.backbones.ResNet18: HAT's model zoo is not part of hat-ignite...
    >>> uninstall_hat_alias()
    >>> import sys; "hat" in sys.modules
    False
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Mapping

from hat_ignite.errors import MissingHatNameError
from hat_ignite.hat_alias_names import HAT_MODULES, HELPER_PREFIXES, MODEL_ZOO_PREFIXES

__all__ = [
    "HatSource", "install_hat_alias", "uninstall_hat_alias", "hat_alias_installed", "serve_as_virtual_hat",
    "ALIAS_PATH",
]

_MARK = "__hat_ignite_alias__"

#: Names a virtual module refused (``"hat.x.Name"``) and why. ``from hat.x import Name`` asks
#: the package for ``Name`` first; when that fails it imports ``hat.x.Name`` as a submodule (how
#: Python imports a package's children), and the finder then raises this message as an
#: ImportError instead of serving an empty module (Python's own "cannot import name" says less).
_REFUSED: dict[str, str] = {}

#: The directory put on ``sys.path`` while the alias is installed: it holds only a ``hat``
#: package that serves the alias in processes started with ``spawn`` / ``forkserver``.
ALIAS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hat_alias_path")


@dataclass(frozen=True)
class HatSource:
    """Which ``hat`` package ``import hat`` gives.

    Attributes:
        alias: ``True`` when hat-ignite's virtual package serves ``hat.*``.
        where: the real package's location, or ``"hat_ignite.hat_alias"``.
    """

    alias: bool
    where: str

    def __str__(self) -> str:
        if self.alias:
            return "hat.* imports are served by hat-ignite (hat_ignite.hat_alias)"
        return f"hat.* imports use the installed HAT package at {self.where}"


def _import_target(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _close_module(module_name: str) -> str | None:
    """The served module ``module_name`` is most likely a typo of, or ``None``.

    Only a near miss of the same depth counts (``hat.engin`` -> ``hat.engine``), so a real
    model-zoo module such as ``hat.models.backbones`` is not taken for a typo.
    """
    depth = module_name.count(".")
    served = [name for name in HAT_MODULES if name.count(".") == depth]
    close = difflib.get_close_matches(module_name, served, n=1, cutoff=0.85)
    return close[0] if close else None


def _served_elsewhere(attr: str) -> list[str]:
    """The served modules that export ``attr`` (most specific first)."""
    return sorted((m for m, names in HAT_MODULES.items() if attr in names), key=lambda m: -m.count("."))


def _missing_message(module_name: str, attr: str, exports: Mapping[str, str]) -> str:
    full = f"{module_name}.{attr}"
    from hat_ignite.builtin_names import NOT_PROVIDED  # a plain table: imports nothing

    if attr in NOT_PROVIDED:  # a HAT class left out on purpose: say why, and what to use
        return f"{full}: {attr} is a HAT class hat-ignite does not provide: {NOT_PROVIDED[attr]}."
    misspelt = None if exports or module_name in HAT_MODULES else _close_module(module_name)
    if misspelt is not None:  # hat.engin: a typo of a module that hat-ignite serves
        return (
            f"{full}: hat-ignite serves no module {module_name!r}. Did you mean {misspelt!r}? "
            f"The hat.* modules it serves are listed in docs/hat-migration.md."
        )
    elsewhere = _served_elsewhere(attr)
    if elsewhere:  # served, from another module than this one
        also = f" (also from {', '.join(elsewhere[1:])})" if len(elsewhere) > 1 else ""
        return f"{full}: hat-ignite serves {attr} as {elsewhere[0]}.{attr}{also}; import it from there."
    helper = any(module_name == p or module_name.startswith(p + ".") for p in HELPER_PREFIXES)
    if exports:
        close = difflib.get_close_matches(attr, list(exports), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        offered = ", ".join(n for n in exports if not n.startswith("_"))
        head = f"{full}: hat-ignite's {module_name} provides {offered}; not {attr!r}.{hint}"
    elif helper:
        head = f"{full}: hat-ignite serves only some of HAT's helpers (the hat.* modules listed in docs/hat-migration.md)."
    else:
        what = next(
            label for prefix, label in MODEL_ZOO_PREFIXES.items()
            if module_name == prefix or module_name.startswith(prefix + ".")
        )
        head = f"{full}: {what} is not part of hat-ignite (only HAT's engine, callbacks and registry are)."
    if helper:  # a helper function or data structure, imported in code: nothing to register
        return (
            f"{head} Define {attr!r} in a module of your own and import it from there, or install HAT itself: "
            f"a real `hat` package is used whenever it is importable."
        )
    return (
        f"{head} Define {attr!r} in a module of your own, register it with "
        f"`from hat.registry import OBJECT_REGISTRY` and `@OBJECT_REGISTRY.register`, import that module "
        f"in the config (next to it: `from .my_models import {attr}` or `import my_pkg.models`), and use "
        f"type={attr!r}. Or install HAT itself: a real `hat` package is used whenever it is importable."
    )


def _module_getattr(module: types.ModuleType, exports: Mapping[str, str]) -> Any:
    """The ``__getattr__`` of a virtual module: imports its names on first use."""
    module_name = module.__name__

    def __getattr__(attr: str) -> Any:
        if attr in exports:
            value = _import_target(exports[attr])
            setattr(module, attr, value)
            return value
        child = f"{module_name}.{attr}"
        if child in HAT_MODULES:
            return importlib.import_module(child)
        if attr.startswith("_"):
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}", name=attr, obj=module)
        message = _missing_message(module_name, attr, exports)
        _REFUSED[child] = message  # for `from hat.x import Name`, which imports hat.x.Name next
        raise MissingHatNameError(message, name=attr, obj=module)

    return __getattr__


class _HatFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and makes the virtual ``hat.*`` packages."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "hat" and not fullname.startswith("hat."):
            return None
        refused = _REFUSED.pop(fullname, None)
        if refused is not None:  # `from hat.x import Name` of a name hat.x refused just now
            raise ImportError(refused, name=fullname.rpartition(".")[0])
        return importlib.machinery.ModuleSpec(fullname, self, origin="hat_ignite.hat_alias", is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        _make_virtual(module)


def _make_virtual(module: types.ModuleType) -> None:
    """Turn ``module`` into the virtual package of its ``hat.*`` name."""
    name = module.__name__
    exports = HAT_MODULES.get(name, {})
    module.__path__ = []  # a package: its children are served by the finder
    module.__doc__ = f"hat-ignite's stand-in for HAT's {name} (see hat_ignite.hat_alias)."
    setattr(module, "__all__", [n for n in exports if not n.startswith("_")])
    setattr(module, _MARK, True)
    setattr(module, "__getattr__", _module_getattr(module, exports))  # PEP 562 module __getattr__
    setattr(module, "__dir__", lambda: sorted(set(module.__dict__) | set(exports)))


def serve_as_virtual_hat(name: str) -> None:
    """Called by the ``hat`` package of :data:`ALIAS_PATH` while it is imported: install the
    hook in this process and make that module the virtual ``hat``."""
    if not hat_alias_installed():
        sys.meta_path.append(_HatFinder())
    _make_virtual(sys.modules[name])


def hat_alias_installed() -> bool:
    """Whether the hook is on ``sys.meta_path``."""
    return any(isinstance(finder, _HatFinder) for finder in sys.meta_path)


def _real_hat() -> str | None:
    """Where an importable ``hat`` that is not ours lives, or ``None``."""
    loaded = sys.modules.get("hat")
    if loaded is not None:
        return None if getattr(loaded, _MARK, False) else str(getattr(loaded, "__file__", None) or loaded)
    if hat_alias_installed():
        return None
    try:
        spec = importlib.util.find_spec("hat")
    except (ImportError, ValueError):
        return None
    if spec is None or _is_alias_path(spec.origin):
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "hat"


def _is_alias_path(origin: str | None) -> bool:
    return origin is not None and os.path.abspath(origin).startswith(ALIAS_PATH + os.sep)


def install_hat_alias() -> HatSource:
    """Serve ``import hat`` / ``from hat.* import ...`` from hat-ignite, unless HAT is importable.

    Idempotent. Returns which ``hat`` imports now give.
    """
    real = _real_hat()
    if real is not None:
        return HatSource(alias=False, where=real)
    if not hat_alias_installed():
        sys.meta_path.append(_HatFinder())
    if ALIAS_PATH not in sys.path:
        sys.path.append(ALIAS_PATH)  # last: any hat found earlier on the path is not shadowed
    return HatSource(alias=True, where="hat_ignite.hat_alias")


def uninstall_hat_alias() -> None:
    """Remove the hook and the virtual ``hat.*`` modules imported so far (idempotent)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _HatFinder)]
    sys.path[:] = [p for p in sys.path if p != ALIAS_PATH]
    _REFUSED.clear()
    for name in [n for n, m in sys.modules.items() if (n == "hat" or n.startswith("hat.")) and getattr(m, _MARK, False)]:
        del sys.modules[name]
