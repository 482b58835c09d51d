"""`build_launcher`: start a training function in the processes its trainer type needs.

All process management is Ignite's (``ignite.distributed.Parallel``) and torch.distributed's:

* ``DistributedDataParallelTrainer``: one process per GPU of ``device_ids`` (NCCL), or
  ``num_processes`` CPU processes (gloo), on each of ``nnodes`` nodes. Started under
  ``torchrun`` (its ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` environment is present), the process
  group is created from that environment and nothing is spawned. A job of one process on one
  node runs in this process too, in a process group of one: the same model wrapping and
  collectives as a spawned rank, without the seconds a new interpreter takes to start.
* ``Trainer`` / ``DataParallelTrainer`` (and anything else): the function runs in this process.

HAT's snake-case names (``distributed_data_parallel_trainer``, ``data_parallel_trainer``) get the
same launchers, and :func:`register_launcher` adds one for another trainer type. Every launcher
takes HAT's call, ``launch(main_func, device_ids, dist_url="auto", dist_launcher=None, ...,
args=(...))`` as HAT's ``tools/train.py`` makes it.

The function is called HAT's way, as ``main_func(device, *args, **kwargs)``: ``device`` is this
process's GPU id, the list of GPU ids for ``DataParallelTrainer``, or ``None`` on the CPU.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import time
from typing import Any, Callable, Mapping, Sequence

from hat_ignite.engine.rank_start import begin_rank, end_rank, prepare_rank_start, rank_start_method
from hat_ignite.errors import ConfigError

__all__ = [
    "build_launcher", "register_launcher", "launch_distributed", "launch_local", "launch_data_parallel", "is_torchrun", "free_port",
    "DDP_TRAINERS", "DP_TRAINERS",
]

logger = logging.getLogger(__name__)

#: Trainer types launched with one process per device (HAT's snake-case name too).
DDP_TRAINERS = ("DistributedDataParallelTrainer", "distributed_data_parallel_trainer")
#: Trainer types run in this process on every GPU given (``torch.nn.DataParallel``).
DP_TRAINERS = ("DataParallelTrainer", "data_parallel_trainer")

#: Launchers added with :func:`register_launcher`: trainer type name -> launch function.
_REGISTERED: dict[str, Callable[..., None]] = {}

#: Default collective timeout: long enough for a slow validation on rank 0, bounded all the same.
DEFAULT_TIMEOUT_S = 1800.0

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def is_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by ``torchrun`` (or another launcher setting its variables).

    >>> is_torchrun({}), is_torchrun({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
    ...                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    (False, True)
    """
    env = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in env or all(var in env for var in _TORCHRUN_VARS)


