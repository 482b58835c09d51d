"""`CpuSyncBatchNorm`: what ``torch.nn.SyncBatchNorm`` computes, on the CPU (gloo).

torch's ``SyncBatchNorm`` refuses CPU tensors in training (its kernels are CUDA/XPU only), and
``DistributedDataParallel`` refuses it in a CPU model, so a HAT config with ``sync_bn=True``
could not train in a CPU ``hat-train --nproc N`` job. This module computes the same thing with
public ``torch.distributed`` collectives:

* training: each rank reduces its local batch to per-channel count, sum and sum of squares
  (rebuilt in float64 from the local mean and variance, so that the global variance keeps
  its precision when ``|mean| >> std``), one ``all_reduce`` of one packed tensor gives the
  totals over the process group, and every rank normalises with the mean and biased
  variance of the *global* batch. Ranks may hold different numbers of samples (the
  statistics are count-weighted), and a rank with an empty batch still takes part. The
  running statistics move toward the global mean and the unbiased global variance
  (``var * N / (N - 1)``), as torch's ``SyncBatchNorm`` and ``BatchNorm`` do;
  ``momentum=None`` keeps the cumulative average. A step whose global batch is empty leaves
  them unchanged.
* backward: each rank sums ``dy`` and ``dy * (x - mean)`` per channel, one ``all_reduce``
  gives the global sums, and the input gradient is BatchNorm's over the global batch. The
  weight and bias gradients stay local: ``DistributedDataParallel`` averages them.
* eval mode, a process group of one rank, or no process group: plain ``BatchNorm``, no
  communication.

Both collectives block, as torch's ``SyncBatchNorm`` does on GPUs: statistics over all ranks
cannot exist before every rank has sent its own. They are no host reads: every count and
factor stays a tensor (``momentum=None`` included, where ``BatchNorm`` itself reads
``num_batches_tracked`` to the host).

The module has ``BatchNorm``'s parameters and buffers, so its ``state_dict`` keys are
``BatchNorm``'s: a checkpoint of a model trained with it loads into the plain model (as one
of a model trained with torch's ``SyncBatchNorm`` does).

>>> bn = convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(3)))[0]
>>> type(bn).__name__, sorted(bn.state_dict())
('CpuSyncBatchNorm', ['bias', 'num_batches_tracked', 'running_mean', 'running_var', 'weight'])
>>> tuple(bn(torch.rand(4, 3, 2, 2)).shape)  # no process group: BatchNorm
(4, 3, 2, 2)
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["CpuSyncBatchNorm", "convert_sync_batchnorm"]


def _layout(input: torch.Tensor) -> tuple[list[int], tuple[int, ...], int, torch.dtype]:
    """Reduced dims, per-channel view shape, local values per channel, compute dtype."""
    channels = input.shape[1]
    dims = [0, *range(2, input.dim())]
    shape = (1, channels) + (1,) * (input.dim() - 2)
    return dims, shape, input.numel() // channels, torch.promote_types(input.dtype, torch.float32)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode BatchNorm over the batch of every rank of ``group`` (see the module doc)."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        factor: float | torch.Tensor,
        group: Any,
    ) -> torch.Tensor:
        channels = input.shape[1]
        dims, shape, local, compute = _layout(input)
        x = input.to(compute)
        if local:
            var, mean = torch.var_mean(x, dim=dims, correction=0)
            mean64 = mean.double()
            # sum and sum of squares from the local (stable) mean and variance, in float64: the
            # global variance below subtracts two large numbers when |mean| >> std
            sums = torch.cat([mean64 * local, (var.double() + mean64 * mean64) * local, mean64.new_full((1,), local)])
        else:
            sums = torch.zeros(2 * channels + 1, dtype=torch.float64, device=input.device)
        dist.all_reduce(sums, group=group)
        total = sums[-1]
        mean64 = sums[:channels] / total
        var64 = (sums[channels:-1] / total - mean64 * mean64).clamp_min(0)
        mean, invstd = mean64.to(compute), torch.rsqrt(var64 + eps).to(compute)
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                seen = total > 0  # an empty global batch leaves the statistics as they are
                unbiased = var64 * total / (total - 1)
                for buffer, value in ((running_mean, mean64), (running_var, unbiased)):
                    moved = buffer * (1 - factor) + value.to(buffer.dtype) * factor
                    buffer.copy_(torch.where(seen, moved, buffer))
        ctx.save_for_backward(input, weight, mean, invstd, total)
        ctx.group = group
        ctx.bias_dtype = None if bias is None else bias.dtype
        if not local:
            return torch.empty_like(input)
        scale = invstd if weight is None else invstd * weight
        shift = -mean * scale if bias is None else bias - mean * scale
        return torch.addcmul(shift.view(shape), x, scale.view(shape)).to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, mean, invstd, total = ctx.saved_tensors
        channels = input.shape[1]
        dims, shape, local, compute = _layout(input)
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        if local:
            dy = grad_output.to(compute)
            xmu = input.to(compute) - mean.view(shape)
            sum_dy, sum_dy_xmu = dy.sum(dims), (dy * xmu).sum(dims)
        else:
            sum_dy = sum_dy_xmu = torch.zeros(channels, dtype=compute, device=input.device)
        # zeros, not None, for an empty batch: DDP waits for a gradient of every parameter
        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if need_weight else None
        grad_bias = sum_dy.to(ctx.bias_dtype) if need_bias else None
        grad_input = None
        if need_input:  # every rank agrees (same model): all of them take part or none
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, group=ctx.group)
            if local:
                mean_dy, mean_dy_xmu = (sums / total.to(compute)).view(2, *shape)
                scale = invstd if weight is None else invstd * weight
                grad_input = (dy - mean_dy - xmu * (invstd * invstd).view(shape) * mean_dy_xmu) * scale.view(shape)
                grad_input = grad_input.to(input.dtype)
            else:
                grad_input = torch.zeros_like(input)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm over the batches of all ranks, for CPU (gloo) runs: torch's ``SyncBatchNorm``'s job.

    In training, with a process group of two ranks or more, it normalises with the statistics
    of the whole batch of ``process_group`` (see the module docstring); otherwise (eval mode,
    one rank, no process group) it is ``BatchNorm``. Like ``torch.nn.SyncBatchNorm`` it takes
    inputs ``[N, C, ...]`` of 2 dims or more (those of ``BatchNorm1d`` to ``BatchNorm3d``).
    It is not a ``torch.nn.SyncBatchNorm`` subclass: ``DistributedDataParallel`` refuses those
    on the CPU. Build it with :func:`convert_sync_batchnorm`.

    Args:
        num_features: channels ``C`` of the input.
        eps: added to the variance.
        momentum: weight of the new statistics in the running ones; ``None`` for the
            cumulative average.
        affine: learnable ``weight`` and ``bias``.
        track_running_stats: keep running statistics (else batch statistics in eval too).
        process_group: the ranks whose batches are normalised together (default: all).
        device: device of the parameters and buffers.
        dtype: dtype of the parameters and buffers.
        bias: a learnable ``bias`` (with ``affine``).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"CpuSyncBatchNorm: expected an input [N, C, ...] of at least 2 dims, got {input.dim()}")

    def __deepcopy__(self, memo: dict[int, Any]) -> CpuSyncBatchNorm:
        """A copy sharing the process group (a group cannot be copied; EMA and validation copy models)."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        if self.process_group is not None:
            memo[id(self.process_group)] = self.process_group
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(input)  # BatchNorm: eval mode, or no ranks to synchronise with
        group = self.process_group or dist.group.WORLD
        if dist.get_world_size(group) < 2:
            return super().forward(input)
        self._check_input_dim(input)
        if input.shape[1] == 0:
            raise ValueError("CpuSyncBatchNorm: the input has no channels (dim 1 is 0)")
        factor: float | torch.Tensor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            assert self.num_batches_tracked is not None  # registered whenever statistics are tracked
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative average, without reading the count to the host
                factor = 1.0 / self.num_batches_tracked
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean, self.running_var, self.eps, factor, group,
        )


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every ``BatchNorm`` layer in ``module`` by a :class:`CpuSyncBatchNorm`.

    As ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does: the new layers take over the old
    ones' parameters and buffers (the same tensors), training mode and ``qconfig``.

    Args:
        module: a model, or one ``BatchNorm`` layer (then a new layer is returned).
        process_group: the ranks to synchronise over (default: all ranks).

    Returns:
        ``module`` with its layers replaced, or the new layer.

    Example:
        >>> net = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, momentum=None)))
        >>> type(net[1]).__name__, net[1].momentum
        ('CpuSyncBatchNorm', None)
    """
    converted = module
    if isinstance(module, _BatchNorm):
        converted = CpuSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
            process_group, bias=module.bias is not None,
        )
        if module.affine:
            with torch.no_grad():
                converted.weight = module.weight
                converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
        if hasattr(module, "qconfig"):
            converted.qconfig = module.qconfig
    for name, child in module.named_children():
        converted.add_module(name, convert_sync_batchnorm(child, process_group))
    return converted
