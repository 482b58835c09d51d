"""Former home of :mod:`hat_ignite.checkpoint.restore`, kept so existing imports and configs'
dotted paths (``hat_ignite.callbacks.checkpoint_state.LoadCheckpoint``) work (the same objects)."""

from hat_ignite.checkpoint.restore import (
    LoadCheckpoint,
    check_world_size,
    load_model_weights,
    restore_training_state,
    resume_from,
)

__all__ = ["load_model_weights", "restore_training_state", "resume_from", "check_world_size", "LoadCheckpoint"]
