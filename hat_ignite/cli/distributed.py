"""``hat-train``'s distributed options: start the training processes and set each one's device.

``hat-train CONFIG --device-ids 0,1`` trains on two GPUs (one process each, NCCL),
``--nproc 2`` in two CPU processes (gloo), ``--nnodes/--node-rank/--master-addr/--master-port``
across nodes, and the same command under ``torchrun`` joins torchrun's process group and spawns
nothing. Processes are started by :func:`hat_ignite.engine.launcher.build_launcher` (Ignite's
``idist.Parallel``); each one runs the whole command again, as a worker, with its own device.

A config whose trainer is a ``Trainer`` is built as a ``DistributedDataParallelTrainer`` when the
run has more than one process; a ``DistributedDataParallelTrainer`` config always runs through
the distributed launcher (one process when no option asks for more). A ``Calibrator`` stays a
``Calibrator`` in each process: every process calibrates its shard of the data and the observers'
statistics are summed over the processes (see :mod:`hat_ignite.engine.calibrator`). Given several
GPUs by the config's ``device_ids`` alone, a ``Calibrator`` calibrates on the first, as HAT's
does; ``--device-ids`` or ``--nproc`` on the command line start one process each.

Stopping by signal. Each rank handles SIGTERM/SIGINT itself (see :mod:`hat_ignite.cli.resume`)
and the ranks vote at every step, so all stop after the same step, rank 0 writes the resumable
checkpoint, and the job exits 143 (SIGTERM) or 130 (SIGINT), whether the signal reached every
process (torchrun, a terminal's Ctrl-C), one rank, or only the launching process (a scheduler
signalling the parent): the launching process passes its signal to the ranks through shared
memory, which each rank reads at every step end (not by signalling them again, which would
count as a second signal). A second signal to the launching process kills the ranks at once.
A rank that dies (SIGKILL, a crash) ends the job with exit code 1: Ignite's launcher stops the
other ranks.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import signal
import sys
import threading
from typing import Any, Callable, Sequence

from hat_ignite.builtin_names import HAT_ALIASES
from hat_ignite.cli.common import CliError, report_failure

__all__ = [
    "add_distributed_arguments", "device_ids_of", "parse_device_ids", "distributed_stage",
    "follow_launcher_signals", "is_main_process",
]

logger = logging.getLogger("hat_ignite.cli.distributed")

_DDP = "DistributedDataParallelTrainer"
_CALIBRATOR = "Calibrator"


class _Worker:
    """This process's launch: set in each started process before the command runs again."""

    launched = False
    device: Any = None
    #: Shared with the launching process: which stop exit codes (:data:`_STOP_EXITS`) ranks exited with.
    exit_box: Any = None
    #: Shared with the launching process: the signal it received (0: none).
    stop_box: Any = None


_STOP_EXITS = (128 + signal.SIGTERM, 128 + signal.SIGINT)


def parse_device_ids(text: str) -> list[int]:
    """``"0,1"`` -> ``[0, 1]`` (the value of ``--device-ids``)."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--device-ids takes comma-separated GPU ids such as 0,1, got {text!r}") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"--device-ids takes comma-separated GPU ids such as 0,1, got {text!r}")
    return ids


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def device_ids_of(cfg: Any, given: list[int] | None, nproc: int | None, cuda_available: bool) -> list[int] | None:
    """The GPUs of the run: ``--device-ids``, else the config's top-level ``device_ids`` (HAT's key).

    As HAT's tools, a config's ``device_ids`` (a list of GPU ids; ``None`` or ``-1``: CPU) picks
    the GPUs when the command line does not. It is ignored, with a warning, where there is no CUDA
    device, and when ``--nproc`` asks for CPU processes.

    Raises:
        CliError: ``device_ids`` is not a list of non-negative ints, an int, ``None`` or ``-1``.

    >>> from hat_ignite.config import Config
    >>> device_ids_of(Config({"device_ids": [0, 1]}), None, None, cuda_available=True)
    [0, 1]
    >>> device_ids_of(Config({"device_ids": [0, 1]}), [3], None, cuda_available=True)
    [3]
    >>> device_ids_of(Config({"device_ids": [0]}), None, None, cuda_available=False) is None
    True
    """
    if given is not None:
        return given
    value = cfg.get("device_ids")
    if value is None or value == -1 or nproc:
        return None
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise CliError(
            f"{cfg.filename}: device_ids must be a list of GPU ids such as [0, 1], or None for the CPU; got {value!r}."
        )
    if not ids:
        return None
    if not cuda_available:
        if not _Worker.launched:  # the command's first process said it already
            logger.warning("%s: device_ids=%s ignored: no CUDA device here, running on the CPU", cfg.filename, value)
        return None
    return list(ids)


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--device-ids``, ``--nproc``, ``--nnodes``, ``--node-rank``, ``--master-addr/-port`` and ``--dist-timeout``."""
    group = parser.add_argument_group("distributed training (see docs/distributed.md)")
    group.add_argument(
        "--device-ids", "-ids", type=parse_device_ids,
        help="GPUs of this node, one process each (NCCL), e.g. 0,1 (default: the config's device_ids, as HAT)",
    )
    group.add_argument("--nproc", type=_positive, help="number of CPU processes on this node (gloo)")
    group.add_argument("--nnodes", type=_positive, default=1, help="number of nodes (default 1)")
    group.add_argument("--node-rank", type=int, default=0, help="this node's index, 0 .. nnodes-1 (default 0)")
    group.add_argument("--master-addr", help="address of node 0 (required with --nnodes > 1)")
    group.add_argument("--master-port", type=int, help="free port on node 0 (required with --nnodes > 1)")
    group.add_argument(
        "--dist-timeout", type=float, default=1800.0, metavar="SECONDS",
        help="how long a collective waits for a missing process before the job fails (default 1800)",
    )


