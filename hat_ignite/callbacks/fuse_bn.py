"""`FuseBN`: fold BatchNorm layers into the preceding convolution / linear layer during training.

What is fused: inside the named sub-modules, at any depth, every ``nn.Sequential`` or
``nn.ModuleList`` whose child ``i`` is a ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d`` or
``Linear`` and whose child ``i + 1`` is a BatchNorm layer with running statistics and matching
channels. The BatchNorm's running statistics and affine parameters are folded into the layer's
weight and bias with ``torch.nn.utils.fusion.fuse_conv_bn_weights`` /
``fuse_linear_bn_weights`` and the BatchNorm is replaced by ``nn.Identity``, so in eval mode
the model computes the same function (up to float rounding). A ``ModuleList`` is assumed to be
applied in order, as HAT assumes too.

Training goes on with the fused layers (no batch statistics any more). The optimizer is told:

* the fused weight keeps its ``Parameter`` object (values rewritten in place; with
  ``inplace=False`` the sub-module is a fused copy and every parameter of it replaces its
  predecessor in the optimizer, state included);
* a layer without bias gets a new ``bias`` parameter, added to the param group of the
  BatchNorm's bias (the parameter it takes over; usually the no-weight-decay group) or, with no
  affine BatchNorm, to the weight's group; it trains when that BatchNorm bias (or the weight)
  did;
* the BatchNorm's weight and bias leave their param groups;
* the optimizer state (momentum, Adam moments) of the fused weight and bias starts afresh,
  since their scale changed.

When the loop has an EMA model (``loop.ema_model``), the same modules are fused in it too, with
the EMA's own statistics, so the average goes on over matching parameters. Fusion changes the
parameter set, which ``DistributedDataParallel`` fixes when it wraps the model: under DDP fuse
before wrapping (a ``model_convert_pipeline`` step calling :func:`fuse_conv_bn_pairs`). A run
resumed past the fuse point needs its model built fused the same way before loading.
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from hat_ignite.checkpoint.payload import unwrap_model
from hat_ignite.callbacks.module_schedule import ModuleScheduleBase, get_submodule

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["FuseBN", "fuse_conv_bn_pairs"]

logger = logging.getLogger(__name__)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _fusable(layer: nn.Module, bn: nn.Module) -> bool:
    if not isinstance(bn, _BatchNorm) or not isinstance(layer, (_ConvNd, nn.Linear)):
        return False
    channels = layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
    if bn.num_features != channels:
        return False
    if bn.running_mean is None or bn.running_var is None:
        logger.warning("FuseBN: %s has no running statistics (track_running_stats=False); not fused.", bn)
        return False
    return True


@torch.no_grad()
def _fuse_pair(layer: nn.Linear | _ConvNd, bn: _BatchNorm) -> None:
    """Fold ``bn`` into ``layer``'s weight (rewritten in place) and bias (created when absent)."""
    mean, var = bn.running_mean, bn.running_var
    assert mean is not None and var is not None  # _fusable checked them
    ones, zeros = torch.ones_like(mean), torch.zeros_like(mean)
    bn_w = bn.weight if bn.weight is not None else ones
    bn_b = bn.bias if bn.bias is not None else zeros
    if isinstance(layer, nn.Linear):
        weight, bias = fuse_linear_bn_weights(layer.weight, layer.bias, mean, var, bn.eps, bn_w, bn_b)
    else:
        weight, bias = fuse_conv_bn_weights(
            layer.weight, layer.bias, mean, var, bn.eps, bn_w, bn_b,
            transpose=isinstance(layer, _ConvTransposeNd),
        )
    layer.weight.copy_(weight)
    if layer.bias is not None:
        layer.bias.copy_(bias)
    else:
        trains = bn.bias.requires_grad if bn.bias is not None else layer.weight.requires_grad
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=trains)


def fuse_conv_bn_pairs(module: nn.Module, prefix: str = "") -> list[tuple[str, str]]:
    """Fuse every conv/linear + BatchNorm pair inside ``module`` in place (see the module docs).

    Args:
        module: the module to search, at any depth.
        prefix: prepended to the returned names (the module's own name in a larger model).

    Returns:
        ``(layer_name, batchnorm_name)`` for each fused pair; each BatchNorm is now ``Identity``.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
        >>> _ = net[1].running_mean.uniform_(), net[1].running_var.uniform_(1, 2)
        >>> x = torch.randn(2, 1, 5, 5)
        >>> before = net(x)
        >>> fuse_conv_bn_pairs(net)
        [('0', '1')]
        >>> torch.allclose(net(x), before, atol=1e-5), type(net[1]).__name__
        (True, 'Identity')
    """
    containers = [
        (name, m) for name, m in module.named_modules(prefix=prefix)
        if isinstance(m, (nn.Sequential, nn.ModuleList))
    ]
    fused: list[tuple[str, str]] = []
    for cname, container in containers:
        children = list(container.named_children())
        for (lname, layer), (bname, bn) in zip(children, children[1:]):
            if _fusable(layer, bn):
                _fuse_pair(layer, bn)  # type: ignore[arg-type]
                setattr(container, bname, nn.Identity())
                fused.append((_join(cname, lname), _join(cname, bname)))
    return fused


