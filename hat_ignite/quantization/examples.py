"""What a converter traces with, when a HAT config gives it nothing.

HAT's converters need no example inputs; ``torch.export`` does. A prepare converter
(``Float2Calibration`` / ``Float2QAT``) given neither ``example_inputs`` nor
``example_data_loader`` takes, in this order:

1. the first step of the running engine's data loader, as the engine's batch processor gives it
   to the model (batch transforms applied; a ``MultiBatchProcessor`` tuple split into its
   batches): :func:`stage_examples`;
2. for a stage without data (HAT's export-only ``int_infer_trainer``), the inputs recorded in the
   checkpoint that a later ``LoadCheckpoint`` of the same pipeline loads: every prepared module
   stores the structure, shapes and dtypes of the inputs it was exported with in its
   ``state_dict`` (see :mod:`~hat_ignite.quantization.record`), so the calibration or QAT
   checkpoint carries what the export needs. :func:`apply_converters` tells each converter which
   checkpoints are loaded after it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable

import torch
from torch import nn

from hat_ignite.errors import QuantizationError

__all__ = [
    "stage_examples", "example_batches", "example_batch", "callbacks_trace_inputs", "trace_examples", "apply_converters",
    "later_checkpoints",
]

logger = logging.getLogger(__name__)

#: ``(data_loader, batch_processor)`` of the engine whose ``model_convert_pipeline`` runs.
_STAGE: ContextVar[tuple[Any, Any, Any]] = ContextVar("hat_ignite_stage_examples", default=(None, None, None))
#: Checkpoint paths the converters after the running one load, nearest first.
_LATER: ContextVar[tuple[str, ...]] = ContextVar("hat_ignite_later_checkpoints", default=())


@contextmanager
def stage_examples(data_loader: Any, batch_processor: Any = None, trace_inputs: Any = None) -> Iterator[None]:
    """Let converters run inside this block trace with ``data_loader``'s first step by default.

    An engine runs its ``model_convert_pipeline`` inside this block with its own data loader
    (a ``Predictor`` given several: the first) and batch processor, so a HAT config's converters
    work as written and trace with the batch exactly as the model receives it in that stage:
    ``batch_processor.model_batches(batch)`` (its batch transforms applied, a
    ``MultiBatchProcessor`` tuple split). Converters given ``example_inputs`` or
    ``example_data_loader`` use those. ``trace_inputs``: what the engine's callbacks trace the
    model with (:func:`trace_examples`).

    Example:
        >>> with stage_examples([torch.zeros(2, 3)]):
        ...     tuple(example_batch(None, None, "Float2QAT").shape)
        (2, 3)
    """
    token = _STAGE.set((data_loader, batch_processor, trace_inputs))
    try:
        yield
    finally:
        _STAGE.reset(token)


def example_batches(example_inputs: Any, example_data_loader: Any, who: str, required: bool = True) -> list[Any]:
    """The batches to trace with, each as the model receives it; ``[]`` when there is none and not ``required``.

    ``example_inputs`` is one batch exactly as the model receives it. A batch of
    ``example_data_loader``, else of the running engine's data loader (:func:`stage_examples`),
    goes through the engine's batch processor first (``model_batches``).

    Raises:
        QuantizationError: ``required`` and there is nothing to trace with; a loader yields nothing.
    """
    if example_inputs is not None:
        return [example_inputs]
    loader, processor, _ = _STAGE.get()
    if example_data_loader is None:
        if loader is None:
            if not required:
                return []
            raise QuantizationError(
                f"{who}: give example_inputs (a batch as the batch processor passes it to the model) or "
                f"example_data_loader (its first batch is used); torch.export needs real inputs to trace, "
                f"and this engine has no data_loader to take a batch from."
            )
        logger.info("%s: tracing with the first batch of the engine's data_loader (no example_inputs given).", who)
        example_data_loader = loader
    with torch.random.fork_rng(devices=[]):  # a shuffling loader draws its order: leave the run's RNG alone
        batch = _first_batch(example_data_loader, who)
    model_batches: Callable[[Any], list[Any]] | None = getattr(processor, "model_batches", None)
    return model_batches(batch) if model_batches is not None else [batch]


def example_batch(example_inputs: Any, example_data_loader: Any, who: str) -> Any:
    """The first of :func:`example_batches` (the batch a single-batch step gives the model)."""
    return example_batches(example_inputs, example_data_loader, who)[0]


def _first_batch(example_data_loader: Any, who: str) -> Any:
    if isinstance(example_data_loader, Mapping) and "type" in example_data_loader:
        from hat_ignite.registry import build_from_cfg

        example_data_loader = build_from_cfg(example_data_loader, key_path=f"{who}.example_data_loader")
    if not isinstance(example_data_loader, Iterable):
        raise QuantizationError(f"{who}: example_data_loader is a {type(example_data_loader).__name__}, not an iterable of batches.")
    in_process = _first_batch_in_process(example_data_loader)
    if in_process is not None:
        return in_process[0]
    for batch in example_data_loader:
        return batch
    raise QuantizationError(f"{who}: example_data_loader yielded no batch; give a non-empty loader or example_inputs.")


def _first_batch_in_process(loader: Any) -> tuple[Any] | None:
    """The first batch of a map-style ``DataLoader`` with workers, made in this process.

    Iterating such a loader starts its worker processes (seconds each under ``spawn``) for one
    batch; its sampler, dataset and ``collate_fn`` give the same batch here. ``None`` for any
    other loader (iterated as it is).
    """
    if not isinstance(loader, torch.utils.data.DataLoader) or not loader.num_workers:
        return None
    if isinstance(loader.dataset, torch.utils.data.IterableDataset) or loader.batch_sampler is None:
        return None
    try:
        for indices in loader.batch_sampler:
            return (loader.collate_fn([loader.dataset[i] for i in indices]),)
    except Exception as exc:  # a dataset that needs its worker (worker_init_fn ...): iterate the loader
        logger.debug("first batch made in the workers: in this process it raised %r", exc)
    return None


def callbacks_trace_inputs(callbacks: Sequence[Any] | None) -> Any:
    """The ``trace_inputs`` one of an engine's callbacks (or callback configs) traces the model with
    (HAT's ``SaveTraced``); ``None`` when none does.

    >>> callbacks_trace_inputs([dict(type="Checkpoint"), dict(type="SaveTraced", trace_inputs=dict(img=1))])
    {'img': 1}
    """
    for callback in callbacks or ():
        found = callback.get("trace_inputs") if isinstance(callback, Mapping) else getattr(callback, "trace_inputs", None)
        if found is not None:
            return found
    return None


def trace_examples() -> list[Any]:
    """The inputs the running engine's callbacks trace its model with (``SaveTraced(trace_inputs=...)``:
    HAT's ``deploy_inputs``), as one batch; ``[]`` when none does. An export-only stage's deploy
    model takes these, whatever the batches of the model it was trained as held."""
    trace_inputs = _STAGE.get()[2]
    return [] if trace_inputs is None else [trace_inputs]


def later_checkpoints() -> tuple[str, ...]:
    """The ``checkpoint_path`` of every converter after the running one (see :func:`apply_converters`)."""
    return _LATER.get()


def apply_converters(converters: Sequence[Callable[[nn.Module], Any]], model: nn.Module,
                     check: Callable[[int, Any, Any], None] | None = None) -> Any:
    """Apply ``converters`` to ``model`` in order; each runs knowing the checkpoints loaded after it.

    Args:
        converters: ``model -> model`` callables; one with a ``checkpoint_path`` (``LoadCheckpoint``)
            loads that file.
        model: the model.
        check: called as ``check(index, converter, result)`` after each converter.

    Returns:
        The converted model.
    """
    outer = _LATER.get()
    for i, convert in enumerate(converters):
        later = [
            os.fspath(path) for c in converters[i + 1:]
            if isinstance(path := getattr(c, "checkpoint_path", None), (str, os.PathLike))
        ]
        token = _LATER.set((*later, *outer))
        try:
            model = convert(model)
        finally:
            _LATER.reset(token)
        if check is not None:
            check(i, convert, model)
    return model