def is_main_process() -> bool:
    """Whether this process writes the run's files and logs (rank 0, or a single process)."""
    import ignite.distributed as idist

    return idist.get_rank() == 0


def follow_launcher_signals(trainer: Any) -> None:
    """In a started rank: request a stop when the launching process receives SIGTERM/SIGINT.

    The rank reads the signal the launcher stored in shared memory at each step end (a
    read of one int); the rank's own signal handlers are not involved, so a signal that reached
    both the launcher and the rank counts once.
    """
    box = _Worker.stop_box
    if box is None:
        return
    from ignite.engine import Events

    def poll(_engine: Any) -> None:
        signum = box.value
        if signum and trainer.stop_requested is None and trainer.stopped_by is None:
            trainer.request_stop(f"the launching process received {signal.Signals(signum).name}", code=signum)

    trainer.add_event_handler(Events.ITERATION_COMPLETED, poll)


def _worker(device: Any, body: Callable[[list[str]], int], argv: list[str], exit_box: Any = None,
            stop_box: Any = None, fail_box: Any = None) -> None:
    """Run the command as one process of a DDP job (module level: the spawn method pickles it).

    A failure is reported here, as one paragraph (``hat-train (rank N): error: ...`` when there
    are several processes), ``fail_box`` is set, and the process exits with code 1, so the
    launching process ends with exit code 1 without printing the spawn machinery's tracebacks.
    """
    _Worker.launched, _Worker.device = True, device
    _Worker.exit_box, _Worker.stop_box = exit_box, stop_box
    import ignite.distributed as idist

    from hat_ignite.cli.workdir_lock import release_held_locks

    several = idist.get_world_size() > 1
    try:
        code = body(argv)
        if code and code not in _STOP_EXITS:
            raise CliError(f"rank {idist.get_rank()} exited with code {code}")
    except Exception as exc:
        prog = f"hat-train (rank {idist.get_rank()})" if several else "hat-train"  # which rank failed
        report_failure(prog, exc, debug="--debug" in argv)
        if fail_box is not None:
            fail_box.value = 1
        raise SystemExit(1) from None  # the launcher sees exit code 1, with nothing more to print
    finally:
        release_held_locks()  # rank 0 held the work dir's lock for the job
    if code in _STOP_EXITS and exit_box is not None:  # stopped by a signal, checkpoint saved
        exit_box[_STOP_EXITS.index(code)] = 1


