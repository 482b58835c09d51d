"""Former home of :mod:`hat_ignite.checkpoint.files`, kept so existing imports work (the same objects)."""

from hat_ignite.checkpoint.files import (
    NAME_HASH,
    NAME_NUMBER,
    checkpoint_number,
    latest_valid_checkpoint,
    list_checkpoints,
    resume_marks,
    scan_checkpoints,
    weights_finite,
)

__all__ = [
    "scan_checkpoints", "list_checkpoints", "latest_valid_checkpoint",
    "NAME_HASH", "NAME_NUMBER", "checkpoint_number", "weights_finite", "resume_marks",
]
