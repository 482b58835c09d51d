"""Chaining stages: ``float`` -> ``calibration`` -> (``qat``) -> ``int_infer``.

A stage's inputs are the files its config loads with ``LoadCheckpoint`` (anywhere in the stage's
config, usually in ``model_convert_pipeline``). A stage's outputs are ``{stage}_checkpoint`` (the
best checkpoint a trainer writes) and, for a predictor, ``{stage}_model``: the converted model
saved as a ``torch.export`` program. The stage that makes a file is found from those keys, so a
missing input fails before anything is built, naming the file and the command that writes it.

Every finished stage records its lineage in ``lineage.json`` in the work dir, under the stage
name: the command, the config and the SHA-256 of its resolved copy, and the path and SHA-256 of
each input and output file, so ``lineage[stage]["inputs"]`` can be matched against the outputs of
the stage before it.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Mapping
from typing import Any

from hat_ignite.cli.common import CliError, write_metrics
from hat_ignite.config import Config

__all__ = [
    "LINEAGE_FILE", "stage_inputs", "producer", "check_stage_inputs", "stage_model_path",
    "clear_interrupted_model_write", "save_stage_model", "record_lineage",
]

logger = logging.getLogger("hat_ignite.cli.stages")

#: The lineage file in the work dir.
LINEAGE_FILE = "lineage.json"
_OUTPUT_SUFFIXES = ("_checkpoint", "_model")


def _is_load_checkpoint(node: Mapping[str, Any]) -> bool:
    kind = node.get("type")
    name = kind if isinstance(kind, str) else getattr(kind, "__name__", "")
    return name.rsplit(".", 1)[-1].rsplit(":", 1)[-1] == "LoadCheckpoint"


def stage_inputs(node: Any) -> list[str]:
    """The ``checkpoint_path`` of every ``LoadCheckpoint`` config inside ``node``, in order.

    >>> stage_inputs({"type": "Trainer", "model_convert_pipeline": [
    ...     {"type": "LoadCheckpoint", "checkpoint_path": "a.pth.tar"}, {"type": "Calibration2QAT"}]})
    ['a.pth.tar']
    """
    found: list[str] = []
    if isinstance(node, Mapping):
        if _is_load_checkpoint(node) and isinstance(node.get("checkpoint_path"), str):
            found.append(node["checkpoint_path"])
        for value in node.values():
            found.extend(p for p in stage_inputs(value) if p not in found)
    elif isinstance(node, (list, tuple)):
        for value in node:
            found.extend(p for p in stage_inputs(value) if p not in found)
    return found


def producer(cfg: Config, path: str) -> str | None:
    """The stage whose ``{stage}_checkpoint`` / ``{stage}_model`` key names ``path``, if any."""
    target = os.path.abspath(path)
    for key in cfg.keys():
        for suffix in _OUTPUT_SUFFIXES:
            value = cfg.get(key)
            if key.endswith(suffix) and isinstance(value, str) and os.path.abspath(value) == target:
                return key[: -len(suffix)]
    return None


def check_stage_inputs(cfg: Config, stage: str, stage_key: str, config_path: str) -> list[str]:
    """Fail fast when a file the stage loads is missing; return the absolute input paths.

    Raises:
        CliError: names the missing file, the stage that needs it and the command writing it.
    """
    inputs = [os.path.abspath(p) for p in stage_inputs(cfg[stage_key])]
    for path in inputs:
        if os.path.isfile(path):
            continue
        maker = producer(cfg, path)
        if maker is None:
            how = "Fix the LoadCheckpoint checkpoint_path in the config or pass it with --opts."
        else:
            command = "hat-train" if f"{maker}_trainer" in cfg.keys() else "hat-predict"
            how = (
                f"It is written by stage {maker!r}: run `{command} {config_path} --stage {maker}` first "
                f"(with the same --work-dir / --opts)."
            )
        raise CliError(f"stage {stage!r} ({stage_key}) needs {path}, which does not exist. {how}")
    return inputs


def stage_model_path(cfg: Config, stage: str, work_dir: str) -> tuple[str, bool]:
    """Where a predictor stage saves its model: the config's ``{stage}_model`` (``named``: True),
    else ``{stage}-model.pt2`` in ``work_dir``."""
    named = cfg.get(f"{stage}_model")
    return (str(named), True) if named else (os.path.join(work_dir, f"{stage}-model.pt2"), False)


def clear_interrupted_model_write(cfg: Config, stage: str, work_dir: str) -> list[str]:
    """Remove what a killed earlier write of the stage's model left beside it (logged); return it.

    Called once the run holds the work dir, before the stage runs, so a run that fails later
    still clears the stale files.
    """
    from hat_ignite.pt2 import remove_stale_temp_files

    return remove_stale_temp_files(stage_model_path(cfg, stage, work_dir)[0])


def save_stage_model(cfg: Config, stage: str, engine: Any, work_dir: str) -> str | None:
    """Save a predictor stage's model as a ``torch.export`` program; return the path, or ``None``.

    The path is the config's ``{stage}_model`` when it names one; else, for a model holding int8
    modules (the ``int_infer`` stage), ``{stage}-model.pt2`` in ``work_dir``; a float model without
    the key is not saved. The model is exported on the first batch of the engine's data loader, as
    its batch processor gives it to the model (batch transforms applied). A model ``torch.export``
    cannot capture whole (post-processing with data-dependent shapes, say) fails the stage when the
    config names the file, and is logged and skipped when the file is only the default.
    """
    from hat_ignite.errors import QuantizationError
    from hat_ignite.quantization.prepared import prepared_modules

    path, named = stage_model_path(cfg, stage, work_dir)
    if not named and not any(m.stage == "quantized" for m in prepared_modules(engine.model)):
        return None
    from hat_ignite.quantization.io import save_quantized_model

    batch = next(iter(engine.data_loader))
    model_batches = getattr(engine.batch_processor, "model_batches", None)
    if model_batches is not None:
        batch = model_batches(batch)[0]
    try:
        saved = save_quantized_model(engine.model, path, batch)
    except QuantizationError as exc:
        if named:
            raise
        logger.warning(
            "the %s model is not saved as %s: %s To save it, export a model without that code (HAT's "
            "deploy_model, e.g. with SaveTraced in the %s_trainer), or name the file with %s_model.",
            stage, path, exc, stage, stage,
        )
        return None
    logger.info("saved the %s model to %s", stage, saved)
    return saved


def _entry(path: str) -> dict[str, Any]:
    from hat_ignite.quantization.io import file_sha256

    path = os.path.abspath(path)
    return {"path": path, "sha256": file_sha256(path)} if os.path.isfile(path) else {"path": path, "sha256": None}


def record_lineage(
    work_dir: str, stage: str, command: str, config: str, resolved_config: str, inputs: list[str], outputs: list[str],
) -> dict[str, Any]:
    """Write the stage's lineage into ``work_dir/lineage.json`` (other stages are kept)."""
    record = {
        "stage": stage,
        "command": command,
        "config": config,
        "resolved_config": _entry(resolved_config),
        "inputs": [_entry(p) for p in inputs],
        "outputs": [_entry(p) for p in outputs if p],
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_metrics(os.path.join(work_dir, LINEAGE_FILE), stage, record)
    return record