def free_port() -> int:
    """A TCP port that is free on this host right now (for a single-node rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _trainer_type(trainer: Any) -> str:
    kind = trainer.get("type") if isinstance(trainer, Mapping) else trainer
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace(":", ".").rsplit(".", 1)[-1]


def _entry(local_rank: int, main_func: Callable, device_ids: Sequence[int] | None, args: tuple, kwargs: dict,
           share_cores: bool = True, rank_setup: None = None) -> None:
    """What each process runs: pick its device, then call ``main_func``.

    ``rank_setup`` is what the launching process's :class:`~hat_ignite.engine.rank_start.RankSetup`
    becomes in a started rank (``None``): its unpickling set the rank up.

    CPU processes share the node's cores: unless ``OMP_NUM_THREADS`` says otherwise (or
    ``share_cores`` is false: the job runs in the caller's process, whose setting stays), each
    gets ``cores // processes`` intra-op threads (torchrun's default is 1), so that the
    processes do not oversubscribe the CPU.
    """
    import ignite.distributed as idist
    import torch

    begin_rank()
    device = None
    if device_ids:
        device = int(device_ids[local_rank])
        torch.cuda.set_device(device)
    elif share_cores and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // idist.get_nproc_per_node()))
    try:
        main_func(device, *args, **kwargs)
    finally:
        _release_run_objects()
        end_rank()


def _release_run_objects() -> None:
    """Let the process group go before the interpreter does; called at the end of every process.

    A gloo thread frees the tensors of a collective after the collective completed; when Python
    no longer holds such a tensor, that needs the GIL. If the interpreter is already shutting
    down, the thread cannot take it and the process aborts (``terminate called without an
    active exception``, SIGABRT), failing a job that had finished. The thread lives as long as
    the process group, and the group as long as something holds it: Ignite's ``finalize()``
    destroys it only once nothing else does, and an engine, its callbacks and its
    ``DistributedDataParallel`` model refer to each other, so they outlive the training
    function until the garbage collector runs. Collecting here frees them while the interpreter
    is whole, so the group and its threads end at ``finalize()``; the short sleep hands the GIL
    to a thread still freeing the last collective's tensors, for a group held on by something
    else (a model in a global variable).
    """
    gc.collect()
    time.sleep(0.01)


def _rendezvous(
    dist_url: str | None, dist_launcher: str | None, master_addr: str | None, master_port: int | None,
) -> tuple[str | None, int | None]:
    """``master_addr``/``master_port`` from HAT's ``dist_url`` (``"auto"`` or ``tcp://host:port``)."""
    if dist_launcher not in (None, "torch"):
        raise ValueError(
            f"launch_distributed: dist_launcher={dist_launcher!r} is not supported (HAT's 'mpi' launcher "
            f"included); start the job with torchrun (dist_launcher='torch' or None)."
        )
    if dist_launcher == "torch" and not is_torchrun():
        raise ValueError(
            "launch_distributed: dist_launcher='torch' means the processes were started by torchrun, but "
            "its environment (RANK, WORLD_SIZE, MASTER_ADDR ...) is absent: run under torchrun, or leave "
            "dist_launcher out to start the processes here."
        )
    if dist_url in (None, "auto"):
        return master_addr, master_port
    if not dist_url.startswith("tcp://"):
        raise ValueError(
            f"launch_distributed: dist_url={dist_url!r} is not supported; give 'auto' (a free local port) "
            f"or 'tcp://HOST:PORT'."
        )
    host, sep, port = dist_url[len("tcp://"):].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"launch_distributed: dist_url={dist_url!r} is not of the form 'tcp://HOST:PORT'.")
    if (master_addr not in (None, host)) or (master_port not in (None, int(port))):
        raise ValueError(
            f"launch_distributed: dist_url={dist_url!r} disagrees with master_addr={master_addr!r}, "
            f"master_port={master_port!r}; give one of them."
        )
    return host, int(port)


