"""Building data loader configs as HAT does: the sampler idiom, and samplers outside a process group.

Used by :mod:`hat_ignite.registry` for every object it builds; both checks cost a dict lookup
for objects that are not loaders or samplers (torch is imported only for a torch sampler).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["loader_sampler_args", "distributed_sampler_args"]


def _is_subclass(target: Any, module: str, name: str) -> bool:
    """``issubclass(target, module.name)``, importing ``module`` only when it already is imported."""
    base = getattr(sys.modules.get(module), name, None)
    return isinstance(target, type) and base is not None and issubclass(target, base)


def loader_sampler_args(target: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """HAT's sampler idiom: a DataLoader's ``sampler`` config gets the loader's ``dataset``.

    ``dict(type=DataLoader, dataset=..., sampler=dict(type=DistributedSampler), shuffle=True)``
    builds the sampler on the same dataset object and the loader with ``shuffle=False`` (the
    sampler decides the order), as HAT does.

    Example:
        >>> from torch.utils.data import DataLoader, DistributedSampler
        >>> cfg = {"dataset": {"type": "DigitsDataset"}, "sampler": {"type": DistributedSampler}, "shuffle": True}
        >>> args = loader_sampler_args(DataLoader, cfg)
        >>> args["shuffle"], args["sampler"]["dataset"] is cfg["dataset"], "dataset" in cfg["sampler"]
        (False, True, False)
    """
    if not _is_subclass(target, "torch.utils.data", "DataLoader"):
        return kwargs
    sampler = kwargs["sampler"]
    kwargs = dict(kwargs)
    if "dataset" not in sampler and "dataset" in kwargs:
        kwargs["sampler"] = {**sampler, "dataset": kwargs["dataset"]}  # the same dataset dict: built once
    kwargs["shuffle"] = False
    return kwargs


def distributed_sampler_args(target: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A ``DistributedSampler`` built outside a process group: one replica, rank 0.

    torch reads ``num_replicas``/``rank`` from the default process group and fails without one;
    a single-process run (no group) has exactly one replica.
    """
    if not _is_subclass(target, "torch.utils.data", "DistributedSampler"):
        return kwargs
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return kwargs  # torch takes them from the group
    return {"num_replicas": 1, "rank": 0, **kwargs}
