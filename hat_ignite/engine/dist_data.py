"""Data loaders for data-parallel training: one shard of every epoch per process.

HAT configs give the batch size *per process* (``batch_size_per_gpu``); the global batch is that
times the world size. :func:`distributed_loader` keeps the loader's batch size and gives it a
``DistributedSampler`` when the config set none (Ignite's ``auto_dataloader`` would divide the
batch size instead). The loop calls ``set_epoch`` on it at every epoch begin.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

__all__ = ["distributed_loader", "shared_seed"]

logger = logging.getLogger(__name__)

_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "persistent_workers", "pin_memory_device",
)


def shared_seed() -> int:
    """Rank 0's ``torch.initial_seed()``, the same on every rank (a collective call).

    Seeds the shuffling of the distributed samplers, which must be identical on all ranks even
    when the processes were not seeded alike.
    """
    import ignite.distributed as idist

    seed = torch.tensor([torch.initial_seed() % (2**31)], dtype=torch.int64)
    # Ignite's stub: a tensor in gives a tensor
    return int(idist.broadcast(seed, src=0).item())  # type: ignore[union-attr]


def _is_distributed(sampler: Any) -> bool:
    from ignite.distributed import DistributedProxySampler

    return isinstance(sampler, (DistributedSampler, DistributedProxySampler))


def distributed_loader(loader: Any, num_replicas: int, rank: int, seed: int = 0) -> Any:
    """``loader`` with each process reading its own shard of every epoch.

    * A ``DataLoader`` whose sampler is already distributed is returned as it is.
    * A ``DataLoader`` with the default sequential or shuffling sampler is rebuilt with a
      ``DistributedSampler(shuffle=<as before>, seed=seed)`` and every other setting kept; with
      another sampler, that sampler is wrapped in Ignite's ``DistributedProxySampler``.
    * A loader with a ``loaders`` dict (a :class:`~hat_ignite.data.multitask.MultitaskLoader`)
      has each of its loaders converted.
    * Anything else (an ``IterableDataset`` loader, a list of batches) cannot be sharded from
      outside: it is returned unchanged with a warning, and must shard by rank itself.

    Args:
        loader: the training data loader.
        num_replicas: number of processes (the world size).
        rank: this process's rank.
        seed: shuffling seed, identical on every rank.

    Example:
        >>> loader = DataLoader(list(range(8)), batch_size=2, shuffle=False)
        >>> shard = distributed_loader(loader, num_replicas=2, rank=1)
        >>> [b.tolist() for b in shard]
        [[1, 3], [5, 7]]
    """
    sub_loaders = getattr(loader, "loaders", None)
    if isinstance(sub_loaders, Mapping):
        loader.loaders = {
            name: distributed_loader(sub, num_replicas, rank, seed) for name, sub in sub_loaders.items()
        }
        return loader
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        if num_replicas > 1:
            logger.warning(
                "data_loader %s cannot be given a DistributedSampler: every one of the %d processes "
                "reads all of it unless it shards the data by rank itself",
                type(loader).__name__, num_replicas,
            )
        return loader
    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        if _is_distributed(getattr(batch_sampler, "sampler", None)):
            return loader
        raise ValueError(
            f"data_loader uses a custom batch_sampler ({type(batch_sampler).__name__}), which cannot "
            f"be split across {num_replicas} processes from outside. Give it a DistributedSampler "
            f"(or make it yield this rank's batches) in the config."
        )
    sampler = loader.sampler
    if _is_distributed(sampler):
        return loader
    dataset = loader.dataset
    if type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler and not sampler.replacement
        # torch's Dataset stub has no __len__
        and sampler.num_samples == len(loader.dataset)  # type: ignore[arg-type]
    ):
        new_sampler: Any = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=type(sampler) is RandomSampler, seed=seed
        )
    else:
        from ignite.distributed import DistributedProxySampler

        # torch types DataLoader.sampler as Sampler | Iterable
        new_sampler = DistributedProxySampler(sampler, num_replicas=num_replicas, rank=rank)  # type: ignore[arg-type]
    kwargs = {name: getattr(loader, name) for name in _LOADER_ARGS if hasattr(loader, name)}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    else:
        kwargs.pop("persistent_workers", None)
    return DataLoader(dataset, batch_size=loader.batch_size, sampler=new_sampler, **kwargs)