def _sync_optimizer(
    optimizer: torch.optim.Optimizer, before: dict[str, nn.Parameter], after: dict[str, nn.Parameter],
    pairs: list[tuple[str, str]],
) -> None:
    """Make ``optimizer`` train the parameters ``after`` instead of ``before`` (see the module docs)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    state = optimizer.state
    reset = {f"{layer}.{kind}" for layer, _ in pairs for kind in ("weight", "bias")}
    for name, old in before.items():
        group = group_of.get(id(old))
        if group is None:
            continue
        new = after.get(name)
        if new is None:  # a BatchNorm parameter folded away
            group["params"] = [p for p in group["params"] if p is not old]
            state.pop(old, None)
        elif new is not old:  # a fused copy replaced the module
            group["params"] = [new if p is old else p for p in group["params"]]
            moved = state.pop(old, None)
            if moved is not None and name not in reset:
                state[new] = moved
        elif name in reset:
            state.pop(old, None)
    for layer, bn in pairs:
        name = f"{layer}.bias"
        if name in before:
            continue
        group = None
        for donor in (f"{bn}.bias", f"{layer}.weight"):
            if donor in before and id(before[donor]) in group_of:
                group = group_of[id(before[donor])]
                break
        if group is not None:
            group["params"].append(after[name])


class FuseBN(ModuleScheduleBase):
    """Fuse conv/linear + BatchNorm pairs of named sub-modules at a given step or epoch.

    What is fused and how the optimizer and the EMA model follow: see the module docs.

    Args:
        modules: one list of sub-module names per entry, e.g. ``[["backbone"], ["neck"]]``.
        step_or_epoch: when each entry is fused (``global_step_id`` or ``epoch_id``, 0-based).
        update_by: ``"step"`` or ``"epoch"``.
        inplace: fuse the model's own sub-modules (``True``), or install a fused copy of each
            named sub-module in its place (``False``, HAT's default; the old module objects stay
            untouched for whoever still holds them).

    Example:
        >>> FuseBN(modules=[["backbone"], ["neck"]], step_or_epoch=[10000, 15000], update_by="step")
        FuseBN(modules=[['backbone'], ['neck']], step_or_epoch=[10000, 15000], update_by='step')
    """

    def __init__(
        self, modules: Sequence[Sequence[str] | str], step_or_epoch: Sequence[int], update_by: str, inplace: bool = False
    ) -> None:
        super().__init__(modules, step_or_epoch, update_by)
        self.inplace = bool(inplace)

    def process(self, model: nn.Module, name: str, inplace: bool = False) -> list[tuple[str, str]]:
        """Fuse the sub-module ``name`` of ``model``; return the fused pairs' names in ``model``.

        With ``inplace=False`` the sub-module is replaced by a fused deep copy (the whole model,
        ``name=""``, is always fused in place).
        """
        model = unwrap_model(model)
        sub = get_submodule(model, name, type(self).__name__)
        if inplace or not name:
            return fuse_conv_bn_pairs(sub, prefix=name)
        fused_copy = copy.deepcopy(sub)
        pairs = fuse_conv_bn_pairs(fused_copy, prefix=name)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, fused_copy)
        return pairs

    def apply(self, model: nn.Module, names: list[str], loop: LoopBase | None = None) -> None:
        """Fuse ``names`` in ``model``; with a running ``loop``, its optimizer and EMA model follow."""
        model = unwrap_model(model)
        before = dict(model.named_parameters())
        pairs: list[tuple[str, str]] = []
        for name in names:
            pairs += self.process(model, name, self.inplace)
        if loop is None:  # hooks called by hand, with only the model: nothing else to update
            logger.info("FuseBN: fused %d layer+BatchNorm pair(s) in %s.", len(pairs), names)
            return
        if loop.optimizer is not None:
            _sync_optimizer(loop.optimizer, before, dict(model.named_parameters()), pairs)
        if loop.ema_model is not None:
            for name in names:
                self.process(loop.ema_model, name, inplace=True)
        logger.info(
            "FuseBN: fused %d layer+BatchNorm pair(s) in %s at %s %d.", len(pairs), names,
            self.update_by, loop.state.iteration - 1 if self.update_by == "step" else loop.state.epoch - 1,
        )

    def on_loop_begin(self, model: nn.Module, **kwargs: Any) -> None:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            raise ValueError(
                "FuseBN changes the model's parameters during training, which DistributedDataParallel "
                "does not allow once it wraps the model. Fuse before wrapping (call "
                "hat_ignite.callbacks.fuse_bn.fuse_conv_bn_pairs in model_convert_pipeline) instead."
            )
        super().on_loop_begin(model=model, **kwargs)

    def __repr__(self) -> str:
        base = super().__repr__()
        return base if not self.inplace else f"{base[:-1]}, inplace=True)"
