"""Checkpoint files: their format, how they are written and read, what they hold, and resuming.

The ``Checkpoint`` callback (:mod:`hat_ignite.callbacks.checkpoint`) decides *when* to save and
which file is ``best``; ``LoadCheckpoint`` and ``hat-train --resume`` decide *what* to load. All
of them go through this package, which knows nothing of callbacks:

=========================  =====================================================================
concern                    modules
=========================  =====================================================================
format and hashing         :mod:`~.hashing` (format version, the content hash over every
                           tensor's bytes and the structure around them);
                           :mod:`~.loading` (``torch.load(weights_only=True)`` only, format and
                           hash checked, one clear error per failure)
atomic writes              :mod:`~.atomic` (temporary file, fsync, rename, fsync of the
                           directory; full disks named);
                           :mod:`~.files` (names, listing, the newest valid file);
                           :mod:`~.rotation` (superseded periodic files);
                           :mod:`~.reconcile` (``last`` and ``best`` after a kill between writes)
what a checkpoint holds    :mod:`~.payload` (collected from a running loop: weights, optimizer,
                           progress, data position, generators, callback states);
                           :mod:`~.keywords` (the same from HAT's hook keywords)
resume                     :mod:`~.restore` (weights or a whole training state put back;
                           ``LoadCheckpoint``); :mod:`~.optimizer_state` (another optimizer's
                           state refused); :mod:`~.progress` (a changed schedule honoured or
                           refused)
=========================  =====================================================================

The modules that lived in ``hat_ignite.callbacks`` before this package
(``checkpoint_io``, ``checkpoint_state``, ``checkpoint_files``, ``checkpoint_optim``,
``checkpoint_reconcile``) still import, as the same objects.
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.checkpoint.atomic": ["atomic_save", "atomic_write", "atomic_link"],
    "hat_ignite.checkpoint.hashing": ["content_hash", "with_content_hash"],
    "hat_ignite.checkpoint.loading": ["load_checkpoint"],
    "hat_ignite.checkpoint.files": ["list_checkpoints", "latest_valid_checkpoint"],
    "hat_ignite.checkpoint.restore": [
        "LoadCheckpoint", "load_model_weights", "restore_training_state", "resume_from",
    ],
}

__all__ = [
    "atomic_save",
    "atomic_write",
    "atomic_link",
    "content_hash",
    "with_content_hash",
    "load_checkpoint",
    "list_checkpoints",
    "latest_valid_checkpoint",
    "LoadCheckpoint",
    "load_model_weights",
    "restore_training_state",
    "resume_from",
]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.checkpoint.atomic import atomic_link, atomic_save, atomic_write
    from hat_ignite.checkpoint.files import latest_valid_checkpoint, list_checkpoints
    from hat_ignite.checkpoint.hashing import content_hash, with_content_hash
    from hat_ignite.checkpoint.loading import load_checkpoint
    from hat_ignite.checkpoint.restore import LoadCheckpoint, load_model_weights, restore_training_state, resume_from
