"""``hat-train CONFIG [--stage float] [--opts KEY=VALUE ...] [--work-dir DIR] [--dry-run]``.

Loads the config, applies the overrides, seeds from the config's ``seed``, builds the stage's
``{stage}_trainer`` with the registry and trains it. The work dir receives the log
(``{stage}_train.log``), the resolved config (``{stage}_train_config.py``), whatever the
callbacks save (checkpoints ...) and, at the end, the final metrics in ``metrics.json`` under the
key ``{stage}_train``. It is created only once the config has loaded and the trainer has been
built, so a bad config leaves nothing behind. SIGTERM stops training at the next step boundary:
the loop ends normally (checkpoint callbacks write their last checkpoint), ``metrics.json`` is
written with ``"stopped_by_signal": true``, and the exit code is 143.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

from hat_ignite.cli.common import (
    CliError,
    WorkDir,
    attach_log_file,
    build_stage,
    describe_engine,
    load_config,
    loss_value,
    make_parser,
    run_main,
    seed_everything,
    setup_logging,
    write_metrics,
)

__all__ = ["main"]

logger = logging.getLogger("hat_ignite.cli.train")

DESCRIPTION = """Train one stage of a hat-ignite config.

Builds the config's {stage}_trainer (e.g. float_trainer) and calls fit(). Logs, the resolved
config, checkpoints and metrics.json go to the work dir."""


def _attach_progress(trainer: Any) -> None:
    """A tqdm bar on a terminal; otherwise a log line per epoch (unless the trainer logs steps)."""
    from ignite.engine import Events

    if sys.stdout.isatty():
        from ignite.handlers import ProgressBar

        def loss_of(_output: Any) -> dict[str, float]:
            value = loss_value(trainer.state.losses)
            return {} if value is None else {"loss": value}

        ProgressBar(persist=True).attach(trainer, output_transform=loss_of)
        return
    start = time.perf_counter()

    def epoch_line(engine: Any) -> None:
        value = loss_value(engine.state.losses)
        loss = f", last loss {value:.4f}" if value is not None else ""
        logger.info(
            "epoch %d/%s done: %d steps%s, %.1f s",
            engine.state.epoch, engine.state.max_epochs or "?", engine.state.iteration, loss,
            time.perf_counter() - start,
        )

    trainer.add_event_handler(Events.EPOCH_COMPLETED, epoch_line)


def _stop_on_sigterm(trainer: Any) -> tuple[list[int], Callable[[], None]]:
    """Make SIGTERM stop training cleanly at the next step boundary.

    The signal handler only records the request; a handler on ``ITERATION_COMPLETED`` then calls
    ``trainer.terminate()``, so the epoch and the loop end normally (``on_epoch_end`` and
    ``on_loop_end`` fire, and a checkpoint callback writes its last checkpoint).

    Returns:
        The list the received signal numbers are appended to, and a function restoring the
        previous handler.
    """
    from ignite.engine import Events

    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return received, lambda: None

    def on_signal(signum: int, _frame: Any) -> None:
        if not received:
            logger.warning("received %s: stopping after the current step", signal.Signals(signum).name)
        received.append(signum)

    def stop_if_asked(engine: Any) -> None:
        if received:
            engine.terminate()

    previous = signal.signal(signal.SIGTERM, on_signal)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, stop_if_asked)
    return received, lambda: signal.signal(signal.SIGTERM, previous)


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
    args = parser.parse_args(argv)
    setup_logging(args.debug)
    cfg, work_path = load_config(args.config, args.opts, args.work_dir)
    stage_key = cfg.stage_key(args.stage, "trainer")
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
    cfg.dump(work_dir.file(f"{args.stage}_train_config.py"))
    logger.info("config %s, stage %s, work dir %s", cfg.filename, stage_key, work_path)
    _attach_progress(trainer)
    received, restore_signals = _stop_on_sigterm(trainer)
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
        restore_signals()
    record = _metrics_record(trainer, args.stage, cfg.filename, time.perf_counter() - start)
    record["stopped_by_signal"] = bool(received)
    write_metrics(work_dir.file("metrics.json"), f"{args.stage}_train", record)
    if received:
        logger.warning(
            "stopped by SIGTERM after %d steps; metrics and checkpoints are in %s", trainer.state.iteration, work_path
        )
        return 128 + signal.SIGTERM
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
