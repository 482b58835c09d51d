"""A package's public names, each imported from its module when first used (PEP 562).

``import hat_ignite.callbacks`` then imports none of the callback modules, and a run imports
only the modules of the names its config uses. ``from hat_ignite.callbacks import Checkpoint``
and ``hat_ignite.callbacks.Checkpoint`` work as with eager imports; the package keeps the value
after the first look-up. Each package also imports its names under ``TYPE_CHECKING``, so type
checkers and IDEs see the real objects; ``tests/test_package.py`` checks that both lists agree.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping, Sequence

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, exports: Mapping[str, Sequence[str]],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, serving the names of ``exports``.

    Args:
        package: the package's ``__name__``.
        exports: module path -> the names it provides to the package.

    >>> getattr_, dir_ = lazy_attributes("hat_ignite.errors", {"hat_ignite.errors": ["ConfigError"]})
    >>> getattr_("ConfigError").__name__, "ConfigError" in dir_()
    ('ConfigError', True)
    >>> getattr_("Nope")
    Traceback (most recent call last):
    ...
    AttributeError: module 'hat_ignite.errors' has no attribute 'Nope'
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # looked up once
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
