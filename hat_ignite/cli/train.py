"""``hat-train CONFIG [--stage float] [--opts KEY=VALUE ...] [--work-dir DIR] [--resume [PATH|auto]] [--dry-run]``.

Loads the config, applies the overrides, seeds from the config's ``seed``, builds the stage's
``{stage}_trainer`` with the registry and trains it. The work dir receives the log
(``{stage}_train.log``), the resolved config (``{stage}_train_config.py``), whatever the
callbacks save (checkpoints ...) and, at the end, the final metrics in ``metrics.json`` under the
key ``{stage}_train``. It is created only once the config has loaded and the trainer has been
built, so a bad config leaves nothing behind. ``--resume`` continues a run from a checkpoint
(see :mod:`hat_ignite.cli.resume`). SIGTERM or SIGINT stops training at the next step boundary:
the ``Checkpoint`` callback writes a resumable checkpoint, ``metrics.json`` is written with
``"stopped_by_signal": true``, the log names the command that resumes, and the exit code is 143
(SIGTERM) or 130 (SIGINT); a second signal exits at once. In a multi-process run the signal may
reach every process, one rank, or only the launching process: all ranks stop after the same
step and the job exits the same way (see :mod:`hat_ignite.cli.distributed`).

HAT's ``tools/train.py`` command line works as it is: ``hat-train -c CONFIG -s float --opts KEY
VALUE ...`` (see ``docs/hat-migration.md``); the config may import from ``hat.*`` unless
``--no-hat-alias`` is given.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Sequence

from hat_ignite.cli.common import (
    CliError,
    WorkDir,
    attach_log_file,
    build_stage,
    describe_engine,
    load_config,
    loss_value,
    export_hat_environment,
    make_parser,
    parse_arguments,
    run_main,
    seed_everything,
    setup_logging,
    write_metrics,
)

from hat_ignite.cli.distributed import (
    add_distributed_arguments,
    device_ids_of,
    distributed_stage,
    follow_launcher_signals,
    is_main_process,
)
from hat_ignite.cli.resume import add_resume_argument, apply_resume, install_stop_signals, stop_report
from hat_ignite.cli.stages import check_stage_inputs, record_lineage

__all__ = ["main"]

logger = logging.getLogger("hat_ignite.cli.train")

DESCRIPTION = """Train one stage of a hat-ignite config.

