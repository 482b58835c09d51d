"""``hat-train CONFIG [--stage float] [--opts KEY=VALUE ...] [--work-dir DIR] [--resume [PATH|auto]] [--dry-run]``.

Loads the config, applies the overrides, seeds from the config's ``seed``, builds the stage's
``{stage}_trainer`` with the registry and trains it. The work dir receives the log
(``{stage}_train.log``), the resolved config (``{stage}_train_config.py``, written when training
starts, so a resume refused before that leaves the one matching the checkpoints), whatever the
callbacks save (checkpoints ...) and, at the end, the final metrics in ``metrics.json`` under the
key ``{stage}_train``. It is created only once the config has loaded and the trainer has been
built, so a bad config leaves nothing behind. ``--resume`` continues a run from a checkpoint
(see :mod:`hat_ignite.cli.resume`; in a multi-process run every rank must find the same
checkpoint, see :mod:`hat_ignite.cli.resume_agreement`). SIGTERM or SIGINT stops training at the next step boundary:
the ``Checkpoint`` callback writes a resumable checkpoint, ``metrics.json`` is written with
``"stopped_by_signal": true``, the log names the command that resumes, and the exit code is 143
(SIGTERM) or 130 (SIGINT); a second signal exits at once. In a multi-process run the signal may
reach every process, one rank, or only the launching process: all ranks stop after the same
step and the job exits the same way (see :mod:`hat_ignite.cli.distributed`). A signal that arrives
while a single-process run waits for its next batch ends that wait at once (the checkpoint is of
the last finished step), and a batch that has not come for ``--data-wait-limit`` seconds is
reported (see :mod:`hat_ignite.engine.data_wait`).

Only one run at a time writes into a work dir: rank 0 takes the work dir's lock before writing
anything into it, and a second run into a busy work dir exits at once naming the other run's
process id and host (see :mod:`hat_ignite.cli.workdir_lock`). A file that cannot be written (a
full disk) is named in the error and no temporary file is left (see
:mod:`hat_ignite.cli.write_errors`); after a signal the end-of-training validation and the curves
are skipped, so the process exits as soon as the checkpoint is safe.

HAT's ``tools/train.py`` command line works as it is: ``hat-train -c CONFIG -s float --opts KEY
VALUE ...`` (see ``docs/hat-migration.md``); the config may import from ``hat.*`` unless
``--no-hat-alias`` is given.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from hat_ignite.cli.common import (
    CliError,
    WorkDir,
    attach_log_file,
    build_stage,
    command_line,
    describe_engine,
    dump_config,
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

from hat_ignite.cli.collector import collector_phases, imports_done, loop_starts
from hat_ignite.cli.curves import label_stage
from hat_ignite.cli.distributed import (
    add_distributed_arguments,
    device_ids_of,
    distributed_stage,
    follow_launcher_signals,
    is_main_process,
)
from hat_ignite.cli.progress import TerminalBar, attach_epoch_line, has_room_for_a_bar
from hat_ignite.cli.resume import (
    add_resume_argument,
    apply_resume,
    checkpoint_dirs,
    find_resume,
    finished_run,
    install_stop_signals,
    previous_run_note,
    stop_report,
)
from hat_ignite.cli.resume_agreement import as_rank_0_finds
from hat_ignite.cli.stages import check_stage_inputs, record_lineage
from hat_ignite.cli.write_errors import close_event_writers, write_error_text

__all__ = ["main"]

logger = logging.getLogger("hat_ignite.cli.train")

DESCRIPTION = """Train one stage of a hat-ignite config.

