"""Former home of :mod:`hat_ignite.checkpoint`'s writing, hashing and loading, kept so existing
imports work: :mod:`~hat_ignite.checkpoint.atomic`, :mod:`~hat_ignite.checkpoint.hashing`,
:mod:`~hat_ignite.checkpoint.loading` (the same objects)."""

from hat_ignite.checkpoint.atomic import PathLike, atomic_link, atomic_save, atomic_write, disk_full, is_temp_file
from hat_ignite.checkpoint.hashing import FORMAT_KEY, FORMAT_VERSION, HASH_KEY, content_hash, with_content_hash
from hat_ignite.checkpoint.loading import RESAVE_SAFELY, load_checkpoint, refused_global, verify_content_hash

__all__ = [
    "PathLike", "FORMAT_VERSION", "FORMAT_KEY", "HASH_KEY", "content_hash", "with_content_hash", "atomic_save",
    "atomic_write", "atomic_link", "is_temp_file", "disk_full", "load_checkpoint", "verify_content_hash",
    "refused_global", "RESAVE_SAFELY",
]
