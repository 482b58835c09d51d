"""Error types raised for bad user input.

Each message says what is wrong, where (file, key path, step) and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "HatIgniteError", "ConfigError", "CheckpointError", "CallbackSignatureError", "NonFiniteLossError",
    "BatchError", "DataError", "QuantizationError", "UnknownLengthError",
    "MissingHatNameError", "MissingExtraError",
]


class HatIgniteError(Exception):
    """Base class of every error hat-ignite raises on purpose."""


class ConfigError(HatIgniteError, ValueError):
    """A config file or a config value is wrong; the message names the file and the key path."""

    #: set by :func:`hat_ignite.registry.config_error` (absent on errors raised otherwise)
    key_path: str
    detail: str


class CheckpointError(HatIgniteError, RuntimeError):
    """A checkpoint cannot be written or loaded; the message names the absolute path and the reason."""


class CallbackSignatureError(HatIgniteError, TypeError):
    """A callback hook asks for a keyword its hook never passes."""


class NonFiniteLossError(HatIgniteError, FloatingPointError):
    """A loss or gradient became NaN or Inf; raised naming the step, before any checkpoint holds it."""


class BatchError(HatIgniteError, RuntimeError):
    """The model failed on a batch; names the batch (epoch, step, sub-batch) and its structure
    next to the first batch's, with the model's own error chained as the cause."""


class DataError(HatIgniteError, ValueError):
    """The data loader cannot feed the loop (for example, it yields no batch at all)."""


class QuantizationError(HatIgniteError, RuntimeError):
    """A model cannot be prepared, calibrated, trained or converted for int8; names the module and the fix."""


class UnknownLengthError(HatIgniteError, ValueError, AssertionError):
    """A schedule needs a run length (steps per epoch, total steps) the loop does not define.

    Also an ``AssertionError``: HAT asserts the data loader has a length there, so HAT code that
    catches ``AssertionError`` catches this one too.
    """


class MissingHatNameError(HatIgniteError, AttributeError):
    """A ``hat.*`` alias module does not serve the name asked for; the message says why and what to do.

    An ``AttributeError``, so ``hasattr(module, name)`` and ``getattr(module, name, default)``
    work as on any module. ``from hat.x import Name`` raises an ``ImportError`` with the same
    message (see :mod:`hat_ignite.hat_alias`).
    """


class MissingExtraError(HatIgniteError, ImportError):
    """An optional package is not installed; the message names the extra that installs it.

    >>> print(MissingExtraError("matplotlib", "curves", "drawing training curves"))
    drawing training curves needs matplotlib, which is not installed: pip install 'hat-ignite[curves]'.
    """

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(f"{purpose} needs {package}, which is not installed: pip install 'hat-ignite[{extra}]'.")
        self.package, self.extra = package, extra