Builds the config's {stage}_trainer (e.g. float_trainer) and calls fit(). Logs, the resolved
config, checkpoints and metrics.json go to the work dir."""


def _lr_of(trainer: Any) -> float | None:
    groups = getattr(trainer.optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


#: The progress bar shows the loss and lr of every this many steps.
_BAR_REFRESH = 20


def _attach_progress(trainer: Any) -> None:
    """Rank 0: a tqdm bar (loss, lr of every 20th step) when stderr is a terminal; otherwise a log
    line per epoch.

    Steps are logged as well when the trainer's ``log_interval`` is set.
    """
    import ignite.distributed as idist
    from ignite.engine import Events

    if idist.get_rank() != 0:
        return
    if sys.stderr.isatty():
        from ignite.handlers import ProgressBar

        shown: dict[str, float] = {}

        def loss_and_lr(_output: Any) -> dict[str, float]:
            # the loss is read (a host-device sync on a GPU) every _BAR_REFRESH steps, not every step
            if not shown or trainer.state.iteration % _BAR_REFRESH == 0:
                values = {"loss": loss_value(trainer.state.losses), "lr": _lr_of(trainer)}
                shown.clear()
                shown.update({k: v for k, v in values.items() if v is not None})
            return shown

        ProgressBar(persist=True).attach(trainer, output_transform=loss_and_lr)
        return
    start = time.perf_counter()

    def epoch_line(engine: Any) -> None:
        value, lr = loss_value(engine.state.losses), _lr_of(engine)
        loss = f", last loss {value:.4f}" if value is not None else ""
        loss += f", lr {lr:.4g}" if lr is not None else ""
        logger.info(
            "epoch %d/%s done: %d steps%s, %.1f s",
            engine.state.epoch, engine.state.max_epochs or "?", engine.state.iteration, loss,
            time.perf_counter() - start,
        )

    trainer.add_event_handler(Events.EPOCH_COMPLETED, epoch_line)


def _metrics_record(trainer: Any, stage: str, config: str, seconds: float) -> dict[str, Any]:
    from hat_ignite.metrics.base import metric_name_values

    state = trainer.state
    return {
        "stage": stage,
        "config": config,
        "epochs": state.epoch,
        "steps": state.iteration,
        "seconds": round(seconds, 3),
        "last_loss": loss_value(state.losses),
        "train_metrics": dict(metric_name_values(trainer.train_metrics)),
        "val_metrics": dict(metric_name_values(trainer.val_metrics)),
        "best": _best_checkpoint(trainer),
    }


def _best_checkpoint(trainer: Any) -> dict[str, Any] | None:
    """The monitored value and file of the first callback keeping a ``best`` checkpoint."""
    for cb in trainer.callbacks:
        if getattr(cb, "mode", None) and getattr(cb, "best", None) is not None and hasattr(cb, "best_path"):
            return {"metric": getattr(cb, "monitor_metric_key", None), "mode": cb.mode,
                    "value": cb.best, "checkpoint": cb.best_path}
    return None


def _train(argv: Sequence[str]) -> int:
    parser = make_parser("hat-train", DESCRIPTION, argv)
    parser.add_argument(
        "--dry-run", action="store_true",
        help="build everything, print the engine and its handlers by event, and exit without training",
    )
    add_distributed_arguments(parser)
    add_resume_argument(parser)
    args = parse_arguments(parser, argv)
    setup_logging(args.debug)
    export_hat_environment(args)
    cfg, work_path = load_config(
        args.config, args.opts, args.work_dir, hat_alias=not args.no_hat_alias, overwrite=args.opts_overwrite,
    )
    stage_key = cfg.stage_key(args.stage, "trainer")
    import torch

    args.device_ids = device_ids_of(cfg, args.device_ids, args.nproc, torch.cuda.is_available())
    exit_code = distributed_stage(args, argv, cfg, stage_key, _train)  # starts the processes of a DDP run
    if exit_code is not None:
        return exit_code
    inputs = check_stage_inputs(cfg, args.stage, stage_key, args.config)
    work_dir = WorkDir(work_path)
    seed_everything(cfg)
    try:
        trainer = build_stage(cfg, stage_key)
    except BaseException:
        work_dir.discard()  # callbacks may have created directories while being built
        raise
    if args.dry_run:
        work_dir.discard()
        print(describe_engine(trainer, stage_key))
        print(f"work dir: {work_path} (a dry run creates nothing)")
        return 0

    work_dir.create()
    attach_log_file(work_dir.file(f"{args.stage}_train.log"))
    main_process = is_main_process()  # rank 0 writes files and shows progress; every rank trains
    if main_process:
        cfg.dump(work_dir.file(f"{args.stage}_train_config.py"))
    logger.info("config %s, stage %s, work dir %s", cfg.filename, stage_key, work_path)
    if main_process:
        _attach_progress(trainer)
    if args.resume:
        apply_resume(trainer, args.resume, cfg[stage_key], work_path)
    received, restore_signals = install_stop_signals(trainer)
    follow_launcher_signals(trainer)
    start = time.perf_counter()
    try:
        trainer.fit()
    except Exception as exc:
        state = trainer.state
        raise CliError(
            f"training {stage_key} failed at epoch_id={max(state.epoch - 1, 0)}, "
            f"global_step_id={max(state.iteration - 1, 0)}: {type(exc).__name__}: {exc} "
            f"The log and any checkpoint saved so far are in {work_path}."
        ) from exc
    finally:
        if not received:  # after a signal, a second one must still exit at once, up to the process's end
            restore_signals()
    record = _metrics_record(trainer, args.stage, cfg.filename, time.perf_counter() - start)
    # a rank of a multi-process run may stop because another rank (or the launcher) got the signal
    signum = trainer.stop_code if trainer.stopped_by is not None else (received[0] if received else None)
    record["stopped_by_signal"] = signum is not None
    if main_process:
        write_metrics(work_dir.file("metrics.json"), f"{args.stage}_train", record)
    from hat_ignite.cli.curves import write_run_curves

    write_run_curves(trainer, work_path)
    if signum is not None:
        return stop_report(trainer, signum, argv, work_path)
    output = (record["best"] or {}).get("checkpoint") or cfg.get(f"{args.stage}_checkpoint")
    if main_process:
        record_lineage(
            work_path, args.stage, "hat-train", cfg.filename, work_dir.file(f"{args.stage}_train_config.py"),
            inputs, [output] if output else [],
        )
    logger.info(
        "done in %.1f s: train %s, val %s -> %s",
        record["seconds"], record["train_metrics"], record["val_metrics"], work_dir.file("metrics.json"),
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hat-train``; returns the process exit code.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).
    """
    return run_main("hat-train", _train, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
