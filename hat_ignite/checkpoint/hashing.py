"""Content hashing of checkpoints: a SHA-256 over every tensor's bytes and the structure around them.

:func:`content_hash` covers each tensor's dtype, shape and raw bytes and every key, value and
container in order, so the same content hashes the same before saving and after loading, and a
flipped bit anywhere changes it. :func:`with_content_hash` stores it in each checkpoint written
(the ``Checkpoint`` callback does) and :mod:`~hat_ignite.checkpoint.loading` checks it on every load.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["FORMAT_VERSION", "FORMAT_KEY", "HASH_KEY", "content_hash", "with_content_hash"]

#: Version of the checkpoint layout this module writes.
FORMAT_VERSION = 1
#: Key holding the format version.
FORMAT_KEY = "hat_ignite_format"
#: Key holding the hex SHA-256 of the rest of the checkpoint.
HASH_KEY = "content_sha256"


# -- content hashing -------------------------------------------------------------------------
def _feed_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_quantized:
        if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            h.update(struct.pack("<dq", t.q_scale(), t.q_zero_point()))
        else:
            _feed_tensor(h, t.q_per_channel_scales())
            _feed_tensor(h, t.q_per_channel_zero_points())
        t = t.int_repr()
    elif t.layout != torch.strided:
        t = t.to_dense()
    h.update(f"T{t.dtype}{tuple(t.shape)}|".encode())
    flat = t.contiguous().reshape(-1)
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy())


_SCALARS = (type(None), bool, int, float, complex)
_MAPPINGS = (dict, OrderedDict)
_SEQUENCES = (list, tuple, torch.Size)


def _feed(h: Any, obj: Any, where: str) -> None:
    """Feed one value into the hash, recursing into containers; ``where`` is its key path.

    Types are checked exactly (a numpy float is not a float here), so whatever hashes also
    passes a weights-only load.
    """
    kind = type(obj)
    if isinstance(obj, torch.Tensor):
        _feed_tensor(h, obj)
    elif kind in _MAPPINGS:
        h.update(f"D{len(obj)}|".encode())
        for key, value in obj.items():
            _feed(h, key, f"{where} (a key)")
            _feed(h, value, f"{where}.{key}" if where else str(key))
    elif kind in _SEQUENCES:
        h.update(f"{'L' if kind is list else 'U'}{len(obj)}|".encode())
        for i, value in enumerate(obj):
            _feed(h, value, f"{where}[{i}]")
    elif kind in _SCALARS:
        h.update(f"{kind.__name__[0]}{obj!r}|".encode())
    elif kind is str:
        data = obj.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)}|".encode())
        h.update(data)
    elif kind is bytes:
        h.update(f"B{len(obj)}|".encode())
        h.update(obj)
    elif kind in (torch.dtype, torch.device):
        h.update(f"O{obj}|".encode())
    else:
        raise TypeError(
            f"checkpoint entry {where or '<root>'} is a {kind.__module__}.{kind.__qualname__}, "
            f"which torch.load(weights_only=True) cannot load. Store tensors, numbers, strings, "
            f"None, torch dtypes/devices and dicts/lists/tuples of them (for example, return "
            f"float(x) or torch.as_tensor(array) from the state_dict() that produced it)."
        )


def content_hash(obj: Any) -> str:
    """SHA-256 (hex) of a checkpoint's content, the stored hash key excluded.

    Covers each tensor's dtype, shape and raw bytes, and every key, value and container around
    them, in order. The same content gives the same hash before saving and after loading.

    Raises:
        TypeError: ``obj`` holds a value that ``torch.load(weights_only=True)`` could not load;
            the message names its key path.

    >>> a = content_hash({"w": torch.zeros(3), "epoch": 1})
    >>> a == content_hash({"w": torch.zeros(3), "epoch": 1}), a == content_hash({"w": torch.zeros(3), "epoch": 2})
    (True, False)
    """
    h = hashlib.sha256()
    if isinstance(obj, Mapping):
        obj = {k: v for k, v in obj.items() if k != HASH_KEY}
    _feed(h, obj, "")
    return h.hexdigest()


def with_content_hash(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``payload`` with :data:`FORMAT_KEY` and :data:`HASH_KEY` set.

    >>> ckpt = with_content_hash({"epoch": 0})
    >>> ckpt[FORMAT_KEY], ckpt[HASH_KEY] == content_hash(ckpt)
    (1, True)
    """
    out: dict[str, Any] = {FORMAT_KEY: FORMAT_VERSION}
    out.update((k, v) for k, v in payload.items() if k not in (FORMAT_KEY, HASH_KEY))
    out[HASH_KEY] = content_hash(out)
    return out