def launch_distributed(
    main_func: Callable,
    device_ids: Sequence[int] | int | None = None,
    dist_url: str | None = "auto",
    dist_launcher: str | None = None,
    num_processes: int | None = None,
    backend: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Run ``main_func(device, *args, **kwargs)`` in every process of a data-parallel job.

    Args:
        main_func: the training function; must be importable (a module-level function): each
            process is started afresh, forked from a server that has torch and Ignite imported
            (:mod:`~hat_ignite.engine.rank_start`), or spawned where the platform has no
            ``forkserver``.
        device_ids: this node's GPUs, one process each; ``None`` trains on the CPU.
        dist_url: HAT's rendezvous address: ``"auto"`` (or ``None``) for a free port on this host,
            or ``"tcp://HOST:PORT"`` (the same as ``master_addr``/``master_port``).
        dist_launcher: HAT's ``--launcher``: ``None``, or ``"torch"`` when torchrun started the
            processes (torchrun is also recognised without it); HAT's ``"mpi"`` is refused.
        num_processes: processes on this node for a CPU run (default 1); with ``device_ids``
            it must be ``None`` or ``len(device_ids)``.
        nnodes: number of nodes; each runs this function with its own ``node_rank``.
        node_rank: this node's index in ``[0, nnodes)``.
        master_addr: address of node 0 (default ``127.0.0.1`` on one node).
        master_port: a free port on node 0 (default: one found free, on one node); all nodes
            must give the same.
        backend: ``"nccl"`` or ``"gloo"`` (any case; HAT writes ``"NCCL"``); default NCCL with
            ``device_ids``, else gloo.
        timeout: seconds a collective waits for a missing rank before failing the job.
        args: positional arguments of ``main_func`` after ``device``.
        kwargs: keyword arguments of ``main_func``.

    A process that raises ends the job: the others are stopped and the error (with that
    process's traceback) is raised here. Under ``torchrun`` the process group comes from its
    environment and ``num_processes``/``nnodes``/``node_rank``/``master_*`` are ignored. A job
    of one process on one node runs ``main_func`` in this process (rank 0 of a group of one),
    and its exception is raised here as it is.

    >>> import torch.distributed as dist
    >>> launch_distributed(lambda device, x: print(device, x, dist.get_world_size(), dist.get_backend()), args=(3,))
    None 3 1 gloo
    """
    import ignite.distributed as idist

    master_addr, master_port = _rendezvous(dist_url, dist_launcher, master_addr, master_port)
    if isinstance(device_ids, int):  # HAT accepts one id as well as a list
        device_ids = [device_ids]
    if device_ids is not None:
        device_ids = [int(d) for d in device_ids]
        if not device_ids:
            raise ValueError("launch_distributed: device_ids is empty; give GPU ids or None for the CPU.")
        if num_processes not in (None, len(device_ids)):
            raise ValueError(
                f"launch_distributed: one process per GPU: num_processes={num_processes} does not match "
                f"device_ids={device_ids}; leave num_processes out."
            )
    backend = backend.lower() if backend else ("nccl" if device_ids else "gloo")
    pg_timeout = datetime.timedelta(seconds=float(timeout))
    call_args = (main_func, device_ids, tuple(args), dict(kwargs or {}))
    if is_torchrun():
        # torchrun started us: join its process group; no process is spawned here.
        idist.initialize(backend, timeout=pg_timeout)
        try:
            with idist.Parallel(backend=None) as parallel:
                parallel.run(_entry, *call_args)
        finally:
            idist.finalize()
        return
    nproc = len(device_ids) if device_ids else int(num_processes or 1)
    if nproc == 1 and nnodes == 1:
        _run_in_this_process(backend, pg_timeout, master_addr, master_port, call_args)
        return
    if nnodes > 1 and (master_addr is None or master_port is None):
        raise ValueError(
            f"launch_distributed: a {nnodes}-node run needs master_addr and master_port (node 0's "
            f"address and a free port on it), the same on every node."
        )
    if master_port is None:
        master_port = free_port()
    rank_setup = prepare_rank_start(main_func)
    with idist.Parallel(
        backend=backend, nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
        master_addr=master_addr or "127.0.0.1", master_port=int(master_port), timeout=pg_timeout,
        start_method=rank_start_method(),
    ) as parallel:
        parallel.run(_entry, *call_args, rank_setup=rank_setup)


def _run_in_this_process(
    backend: str, timeout: datetime.timedelta, master_addr: str | None, master_port: int | None, call_args: tuple,
) -> None:
    """A one-process job: this process is rank 0 of a process group of one, as a spawned rank would be.

    The environment a spawned rank gets (``RANK=0``, ``LOCAL_RANK=0``, ``WORLD_SIZE=1``,
    ``MASTER_ADDR``/``MASTER_PORT``) is set for the run and restored afterwards, as is the
    process's intra-op thread count (left as it is).
    """
    import ignite.distributed as idist

    rank_env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": master_addr or "127.0.0.1",
                "MASTER_PORT": str(master_port or free_port())}
    saved = {key: os.environ.get(key) for key in rank_env}
    os.environ.update(rank_env)
    try:
        idist.initialize(backend, timeout=timeout)
        try:
            main_func, device_ids, args, kwargs = call_args
            _entry(0, main_func, device_ids, args, kwargs, share_cores=False)
        finally:
            idist.finalize()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def launch_local(
    main_func: Callable,
    device_ids: Sequence[int] | int | None = None,
    dist_url: str | None = None,
    dist_launcher: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    data_parallel: bool = False,
    **ignored: Any,
) -> None:
    """Run ``main_func(device, *args, **kwargs)`` in this process.

    ``device`` is ``None`` without ``device_ids``, the list of ids when ``data_parallel``, else
    the first id. HAT's ``dist_url``/``dist_launcher`` mean nothing for one process and are
    ignored, as in HAT. Distributed options (``num_processes``, ``nnodes`` ...) are accepted so
    every launcher takes the same call, and must describe a single process.

    >>> launch_local(lambda device, x: print(device, x), args=(3,))
    None 3
    """
    if (ignored.get("num_processes") or 1) > 1 or (ignored.get("nnodes") or 1) > 1:
        raise ValueError(
            "launch_local runs one process: num_processes/nnodes > 1 need the "
            "DistributedDataParallelTrainer launcher."
        )
    device: Any = None
    if isinstance(device_ids, int):  # HAT accepts one id as well as a list
        device_ids = [device_ids]
    if device_ids:
        device = [int(d) for d in device_ids] if data_parallel else int(device_ids[0])
        if not data_parallel and len(device_ids) > 1:
            raise ValueError(
                f"one process trains on one GPU, but device_ids={list(device_ids)}: use "
                f"DataParallelTrainer or DistributedDataParallelTrainer for several."
            )
    main_func(device, *args, **dict(kwargs or {}))


def launch_data_parallel(
    main_func: Callable,
    device_ids: Sequence[int] | int | None = None,
    dist_url: str | None = None,
    dist_launcher: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **ignored: Any,
) -> None:
    """``DataParallelTrainer``'s launcher: :func:`launch_local` giving ``main_func`` every GPU id.

    >>> launch_data_parallel(lambda device: print(device), [0, 1], "auto")
    [0, 1]
    """
    launch_local(main_func, device_ids, dist_url, dist_launcher, args, kwargs, data_parallel=True, **ignored)


def register_launcher(name: str, launcher: Callable[..., None]) -> Callable[..., None]:
    """Give trainer type ``name`` its launch function (HAT's ``register_launcher``).

    ``launcher`` is called as the built-in ones are: ``launcher(main_func, device_ids,
    dist_url=..., dist_launcher=..., args=(...))``. A name registered twice keeps the last one.

    >>> register_launcher("MyTrainer", launch_local) is launch_local
    True
    >>> build_launcher({"type": "MyTrainer"}).__name__
    'launch_local'
    """
    if not isinstance(name, str) or not callable(launcher):
        raise TypeError(f"register_launcher(name, launcher): a type name and a function, got {name!r}, {launcher!r}.")
    _REGISTERED[name] = launcher
    return launcher


def build_launcher(trainer: Mapping[str, Any] | str | type) -> Callable[..., None]:
    """The launch function for a trainer config (or type name), HAT's ``build_launcher``.

    Args:
        trainer: the trainer's config dict (its ``type`` decides), a type name (HAT's
            snake-case names too), or the class.

    Returns:
        A launcher added with :func:`register_launcher` for that type; else
        :func:`launch_distributed` for ``DistributedDataParallelTrainer``,
        :func:`launch_data_parallel` (every GPU id to one process) for ``DataParallelTrainer``,
        and :func:`launch_local` for the other trainers.
        Call it HAT's way, ``launch(main_func, device_ids, dist_url="auto", args=(...))``, or
        with keywords: ``launch(main_func, device_ids=..., num_processes=..., args=(...))``.

    >>> build_launcher({"type": "distributed_data_parallel_trainer"}).__name__
    'launch_distributed'
    >>> build_launcher("Trainer").__name__
    'launch_local'
    >>> build_launcher("data_parallel_trainer")(lambda device, x: print(device, x), [0, 1], "auto", args=(3,))
    [0, 1] 3
    """
    kind = _trainer_type(trainer)
    if kind in _REGISTERED:
        return _REGISTERED[kind]
    from hat_ignite.builtin_names import NOT_PROVIDED  # a table of strings: imports nothing else

    if kind in NOT_PROVIDED and kind.lower().endswith("trainer"):
        raise ConfigError(f"build_launcher: {kind!r} is a HAT trainer hat-ignite does not provide: "
                          f"{NOT_PROVIDED[kind]}.")
    if kind in DDP_TRAINERS:
        return launch_distributed
    if kind in DP_TRAINERS:
        return launch_data_parallel
    return launch_local
