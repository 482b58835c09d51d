"""`import_torchao`: torchao's PT2E package, imported without its start-up noise.

Importing torchao logs warnings that concern none of hat-ignite's int8 flow (x86 PT2E on the CPU):
C++ extensions built for other torch versions or GPUs (``_C_mxfp8``, ``_C_cutlass_90a``) that fail
to load, "no triton" for GPU kernels, and torch's ``_pytree`` note on an Enum it registers. They
would print on every quantization stage. :func:`import_torchao` runs the import once with those
loggers raised to ERROR (and torchao's import-time ``warnings`` ignored); with ``--debug`` (root
logger at DEBUG) nothing is hidden. Anything torchao logs later is left alone.
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from types import ModuleType

__all__ = ["import_torchao"]

#: The loggers torchao's import speaks through (torch's ``_pytree`` on an Enum torchao registers).
_NOISY = ("torchao", "torch.utils._pytree")


def import_torchao() -> ModuleType:
    """Import and return ``torchao.quantization.pt2e`` (quietly, the first time).

    Example:
        >>> import_torchao().__name__
        'torchao.quantization.pt2e'
    """
    name = "torchao.quantization.pt2e"
    if name in sys.modules:
        return sys.modules[name]
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        return importlib.import_module(name)
    loggers = [logging.getLogger(n) for n in _NOISY]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