Builds the config's {stage}_trainer (e.g. float_trainer) and calls fit(). Logs, the resolved
config, checkpoints and metrics.json go to the work dir."""


def _lr_of(trainer: Any) -> float | None:
    groups = getattr(trainer.optimizer, "param_groups", None)
    return float(groups[0]["lr"]) if groups else None


def _attach_progress(trainer: Any) -> TerminalBar | None:
    """Rank 0: a tqdm bar (loss, lr) when stderr is a terminal with a size; otherwise a log line per epoch.

    Returns:
        The bar (to close if training fails), or ``None``.
    """
    import ignite.distributed as idist

    if idist.get_rank() != 0:
        return None

    def loss_and_lr() -> dict[str, float]:
        shown = {"loss": loss_value(trainer.state.losses), "lr": _lr_of(trainer)}
        return {k: v for k, v in shown.items() if v is not None}

    if has_room_for_a_bar(sys.stderr):
        return TerminalBar(trainer, sys.stderr, loss_and_lr)
    attach_epoch_line(trainer, loss_and_lr)
    return None


def _metrics_record(trainer: Any, stage: str, config: str, seconds: float) -> dict[str, Any]:
    """What metrics.json records for the stage: its metrics are what its callbacks computed
    (see :mod:`hat_ignite.cli.results`)."""
    from hat_ignite.cli.results import stage_metrics

    state = trainer.state
    train_values, val_values = stage_metrics(trainer)
    return {
        "stage": stage,
        "config": config,
        "epochs": state.epoch,
        "steps": state.iteration,
        "seconds": round(seconds, 3),
        "last_loss": loss_value(state.losses),
        "train_metrics": train_values,
        "val_metrics": val_values,
        "best": _best_checkpoint(trainer),
    }


def _best_checkpoint(trainer: Any) -> dict[str, Any] | None:
    """The monitored value and file of the first callback keeping a ``best`` checkpoint."""
    for cb in trainer.callbacks:
        if getattr(cb, "mode", None) and getattr(cb, "best", None) is not None and hasattr(cb, "best_path"):
            return {"metric": getattr(cb, "monitor_metric_key", None), "mode": cb.mode,
                    "value": cb.best, "checkpoint": cb.best_path}
    return None


def _watch_start(trainer: Any, on_start: Callable[[], None] | None = None) -> list[bool]:
    """A flag set when the trainer's run starts (after resuming and loading, before the first
    batch), and then ``on_start()`` called."""
    from ignite.engine import Events

    started = [False]

    def mark(_engine: Any) -> None:
        started[0] = True
        if on_start is not None:
            on_start()

    trainer.add_event_handler(Events.STARTED, mark)
    return started


def _agreed_resume(trainer: Any, resume: str, stage_cfg: Any, work_path: str) -> tuple[str, Any] | None:
    """The checkpoint ``--resume`` names, the same on every rank, checked before anything is written.

    A rank's failure to find or load it is shared with the other ranks, so all stop together
    (see :mod:`hat_ignite.cli.resume_agreement`); a checkpoint of another number of processes
    is refused here, before the work dir is touched.
    """
    import os

    from hat_ignite.checkpoint.restore import check_world_size
    from hat_ignite.cli.resume_agreement import agree_on_resume

    found, error = None, None
    try:
        found = find_resume(trainer, resume, work_path)
    except Exception as exc:  # shared with the other ranks, which would otherwise wait for this one
        error = exc
    searched = [d for d, _ in checkpoint_dirs(trainer, work_path)] if resume == "auto" else [os.path.abspath(resume)]
    found = agree_on_resume(found, error, searched)
    progress = found[1].get("progress") if found else None
    if found and isinstance(progress, Mapping) and stage_cfg.get("resume_epoch_or_step", True) is not False:
        check_world_size(progress, found[0])
    return found


def _failure_message(trainer: Any, stage_key: str, exc: BaseException, started: bool, work_path: str) -> str:
    """Say where training failed: before it started (loading, resuming), fetching a batch, or in a step."""
    text = write_error_text(exc)
    if not started:
        return f"{stage_key} did not start training (nothing was trained): {text}"
    state = trainer.state
    if state.batch is None:  # Ignite clears the batch before fetching the next one
        where = (f"while fetching the batch of epoch_id={max(state.epoch - 1, 0)}, "
                 f"global_step_id={state.iteration}")
    else:
        where = f"at epoch_id={max(state.epoch - 1, 0)}, global_step_id={max(state.iteration - 1, 0)}"
    return (f"training {stage_key} failed {where}: {text} The log and any checkpoint saved so far are "
            f"in {work_path}.")


@collector_phases
def _train(argv: Sequence[str]) -> int:
    parser = make_parser("hat-train", DESCRIPTION, argv)
    parser.add_argument(
        "--dry-run", action="store_true",
        help="build everything, print the engine and its handlers by event, and exit without training",
    )
    from hat_ignite.engine.data_wait import DEFAULT_DATA_WAIT_LIMIT

    parser.add_argument(
        "--data-wait-limit", type=float, default=None, metavar="SECONDS",
        help=f"report a data loader that has not delivered the next batch for this many seconds (a warning "
             f"naming the wait and the loader's settings, repeated every further limit; default "
             f"{DEFAULT_DATA_WAIT_LIMIT:g}; 0 turns the check off)",
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

    imports_done()
    args.device_ids_from_config = args.device_ids is None  # HAT's Calibrator then keeps the first GPU
    args.device_ids = device_ids_of(cfg, args.device_ids, args.nproc, torch.cuda.is_available())
    inputs = check_stage_inputs(cfg, args.stage, stage_key, args.config)  # refused once, before any rank starts
    exit_code = distributed_stage(args, argv, cfg, stage_key, _train)  # starts the processes of a DDP run
    if exit_code is not None:
        return exit_code
    work_dir = WorkDir(work_path)
    seed_everything(cfg)
    try:
        trainer = build_stage(cfg, stage_key)
    except BaseException:
        work_dir.discard()  # callbacks may have created directories while being built
        raise
    if args.dry_run:  # a DDP stage is built in its launched processes, as for training; rank 0 prints
        work_dir.discard()
        if is_main_process():
            print(describe_engine(trainer, stage_key))
            print(f"work dir: {work_path} (a dry run creates nothing)")
        return 0

    found = _agreed_resume(trainer, args.resume, cfg[stage_key], work_path) if args.resume else None
    finished = finished_run(trainer, found[1], cfg[stage_key], work_path, args.stage) if found else None
    if args.resume:  # metrics.json is in rank 0's work dir: its answer holds for every rank
        finished = as_rank_0_finds(finished)
    if finished and found:  # before anything is written: resuming a finished run changes no file
        logger.info("the run in %s is already finished (%s; checkpoint %s): nothing to do. To train longer, "
                    "resume with a larger num_epochs/num_steps in --opts.", work_path, finished, found[0])
        return 0
    main_process = is_main_process()  # rank 0 writes files and shows progress; every rank trains
    rerun = previous_run_note(trainer, work_path, args.stage, argv) if main_process and not args.resume else None
    work_dir.create(lock_command=command_line("hat-train", argv) if main_process else None)
    attach_log_file(work_dir.file(f"{args.stage}_train.log"))
    if rerun:
        logger.warning(rerun)
    logger.info("config %s, stage %s, work dir %s", cfg.filename, stage_key, work_path)
    label_stage(trainer, args.stage)  # stages sharing a TensorBoard directory keep their own histories
    bar = _attach_progress(trainer) if main_process else None
    if args.data_wait_limit is not None:
        trainer.data_wait_limit = args.data_wait_limit
    if args.resume:
        apply_resume(trainer, args.resume, cfg[stage_key], work_path, found=found)
    received, restore_signals = install_stop_signals(trainer)
    follow_launcher_signals(trainer)
    # the resolved config is written once training starts: a run refused before that (a resume
    # that does not fit) leaves the config that matches the work dir's checkpoints
    resolved = work_dir.file(f"{args.stage}_train_config.py")
    started = _watch_start(trainer, (lambda: dump_config(cfg, resolved)) if main_process else None)
    loop_starts()
    start = time.perf_counter()
    try:
        trainer.fit()
    except Exception as exc:
        close_event_writers(trainer)  # a full disk: tensorboardX's exit hook must not fail again
        if isinstance(exc, CliError):  # the resolved config could not be written: it says so itself
            raise
        raise CliError(_failure_message(trainer, stage_key, exc, started[0], work_path)) from exc
    finally:
        if bar is not None:  # before anything else is printed: no stale bar under the report
            bar.close()
        if not received:  # after a signal, a second one must still exit at once, up to the process's end
            restore_signals()
    if main_process and not started[0]:  # a loop with no step left to run never fires STARTED
        dump_config(cfg, resolved)
    record = _metrics_record(trainer, args.stage, cfg.filename, time.perf_counter() - start)
    # a rank of a multi-process run may stop because another rank (or the launcher) got the signal
    signum = trainer.stop_code if trainer.stopped_by is not None else (received[0] if received else None)
    record["stopped_by_signal"] = signum is not None
    try:
        return _finish(trainer, args, argv, cfg, inputs, work_dir, record, signum, main_process)
    except CliError as exc:  # a full disk at the end: say that the training itself is complete
        saved = "stopped" if signum is not None else "finished"
        raise CliError(f"training {stage_key} {saved} and its checkpoints are saved, but {exc}") from exc


def _finish(trainer: Any, args: Any, argv: Sequence[str], cfg: Any, inputs: list[str], work_dir: WorkDir,
            record: dict[str, Any], signum: int | None, main_process: bool) -> int:
    """Write metrics.json, the curves and the lineage; report a stop."""
    work_path = work_dir.path
    if main_process:
        write_metrics(work_dir.file("metrics.json"), f"{args.stage}_train", record)
    if signum is not None:
        logger.info("training curves not drawn after a stop (hat-curves %s draws them)", work_path)
        return stop_report(trainer, signum, argv, work_path)
    from hat_ignite.cli.curves import write_run_curves

    write_run_curves(trainer, work_path, args.stage)
    output = (record["best"] or {}).get("checkpoint") or cfg.get(f"{args.stage}_checkpoint")
    if main_process:
        record_lineage(
            work_path, args.stage, "hat-train", cfg.filename, work_dir.file(f"{args.stage}_train_config.py"),
            inputs, [output] if output else [],
        )
    from hat_ignite.callbacks.metric_updater import format_name_values

    results = [f"{name} {format_name_values(list(values.items()))}"
               for name, values in (("train", record["train_metrics"]), ("val", record["val_metrics"])) if values]
    logger.info("done in %.1f s: %s -> %s", record["seconds"], ", ".join(results) or "no metrics",
                work_dir.file("metrics.json"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hat-train``; returns the process exit code.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).
    """
    return run_main("hat-train", _train, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
