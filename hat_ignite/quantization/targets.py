"""What a prepare converter exports: which modules, and the inputs each is exported with.

:func:`find_targets` decides, in this order:

* **modules**: the converter's ``modules`` when given; else those recorded in the checkpoint a
  later ``LoadCheckpoint`` of the pipeline loads (so its weights fit); else the model, or its
  submodules that run alike in training and eval (:func:`~.select.stable_modules`);
* **inputs**: what each receives when the model runs on the example batches (every call: dims that
  change between calls are exported dynamic); without data (HAT's export-only ``int_infer``
  stage), what each receives when the model runs on batches made as the checkpoint records them,
  or else on what the engine's ``SaveTraced`` traces it with (HAT's ``deploy_inputs``), so a deploy
  model that calls a module otherwise (without its labels) is exported as it calls it; failing
  both, the inputs recorded for each module.

After preparing, :func:`check_called` runs the model once more and refuses one that no longer calls
a prepared module (it keeps its own references to its submodules).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Sequence

import torch
from torch import nn

from hat_ignite.errors import QuantizationError
from hat_ignite.quantization.capture import Captured, capture_inputs, leaves_varying, model_args
from hat_ignite.quantization.examples import example_batches, later_checkpoints, trace_examples
from hat_ignite.quantization.prepared import prepared_modules
from hat_ignite.quantization.record import describe_inputs, make_inputs, read_records
from hat_ignite.quantization.select import stable_modules

__all__ = ["Targets", "find_targets", "check_called"]

logger = logging.getLogger(__name__)

Found = tuple[str, dict[str, Any]]


class Targets(NamedTuple):
    """The modules to prepare, their inputs, and the batches the model ran on (as records describe
    them, and themselves; empty when the inputs came from the records alone)."""

    modules: list[str]
    inputs: dict[str, Captured]
    described: list[Any]
    batches: list[Any]


def find_targets(model: nn.Module, example_inputs: Any, example_data_loader: Any, modules: Sequence[str] | None,
                 who: str) -> Targets:
    """The modules to prepare and their inputs (see the module docstring).

    Raises:
        QuantizationError: there is nothing to trace with, or the model fails on it.
    """
    batches = example_batches(example_inputs, example_data_loader, who, required=False)
    found = None if batches and modules is not None else read_records(later_checkpoints())
    if not batches and found is None:
        raise QuantizationError(
            f"{who}: give example_inputs (a batch as the model receives it) or example_data_loader (its "
            f"first batch is used): torch.export needs real inputs to trace, this engine has no data_loader "
            f"to take a batch from, and no LoadCheckpoint after {who} in the pipeline loads a checkpoint of "
            f"the calibration or QAT stage (which records the inputs the export needs)."
        )
    if modules is not None:
        names = list(modules)
    elif found is not None:
        names = sorted(found[1])
        logger.info("%s: preparing %s, as in %s.", who, [m or "the model" for m in names], found[0])
    else:
        names = stable_modules(model, batches, who)
    if found is not None and not batches:
        return _without_data(model, found, names, who)
    return Targets(names, capture_inputs(model, batches, names, who), [describe_inputs(b) for b in batches], batches)


def _without_data(model: nn.Module, found: Found, names: list[str], who: str) -> Targets:
    """Run the model on batches made as the checkpoint records them, else on what the engine's
    ``SaveTraced`` traces it with (HAT's ``deploy_inputs``), and capture what the modules get; else
    the inputs recorded for each module."""
    checkpoint, records = found
    described = next((r["batches"] for r in records.values() if r.get("batches")), None)
    tries = []
    if described is not None:
        try:
            tries.append((f"batches made as {checkpoint} records", [make_inputs(spec) for spec in described]))
        except (KeyError, ValueError, TypeError) as exc:
            logger.info("%s: the batches %s records cannot be made again (%s).", who, checkpoint, exc)
    if trace_examples():
        tries.append(("the trace_inputs of the engine's callbacks", trace_examples()))
    for what, batches in tries:
        try:
            inputs = capture_inputs(model, batches, names, who)
        except QuantizationError as exc:
            logger.info("%s: %s does not run on %s (%s).", who, type(model).__name__, what, exc.__cause__ or exc)
            continue
        return Targets(names, inputs, [describe_inputs(b) for b in batches], batches)
    logger.info("%s: exporting each module with the inputs %s records for it.", who, checkpoint)
    return Targets(names, {path: _recorded_inputs(found, path, who) for path in names}, [], [])


def _recorded_inputs(found: Found, path: str, who: str) -> Captured:
    checkpoint, records = found
    record = records.get(path)
    if record is None:
        raise QuantizationError(
            f"{who}: modules names {path!r}, but {checkpoint} holds prepared modules {sorted(records)}; "
            f"name those (or leave modules out to prepare them)."
        )
    try:
        args, kwargs = make_inputs(record["args"]), make_inputs(record["kwargs"])
        return Captured(args, kwargs, leaves_varying(args, kwargs, record.get("varying", [])))
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise QuantizationError(
            f"{who}: the inputs {path or 'the model'!r} was exported with cannot be made again from the "
            f"record in {checkpoint} ({exc}); give example_inputs."
        ) from exc


@torch.no_grad()
def check_called(model: nn.Module, batches: list[Any], who: str) -> None:
    """Refuse a model that, run on ``batches``, does not call every module prepared in it.

    A model that keeps its own references to its submodules (a graph of node modules built at
    construction) would go on running the float modules the converter replaced, and QAT would
    train a model that is never quantized.

    Raises:
        QuantizationError: names the prepared modules the model did not call.
    """
    prepared = prepared_modules(model)
    if not batches or not prepared:
        return
    called: set[int] = set()
    handles = [m.register_forward_pre_hook(lambda mod, args: called.add(id(mod))) for m in prepared]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        for batch in batches:
            model(*model_args(batch))
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    silent = [m.qname or "the model" for m in prepared if id(m) not in called]
    if silent:
        raise QuantizationError(
            f"{who}: {type(model).__name__} did not call the prepared {silent} when it ran after preparing: it "
            f"still calls the float modules they replaced (it keeps its own references to its submodules, e.g. a "
            f"graph of node modules built at construction). Let its forward look submodules up as attributes "
            f"(self.<name>), or prepare the whole model."
        )
