"""`CpuSyncBatchNorm` case by case in the ranks of a 2-process job, for test_sync_batch_norm.py.

:class:`LayerCases` is a callback of a ``hat-train --nproc 2`` job: each rank trains every case
of :data:`CASES` on its part of the case's global batch (:func:`case_batches`), then writes,
per case, its outputs, input gradients, parameter gradients, running statistics, host reads
and one eval-mode output to ``OUT_DIR/rank<r>.pt``; the test compares them with one
``BatchNorm`` on the whole batch (:func:`train` on all rows).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin

#: name -> (BatchNorm class, channels, per-sample shape after C, local batch size of each
#: rank, BatchNorm kwargs, dtype, value offset, training steps)
CASES: dict[str, tuple] = {
    "2d": (nn.BatchNorm1d, 5, (), (4, 4), {}, torch.float32, 0.0, 2),
    "3d unequal": (nn.BatchNorm1d, 3, (7,), (3, 5), {}, torch.float32, 0.0, 2),
    "4d momentum None": (nn.BatchNorm2d, 4, (3, 3), (5, 2), {"momentum": None}, torch.float32, 0.0, 3),
    "5d": (nn.BatchNorm3d, 2, (2, 3, 2), (2, 2), {}, torch.float32, 0.0, 2),
    "empty rank": (nn.BatchNorm2d, 3, (2, 2), (6, 0), {}, torch.float32, 0.0, 2),
    "affine False": (nn.BatchNorm2d, 3, (2, 2), (4, 2), {"affine": False}, torch.float32, 0.0, 2),
    "no running stats": (nn.BatchNorm2d, 3, (2, 2), (3, 3), {"track_running_stats": False}, torch.float32, 0.0, 2),
    "float64": (nn.BatchNorm2d, 4, (3, 3), (3, 5), {}, torch.float64, 0.0, 2),
    "mean 1000": (nn.BatchNorm2d, 4, (4, 4), (4, 4), {}, torch.float32, 1000.0, 2),
}


def case_batches(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's global ``(input, output weights)``; rank 0 holds the first rows, rank 1 the rest."""
    _, channels, rest, sizes, _, dtype, offset, steps = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    shape = (sum(sizes), channels, *rest)
    return [(torch.randn(shape, generator=gen, dtype=torch.float64).mul(3).add(offset + 1).to(dtype),
             torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)) for _ in range(steps)]


def make_bn(name: str) -> nn.Module:
    """The case's plain BatchNorm, with non-trivial affine parameters and running statistics."""
    cls, channels, _, _, kwargs, dtype, _, _ = CASES[name]
    bn = cls(channels, **kwargs).to(dtype)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        if bn.affine:
            bn.weight.copy_(torch.rand(channels, generator=gen) + 0.5)
            bn.bias.copy_(torch.randn(channels, generator=gen))
        if bn.track_running_stats:
            bn.running_mean.copy_(torch.randn(channels, generator=gen))
            bn.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
    return bn


def rank_rows(name: str, rank: int) -> slice:
    sizes = CASES[name][3]
    return slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))


def train(bn: nn.Module, name: str, rows: slice, dtype: torch.dtype | None = None) -> dict:
    """Run the case's steps on ``rows`` of each batch (loss ``sum(out * weights)``; in ``dtype``
    if given), counting the host reads of the forwards and backwards; then one eval forward on
    the first batch's rows."""
    from host_reads import HostReads

    result: dict = {"out": [], "input_grad": [], "weight_grad": [], "bias_grad": []}
    reads = HostReads()
    batches = [(x.to(dtype or x.dtype), w.to(dtype or w.dtype)) for x, w in case_batches(name)]
    for x, w in batches:
        x = x[rows].clone().requires_grad_(True)
        bn.zero_grad(set_to_none=True)
        with reads:
            out = bn.train()(x)
            (out * w[rows]).sum().backward()
        result["out"].append(out.detach())
        result["input_grad"].append(x.grad)
        result["weight_grad"].append(None if bn.weight is None else bn.weight.grad)
        result["bias_grad"].append(None if bn.bias is None else bn.bias.grad)
    result["host_reads"] = reads.per_step[0]
    result["state"] = {k: v.clone() for k, v in bn.state_dict().items()}
    with torch.no_grad():
        result["eval_out"] = bn.eval()(batches[0][0][rows])
    return result


class LayerCases(CallbackMixin):
    """At loop begin, in every rank of a real job: train each case of :data:`CASES` with
    `CpuSyncBatchNorm` on this rank's rows and write the results to ``out_dir/rank<r>.pt``."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_loop_begin(self, **kwargs) -> None:
        import torch.distributed as dist

        from hat_ignite.engine.sync_batch_norm import CpuSyncBatchNorm, convert_sync_batchnorm

        rank = dist.get_rank()
        results: dict = {}
        for name in CASES:
            bn = convert_sync_batchnorm(nn.Sequential(make_bn(name)))[0]
            assert isinstance(bn, CpuSyncBatchNorm)
            results[name] = train(bn, name, rank_rows(name, rank))
        # eval mode communicates nothing: rank 0 alone runs more eval forwards (a collective would hang)
        if rank == 0:
            with torch.no_grad():
                bn.eval()(case_batches(name)[0][0])
        # a process group of this rank alone: plain BatchNorm on the local rows
        groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
        name = "3d unequal"
        bn = convert_sync_batchnorm(nn.Sequential(make_bn(name)), process_group=groups[rank])[0]
        results["own group"] = train(bn, name, rank_rows(name, rank))
        dist.barrier()
        os.makedirs(self.out_dir, exist_ok=True)
        torch.save(results, os.path.join(self.out_dir, f"rank{rank}.pt"))
