"""One quantization partition per call of a module, as ``torch.export(strict=True)`` gives.

torchao's quantizers find the ops to quantize with ``get_source_partitions``, which groups the
nodes of a graph by the ``source_fn_stack`` each node carries: one group per *call* of a torch.nn
layer (``relu``, ``relu_1``, ...). A non-strict ``torch.export`` (what the converters use: it runs
the model's Python as it is) leaves ``source_fn_stack`` out, and the grouping falls back to the
module's *name*. A module called more than once — torchvision's ``BasicBlock`` applies its one
``self.relu`` twice, a detection head runs its convs on every FPN level — then becomes one group
with several outputs, and the X86 quantizer stops with "Input partition has more than one output
node".

The graph still knows each call apart: ``nn_module_stack`` names every call of a module with its
own key (``head.conv``, ``head.conv@1``, ``head.conv@2``). :func:`tag_module_calls` writes the
``source_fn_stack`` strict export would have written for the ops of torch.nn's own layers, keyed
by that call, so each call is its own partition and gets its own observers (a shared conv's
weight is one tensor; the activations of each call are observed separately).

Functional calls (``torch.add``, ``x + y``) carry ``torch_fn``: a name counted per kind of
function (``add_1`` is the first ``torch.add`` *and* the first ``Tensor.add``), which the grouping
would also merge; they are tagged with that name and their kind together, under the function's
name the quantizers look for (``"add"``).

>>> import torch
>>> from torch import nn
>>> class Twice(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.relu = nn.ReLU()
...     def forward(self, x):
...         return self.relu(self.relu(x) - 1)
>>> graph = torch.export.export(Twice(), (torch.randn(2, 3),), strict=False).module()
>>> tag_module_calls(graph)
3
>>> [n.meta["source_fn_stack"][-1] for n in graph.graph.nodes if "source_fn_stack" in n.meta]
[('relu', <class 'torch.nn.modules.activation.ReLU'>), ('sub_1:method_descriptor.sub', 'sub'), ('relu@1', <class 'torch.nn.modules.activation.ReLU'>)]
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import fx, nn

__all__ = ["tag_module_calls"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _torch_layer(cls: Any) -> type | None:
    """The class of a torch.nn layer (``torch.nn.modules.*``, not a container), else ``None``.

    ``nn_module_stack`` holds classes or their dotted names, depending on how the graph was made.
    """
    if isinstance(cls, str):
        module_name, _, name = cls.rpartition(".")
        if not module_name.startswith("torch.nn.modules"):
            return None
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            return None
    if not isinstance(cls, type) or not issubclass(cls, nn.Module) or issubclass(cls, _CONTAINERS):
        return None
    return cls if cls.__module__.startswith("torch.nn.modules") else None


def _call_name(key: str, fqn: str) -> str:
    """``head.conv@1`` for the second call of ``head.conv`` (``key``: the stack's key for that call)."""
    _, at, count = key.rpartition("@")
    return f"{fqn}@{count}" if at and count.isdigit() else fqn


def tag_module_calls(graph: fx.GraphModule) -> int:
    """Give every op of a torch.nn layer or a functional call that has no ``source_fn_stack`` one
    naming its call.

    Args:
        graph: an exported graph (``ExportedProgram.module()``), changed in place.

    Returns:
        How many nodes were tagged (``0`` for a graph from a strict export, which has them).
    """
    tagged = 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.meta.get("source_fn_stack"):
            continue
        stack = node.meta.get("nn_module_stack")
        layer = None
        if stack:
            key, (fqn, cls) = list(stack.items())[-1]
            layer = _torch_layer(cls)
        if layer is not None:
            node.meta["source_fn_stack"] = [(_call_name(key, fqn), layer)]
        elif isinstance(torch_fn := node.meta.get("torch_fn"), tuple) and len(torch_fn) == 2:
            name, kind = torch_fn  # ("add_1", "method_descriptor.add")
            node.meta["source_fn_stack"] = [(f"{name}:{kind}", kind.rpartition(".")[2])]
        else:
            continue
        tagged += 1
    return tagged
