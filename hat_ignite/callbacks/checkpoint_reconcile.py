"""Former home of :mod:`hat_ignite.checkpoint.reconcile`, kept so existing imports work (the same objects)."""

from hat_ignite.checkpoint.reconcile import checkpoint_file, reconcile, saved_identity

__all__ = ["saved_identity", "checkpoint_file", "reconcile"]
