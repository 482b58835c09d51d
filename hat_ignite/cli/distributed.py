"""``hat-train``'s distributed options: start the training processes and set each one's device.

``hat-train CONFIG --device-ids 0,1`` trains on two GPUs (one process each, NCCL),
``--nproc 2`` in two CPU processes (gloo), ``--nnodes/--node-rank/--master-addr/--master-port``
across nodes, and the same command under ``torchrun`` joins torchrun's process group and spawns
nothing. Processes are started by :func:`hat_ignite.engine.launcher.build_launcher` (Ignite's
``idist.Parallel``); each one runs the whole command again, as a worker, with its own device.

A config whose trainer is a ``Trainer`` is built as a ``DistributedDataParallelTrainer`` when the
run has more than one process; a ``DistributedDataParallelTrainer`` config always runs through
the distributed launcher (one process when no option asks for more).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, Sequence

from hat_ignite.cli.common import CliError

__all__ = ["add_distributed_arguments", "distributed_stage", "is_main_process"]

logger = logging.getLogger("hat_ignite.cli.distributed")

_DDP = "DistributedDataParallelTrainer"


class _Worker:
    """This process's launch: set in each started process before the command runs again."""

    launched = False
    device: Any = None


def _device_ids(text: str) -> list[int]:
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


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--device-ids``, ``--nproc``, ``--nnodes``, ``--node-rank``, ``--master-addr/-port`` and ``--dist-timeout``."""
    group = parser.add_argument_group("distributed training (see docs/distributed.md)")
    group.add_argument("--device-ids", type=_device_ids, help="GPUs of this node, one process each (NCCL), e.g. 0,1")
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


def _worker(device: Any, body: Callable[[list[str]], int], argv: list[str]) -> None:
    """Run the command as one process of a DDP job (module level: the spawn method pickles it)."""
    _Worker.launched, _Worker.device = True, device
    import ignite.distributed as idist

    try:
        code = body(argv)
    except BaseException as exc:
        if idist.get_world_size() > 1:  # say which rank failed: only rank 0 logs
            print(f"hat-train (rank {idist.get_rank()}): error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise
    if code:
        raise CliError(f"rank {idist.get_rank()} exited with code {code}")


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
    if _Worker.launched:
        if kind_name != _DDP:
            logger.info("%s runs in several processes: building it as a %s", kind_name, _DDP)
            node["type"] = _DDP
        node["device"] = _Worker.device
        return None
    if args.nproc and args.device_ids and args.nproc != len(args.device_ids):
        raise CliError(f"--nproc {args.nproc} and --device-ids {args.device_ids}: one process per GPU; give one of them.")
    several = (args.nproc or 1) > 1 or len(args.device_ids or []) > 1 or args.nnodes > 1 or is_torchrun()
    ddp = kind_name == _DDP or (kind_name == "Trainer" and several)
    if not ddp:
        if several and not (kind_name == "DataParallelTrainer" and (args.nproc or 1) == 1 and args.nnodes == 1
                            and not is_torchrun()):
            raise CliError(
                f"{cfg.filename}: {stage_key} is a {kind_name}, which runs in one process; "
                f"--nproc/--nnodes/torchrun need type='Trainer' or type='{_DDP}'."
            )
        if args.device_ids:  # one process: DataParallelTrainer takes every id, a Trainer the only one
            if kind_name != "DataParallelTrainer" and len(args.device_ids) > 1:
                raise CliError(f"{cfg.filename}: {stage_key} is a {kind_name}, which trains on one GPU; "
                               f"--device-ids {args.device_ids} needs type='Trainer' (run as DDP) or '{_DDP}'.")
            node["device"] = args.device_ids if kind_name == "DataParallelTrainer" else args.device_ids[0]
        return None
    if getattr(args, "dry_run", False):
        raise CliError("--dry-run builds in one process; it cannot build a DistributedDataParallelTrainer.")
    launch = build_launcher(_DDP)
    launch(
        _worker, device_ids=args.device_ids, num_processes=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, timeout=args.dist_timeout,
        args=(body, list(argv)),
    )
    return 0
