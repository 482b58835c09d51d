"""HAT callbacks: handlers on the engine's HAT events."""

from hat_ignite.callbacks.base import CallbackMixin

__all__ = ["CallbackMixin"]
