"""``hat-predict CONFIG [--stage float] [--ckpt PATH] [--opts KEY=VALUE ...] [--work-dir DIR]``.

Builds the stage's ``{stage}_predictor``, loads the trained weights into its model, runs it and
writes the metrics to ``metrics.json`` in the work dir under the key ``{stage}_predict`` (next
to the ``{stage}_train`` entry ``hat-train`` wrote). The weights come from ``--ckpt``, else from
the config's ``{stage}_checkpoint`` key; with neither, the model runs with the weights the config
builds (a warning says so); a file the stage's own ``LoadCheckpoint`` (in its
``model_convert_pipeline``) loads is not loaded again. Checkpoints are loaded with
:class:`hat_ignite.checkpoint.restore.LoadCheckpoint`: weights-only, hash-verified, and
the weights must fit the model exactly. HAT's ``tools/predict.py`` spelling
(``-c CONFIG -s STAGE --ckpt PATH --opts KEY VALUE ...``) works too.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Sequence

from hat_ignite.cli.common import (
    CliError,
    WorkDir,
    attach_log_file,
    build_stage,
    command_line,
    describe_engine,
    dump_config,
    load_config,
    export_hat_environment,
    make_parser,
    parse_arguments,
    run_main,
    seed_everything,
    setup_logging,
    write_metrics,
)

from hat_ignite.cli.collector import collector_phases, imports_done, loop_starts
from hat_ignite.cli.distributed import device_ids_of, parse_device_ids
from hat_ignite.cli.stages import check_stage_inputs, clear_interrupted_model_write, record_lineage, save_stage_model
from hat_ignite.config import Config
from hat_ignite.errors import CheckpointError

__all__ = ["main"]

logger = logging.getLogger("hat_ignite.cli.predict")

DESCRIPTION = """Run one stage's predictor of a hat-ignite config on trained weights.

Builds the config's {stage}_predictor (e.g. float_predictor), loads --ckpt (or the config's
{stage}_checkpoint) into its model, runs it, and writes the metrics to metrics.json in the work dir."""


def _set_device(cfg: Config, stage_key: str, given: list[int] | None) -> None:
    """Predict on ``--device-ids`` (or the config's ``device_ids``): one process, the first GPU."""
    import torch

    ids = device_ids_of(cfg, given, None, torch.cuda.is_available())
    if ids:
        if len(ids) > 1:
            logger.info("hat-predict runs in one process: predicting on GPU %d of %s", ids[0], ids)
        cfg[stage_key]["device"] = ids[0]


@collector_phases
def _predict(argv: Sequence[str]) -> int:
    parser = make_parser("hat-predict", DESCRIPTION, argv)
    parser.add_argument("--ckpt", help="checkpoint to load (default: the config's {stage}_checkpoint)")
    parser.add_argument("--ckpt-allow-miss", action="store_true",
                        help="load a --ckpt that lacks some of the model's entries (they keep their values)")
    parser.add_argument("--ckpt-ignore-extra", action="store_true",
                        help="load a --ckpt that has entries the model does not have (they are ignored)")
    parser.add_argument("--dry-run", action="store_true", help="build everything, describe the predictor, and exit")
    parser.add_argument(
        "--device-ids", "-ids", type=parse_device_ids,
        help="GPU to predict on (one process: the first id; default: the config's device_ids, as HAT)",
    )
    args = parse_arguments(parser, argv)
    setup_logging(args.debug)
    export_hat_environment(args)
    cfg, work_path = load_config(
        args.config, args.opts, args.work_dir, hat_alias=not args.no_hat_alias, overwrite=args.opts_overwrite,
    )
    stage_key = cfg.stage_key(args.stage, "predictor")
    _set_device(cfg, stage_key, args.device_ids)
    imports_done()
    ckpt = args.ckpt if args.ckpt is not None else cfg.get(f"{args.stage}_checkpoint")
    if ckpt is not None and (not isinstance(ckpt, str) or not os.path.isfile(ckpt)):
        source = "--ckpt" if args.ckpt is not None else f"{cfg.filename}: {args.stage}_checkpoint"
        raise CliError(
            f"{source}: checkpoint {ckpt!r} is not a file. Train the stage first (hat-train "
            f"{args.config} --stage {args.stage}) or pass the path of a checkpoint with --ckpt."
        )
    inputs = check_stage_inputs(cfg, args.stage, stage_key, args.config)
    ckpt_loaded_by_stage = ckpt is not None and os.path.abspath(ckpt) in inputs  # by the stage's LoadCheckpoint
    work_dir = WorkDir(work_path)
    seed_everything(cfg)
    try:
        predictor = build_stage(cfg, stage_key)
        if ckpt is not None and not ckpt_loaded_by_stage:
            from hat_ignite.checkpoint.restore import LoadCheckpoint

            try:
                LoadCheckpoint(ckpt, allow_miss=args.ckpt_allow_miss, ignore_extra=args.ckpt_ignore_extra)(
                    predictor.model)
            except CheckpointError as exc:
                if "does not fit" not in str(exc):
                    raise
                raise CliError(f"{exc} From the command line: --ckpt-allow-miss / --ckpt-ignore-extra.") from exc
        elif not inputs:  # a model_convert_pipeline that loads checkpoints needs no --ckpt
            logger.warning(
                "no checkpoint (no --ckpt, no %s_checkpoint in the config): predicting with the "
                "weights the config builds", args.stage,
            )
    except BaseException:
        work_dir.discard()
        raise
    if args.dry_run:
        work_dir.discard()
        print(describe_engine(predictor, stage_key))
        print(f"checkpoint: {ckpt}\nwork dir: {work_path} (a dry run creates nothing)")
        return 0

    work_dir.create(lock_command=command_line("hat-predict", argv))
    attach_log_file(work_dir.file(f"{args.stage}_predict.log"))
    dump_config(cfg, work_dir.file(f"{args.stage}_predict_config.py"))
    clear_interrupted_model_write(cfg, args.stage, work_path)
    loop_starts()
    start = time.perf_counter()
    try:
        predictor.fit()
    except Exception as exc:
        raise CliError(f"predicting with {stage_key} failed: {type(exc).__name__}: {exc}") from exc
    from hat_ignite.cli.results import updater_values
    from hat_ignite.metrics.base import metric_name_values

    values = updater_values(predictor.callbacks)  # its MetricUpdaters' own metrics=[...], or the predictor's
    record = {
        "stage": args.stage,
        "config": cfg.filename,
        "checkpoint": os.path.abspath(ckpt) if ckpt else None,
        "steps": predictor.state.iteration,
        "seconds": round(time.perf_counter() - start, 3),
        "metrics": values if values is not None else dict(metric_name_values(predictor.metrics)),
    }
    write_metrics(work_dir.file("metrics.json"), f"{args.stage}_predict", record)
    logger.info("metrics %s -> %s", record["metrics"], work_dir.file("metrics.json"))
    saved = save_stage_model(cfg, args.stage, predictor, work_path)
    record_lineage(
        work_path, args.stage, "hat-predict", cfg.filename, work_dir.file(f"{args.stage}_predict_config.py"),
        inputs + ([os.path.abspath(ckpt)] if ckpt and not ckpt_loaded_by_stage else []), [saved] if saved else [],
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hat-predict``; returns the process exit code.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).
    """
    return run_main("hat-predict", _predict, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
