"""Clear errors for a batch the model cannot take (wrong shape, dtype or structure), at no cost.

Nothing is checked while batches are fine: a processor records the structure of the first
batch it forwards at each sub-batch index (once), and only when the model raises does
:func:`batch_failure` describe the failing batch next to that first one. The model's own error
is chained as the cause.

>>> spec = batch_spec((torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)))
>>> format_spec(spec)
'([0]: Tensor[8, 4] float32, [1]: Tensor[8] int64)'
>>> differences(batch_spec((torch.zeros(8, 5), torch.zeros(8, dtype=torch.long))), spec)
['[0]: shape (8, 5) vs (8, 4)']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from hat_ignite.errors import BatchError, HatIgniteError

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["MODEL_ERRORS", "batch_spec", "format_spec", "differences", "passes_through", "batch_failure"]

#: Exception types from a model call that :func:`batch_failure` explains (torch raises a
#: RuntimeError for shape/dtype mismatches; a wrong number of inputs is a TypeError).
MODEL_ERRORS = (RuntimeError, TypeError, ValueError, IndexError)

_MAX_ITEMS = 12

Spec = list  # [(path, description)] with description "Tensor[shape] dtype" or a type name


def batch_spec(batch: Any, path: str = "") -> Spec:
    """``[(path, description)]`` for every leaf of a (nested) batch, in order."""
    if isinstance(batch, torch.Tensor):
        shape = ", ".join(str(d) for d in batch.shape)
        return [(path or "<batch>", f"Tensor[{shape}] {str(batch.dtype).replace('torch.', '')}")]
    if isinstance(batch, Mapping):
        out: Spec = []
        for k, v in batch.items():
            out += batch_spec(v, f"{path}.{k}" if path else str(k))
        return out or [(path or "<batch>", "empty dict")]
    if isinstance(batch, (list, tuple)):
        out = []
        for i, v in enumerate(batch):
            out += batch_spec(v, f"{path}[{i}]")
        return out or [(path or "<batch>", f"empty {type(batch).__name__}")]
    return [(path or "<batch>", type(batch).__name__)]


def format_spec(spec: Spec) -> str:
    """One line: ``(path: description, ...)``, shortened after a dozen leaves."""
    shown = [f"{p}: {d}" for p, d in spec[:_MAX_ITEMS]]
    if len(spec) > _MAX_ITEMS:
        shown.append(f"... +{len(spec) - _MAX_ITEMS} more")
    return "(" + ", ".join(shown) + ")"


def _split(description: str) -> tuple[str, str]:
    if description.startswith("Tensor["):
        shape, _, dtype = description[len("Tensor["):].partition("] ")
        return shape, dtype
    return description, ""


def differences(actual: Spec, expected: Spec) -> list[str]:
    """What differs between two batch specs: missing/extra leaves, dtypes, and shapes.

    A shape difference only in the first (batch) dimension is not reported: the last batch of
    an epoch is often smaller.
    """
    expected_map, actual_map = dict(expected), dict(actual)
    out = [f"{p}: missing (the first batch has {d})" for p, d in expected if p not in actual_map]
    out += [f"{p}: not in the first batch (this batch has {d})" for p, d in actual if p not in expected_map]
    for path, desc in actual:
        if path not in expected_map:
            continue
        (shape, dtype), (shape0, dtype0) = _split(desc), _split(expected_map[path])
        if not dtype or not dtype0:
            if desc != expected_map[path]:
                out.append(f"{path}: {desc} vs {expected_map[path]}")
            continue
        if dtype != dtype0:
            out.append(f"{path}: dtype {dtype} vs {dtype0}")
        dims, dims0 = shape.split(", ") if shape else [], shape0.split(", ") if shape0 else []
        if len(dims) != len(dims0) or dims[1:] != dims0[1:]:
            out.append(f"{path}: shape ({shape}) vs ({shape0})")
    return out


def passes_through(exc: BaseException) -> bool:
    """Errors re-raised unchanged: ours (they already say where) and running out of memory."""
    return isinstance(exc, (HatIgniteError, torch.OutOfMemoryError))


def batch_failure(
    engine: LoopBase, batch: Any, batch_idx: int, first: tuple[int, Spec] | None, exc: BaseException
) -> BatchError:
    """A :class:`~hat_ignite.errors.BatchError` for the model raising ``exc`` on ``batch``.

    Args:
        engine: the running engine (for epoch and step ids).
        batch: the batch the model received.
        batch_idx: its index within the step (0 unless several batches make a step).
        first: ``(engine iteration, spec)`` of the first batch forwarded at this index.
        exc: what the model raised.
    """
    state = engine.state
    where = (
        f"epoch_id={state.epoch - 1}, step_id={getattr(state, 'step_id', state.iteration - 1)}, "
        f"global_step_id={state.iteration - 1}, batch_idx={batch_idx}"
    )
    spec = batch_spec(batch)
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = (
        f"The model failed on the batch at {where}: {type(exc).__name__}: {detail}\n"
        f"  this batch:  {format_spec(spec)}\n"
    )
    if first is None or first[0] == state.iteration:
        text += (
            "  it is the first batch at this index, so there is nothing to compare it with: check "
            "that the data loader yields what the model's forward() expects."
        )
    else:
        diff = differences(spec, first[1])
        text += f"  first batch: {format_spec(first[1])}\n"
        text += (
            f"  differences: {'; '.join(diff)}. Fix the dataset/collate function that produced this batch."
            if diff else
            "  the structure matches the first batch, so the failure depends on the values or on the "
            "model's state; see the chained error."
        )
    return BatchError(text)
