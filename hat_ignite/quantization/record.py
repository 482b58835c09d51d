"""The record a prepared module keeps of its export, so a stage without data can prepare it again.

Every :class:`~hat_ignite.quantization.prepared.PreparedModule` keeps where it sits in the
model, its stage, and the structure, shapes and dtypes of the inputs it was exported with; the
``Checkpoint`` callback saves these records (checkpoint key ``prepared_modules``). Any
checkpoint of a calibrated or QAT model therefore carries what exporting it again needs: HAT's
export-only ``int_infer_trainer`` (``Float2QAT`` -> ``LoadCheckpoint(qat checkpoint)`` ->
``QAT2Quantize``, no data) prepares the same submodules from inputs made to that description
(:func:`make_inputs`), then loads the checkpoint. A record holds only lists, dicts, strings and
numbers, so checkpoints still load with ``weights_only=True``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hat_ignite.quantization.capture import Captured, varying_leaves

__all__ = ["RECORD_MARK", "describe_inputs", "make_inputs", "prepared_record", "read_records"]

logger = logging.getLogger(__name__)

#: The key marking a prepared module's record (its value: the record's format version).
RECORD_MARK = "hat_ignite_prepared"


def describe_inputs(value: Any) -> Any:
    """The structure, shapes and dtypes of ``value`` (tensors, containers of them, plain constants).

    >>> describe_inputs((torch.zeros(2, 3, dtype=torch.uint8), {"k": None}))
    {'tuple': [{'tensor': [2, 3], 'dtype': 'uint8'}, {'dict': [['k', {'value': None}]]}]}
    """
    if isinstance(value, torch.Tensor):
        return {"tensor": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, Mapping):
        return {"dict": [[key, describe_inputs(item)] for key, item in value.items()]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__ if type(value) in (list, tuple) else "tuple": [describe_inputs(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"unsupported": type(value).__qualname__}


def make_inputs(spec: Any) -> Any:
    """Inputs matching a :func:`describe_inputs` description: zero tensors of the recorded shapes and dtypes.

    >>> make_inputs(describe_inputs((torch.ones(2, 3), [1, "a"])))
    (tensor([[0., 0., 0.],
            [0., 0., 0.]]), [1, 'a'])

    Raises:
        ValueError: the description holds a value that cannot be made again.
    """
    if "tensor" in spec:
        return torch.zeros(spec["tensor"], dtype=getattr(torch, spec["dtype"]))
    if "dict" in spec:
        return {key: make_inputs(item) for key, item in spec["dict"]}
    if "tuple" in spec:
        return tuple(make_inputs(v) for v in spec["tuple"])
    if "list" in spec:
        return [make_inputs(v) for v in spec["list"]]
    if "value" in spec:
        return spec["value"]
    raise ValueError(f"an input of type {spec.get('unsupported', '?')} was recorded by its type only")


def prepared_record(path: str, stage: str, qat_mode: str | None, inputs: Captured) -> dict[str, Any]:
    """The record of a module prepared at ``path`` from ``inputs``: their structure, shapes and
    dtypes, and the dims exported dynamic besides the batch (``varying``, see
    :func:`~.capture.varying_leaves`)."""
    return {
        RECORD_MARK: 1, "path": path, "stage": stage, "qat_mode": qat_mode,
        "args": describe_inputs(tuple(inputs.args)), "kwargs": describe_inputs(dict(inputs.kwargs)),
        "varying": varying_leaves(inputs),
    }


def read_records(paths: Sequence[str]) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """The prepared-module records of the first of ``paths`` that has any: ``(path, {module path: record})``.

    Files that are missing or unreadable are passed over (the ``LoadCheckpoint`` that loads
    them reports them); the file is memory-mapped, not read whole.
    """
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # reported by the LoadCheckpoint that loads it
            logger.debug("no prepared-module records read from %s: %r", path, exc)
            continue
        saved = checkpoint.get("prepared_modules") if isinstance(checkpoint, Mapping) else None
        records = {
            r["path"]: dict(r) for r in saved or () if isinstance(r, Mapping) and r.get(RECORD_MARK) and "path" in r
        }
        if records:
            return path, records
    return None