def _forward_stop_signals(stop_box: Any) -> Callable[[], None]:
    """In the launching process: store a SIGTERM/SIGINT for the ranks; a second one kills them."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_signal(signum: int, _frame: Any) -> None:
        if stop_box.value:
            os.write(2, f"hat-train: second {signal.Signals(signum).name}: stopping all ranks now "
                        f"without saving\n".encode())
            for child in multiprocessing.active_children():
                child.kill()
            os._exit(128 + signum)
        stop_box.value = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _job_boxes() -> tuple[Any, Any, Any]:
    """The memory a launching process shares with its ranks: a flag per stop exit code
    (:data:`_STOP_EXITS`) a rank exited with, the signal the launching process received, whether
    a rank reported a failure.

    None has a lock: a rank only ever sets a flag to 1, the launching process alone writes the
    signal, and the flags are read after the ranks ended. A lock held by a rank when it was killed
    (the launcher's SIGTERM to the ranks still running after one failed) would stay held, and the
    launching process would wait for it forever.

    >>> exit_box, stop_box, fail_box = _job_boxes()
    >>> list(exit_box), stop_box.value, fail_box.value, hasattr(fail_box, "get_lock")
    ([0, 0], 0, 0, False)
    """
    context = multiprocessing.get_context("spawn")
    return (context.Array("i", len(_STOP_EXITS), lock=False), context.Value("i", 0, lock=False),
            context.Value("i", 0, lock=False))


def distributed_stage(
    args: argparse.Namespace, argv: Sequence[str], cfg: Any, stage_key: str, body: Callable[[list[str]], int]
) -> int | None:
    """Launch the job's processes, or prepare this worker's trainer config.

    In the command's first process this starts the processes the trainer type and the options
    ask for, each running ``body(argv)`` again, and returns the exit code. In a started process
    (and in a plain single-process run) it sets the trainer config's ``device`` (and its type, when
    a ``Trainer`` runs in several processes) and returns ``None``: the caller goes on training.
    """
    from hat_ignite.engine.launcher import build_launcher, is_torchrun

    node = cfg[stage_key]
    kind = node.get("type") if hasattr(node, "get") else None
    kind_name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]
    kind_name = HAT_ALIASES.get(kind_name, kind_name)  # HAT's "distributed_data_parallel_trainer"
    if _Worker.launched:
        if kind_name not in (_DDP, _CALIBRATOR):
            logger.info("%s runs in several processes: building it as a %s", kind_name, _DDP)
            node["type"] = _DDP
        node["device"] = _Worker.device
        return None
    if args.nproc and args.device_ids and args.nproc != len(args.device_ids):
        raise CliError(f"--nproc {args.nproc} and --device-ids {args.device_ids}: one process per GPU; give one of them.")
    if kind_name == _CALIBRATOR and getattr(args, "device_ids_from_config", False) and len(args.device_ids or []) > 1:
        logger.info("%s: %s calibrates on one device, GPU %d of the config's device_ids %s, as HAT's Calibrator "
                    "does; --device-ids %s calibrates in one process per GPU", cfg.filename, stage_key,
                    args.device_ids[0], args.device_ids, ",".join(str(i) for i in args.device_ids))
        args.device_ids = args.device_ids[:1]
    several = (args.nproc or 1) > 1 or len(args.device_ids or []) > 1 or args.nnodes > 1 or is_torchrun()
    ddp = kind_name == _DDP or (kind_name in ("Trainer", _CALIBRATOR) and several)
    if not ddp:
        if several and not (kind_name == "DataParallelTrainer" and (args.nproc or 1) == 1 and args.nnodes == 1
                            and not is_torchrun()):
            raise CliError(
                f"{cfg.filename}: {stage_key} is a {kind_name}, which runs in one process; "
                f"--nproc/--nnodes/torchrun need type='Trainer', '{_DDP}' or '{_CALIBRATOR}'."
            )
        if args.device_ids:  # one process: DataParallelTrainer takes every id, a Trainer the only one
            if kind_name != "DataParallelTrainer" and len(args.device_ids) > 1:
                raise CliError(f"{cfg.filename}: {stage_key} is a {kind_name}, which trains on one GPU; "
                               f"--device-ids {args.device_ids} needs type='Trainer' (run as DDP) or '{_DDP}'.")
            node["device"] = args.device_ids if kind_name == "DataParallelTrainer" else args.device_ids[0]
        return None
    launch = build_launcher(_DDP)
    exit_box, stop_box, fail_box = _job_boxes()
    restore = (lambda: None) if is_torchrun() else _forward_stop_signals(stop_box)  # torchrun signals every rank
    try:
        launch(
            _worker, device_ids=args.device_ids, num_processes=args.nproc, nnodes=args.nnodes,
            node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
            timeout=args.dist_timeout, args=(body, list(argv), exit_box, stop_box, fail_box),
        )
    except Exception as exc:
        if fail_box.value and getattr(exc, "exit_code", None) == 1:  # a rank reported its failure already
            return 1
        raise  # a rank killed by a signal ...: the launcher's message says how it died
    finally:
        restore()
    stopped = [code for code, flag in zip(_STOP_EXITS, exit_box) if flag]
    if stopped:
        return max(stopped)
    return 128 + int(stop_box.value) if stop_box.value else 0
