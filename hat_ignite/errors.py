"""Error types raised for bad user input.

Each message says what is wrong, where (file, key path, step) and how to fix it.
"""

from __future__ import annotations

__all__ = ["HatIgniteError", "ConfigError", "CheckpointError", "CallbackSignatureError", "NonFiniteLossError"]


class HatIgniteError(Exception):
    """Base class of every error hat-ignite raises on purpose."""


class ConfigError(HatIgniteError, ValueError):
    """A config file or a config value is wrong; the message names the file and the key path."""


class CheckpointError(HatIgniteError, RuntimeError):
    """A checkpoint cannot be written or loaded; the message names the absolute path and the reason."""


class CallbackSignatureError(HatIgniteError, TypeError):
    """A callback hook asks for a keyword its hook never passes."""


class NonFiniteLossError(HatIgniteError, FloatingPointError):
    """A loss became NaN or Inf; raised before the optimizer update of that step."""
