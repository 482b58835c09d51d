"""HAT's ``QuantStub`` / ``DeQuantStub``: where a model's int8 part begins and ends.

HAT models mark their quantized part as eager-mode PyTorch does: a ``QuantStub`` where it begins
(``x = self.quant(x)``) and a ``DeQuantStub`` where it ends (a head's last conv, before the
post-processing or the loss). Ops before the first and after the last run in float. In an
exported graph both stubs are identities and leave no trace, and the X86 quantizer would
quantize everything it recognises, post-processing included (a deploy model's ``cat`` / ``split``,
a head HAT keeps in float).

:func:`stub_markers` makes the stubs visible while a module is exported (each becomes a ``clone``
tagged with its kind); :class:`StubBoundaries` wraps the quantizer and removes the annotations of
every op in a float region: after a ``DeQuantStub``, or, when the graph has a ``QuantStub``, before
any. An op is in a float region when none of its inputs comes from the quantized part.
:func:`remove_markers` takes the clones out of the prepared graph again. A model without stubs is
quantized as before.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import fx, nn
from torch.utils._pytree import tree_flatten

__all__ = ["stub_markers", "StubBoundaries", "remove_markers"]

_KINDS = ("DeQuantStub", "QuantStub")  # DeQuantStub first: "QuantStub" is a suffix of it
_ANNOTATION = "quantization_annotation"


def _stub_kind(module: Any) -> str | None:
    """``"QuantStub"`` / ``"DeQuantStub"`` for torch's stubs and classes of those names (Horizon's)."""
    name = module if isinstance(module, str) else getattr(module, "__name__", type(module).__name__)
    name = str(name).rpartition(".")[2]
    return next((kind for kind in _KINDS if name == kind), None)


def _clone_forward(x: Any, *rest: Any, **kwargs: Any) -> Any:
    return x.clone() if isinstance(x, torch.Tensor) else x


@contextlib.contextmanager
def stub_markers(module: nn.Module) -> Iterator[int]:
    """While exporting inside this block, every stub of ``module`` computes a ``clone`` of its input.

    Yields how many stubs there are.
    """
    stubs = [m for m in module.modules() if _stub_kind(type(m))]
    for stub in stubs:
        stub.forward = _clone_forward  # the instance's own, deleted below
    try:
        yield len(stubs)
    finally:
        for stub in stubs:
            del stub.forward


def _marker_kind(node: fx.Node) -> str | None:
    if node.op != "call_function" or "clone" not in str(node.target):
        return None
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    _, (_, cls) = list(stack.items())[-1]
    return _stub_kind(cls)


def _float_nodes(graph: fx.Graph) -> set[fx.Node]:
    """The nodes of float regions (see the module docstring); empty for a graph without stubs."""
    kinds = {node: _marker_kind(node) for node in graph.nodes}
    if not any(kinds.values()):
        return set()
    starts_float = any(kind == "QuantStub" for kind in kinds.values())
    region: dict[fx.Node, str | None] = {}
    for node in graph.nodes:
        if kinds[node] is not None:
            region[node] = "float" if kinds[node] == "DeQuantStub" else "quant"
        elif node.op == "placeholder":
            region[node] = "float" if starts_float else "quant"
        elif node.op == "get_attr":
            region[node] = None
        else:
            inputs = {region.get(a) for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node)}
            region[node] = "quant" if "quant" in inputs else "float" if "float" in inputs else None
    return {node for node, where in region.items() if where == "float" and node.op not in ("placeholder", "output")}


class StubBoundaries:
    """A quantizer that annotates as ``quantizer`` does, but nothing in a float region.

    Has the methods ``prepare_qat_pt2e`` calls on a torchao ``Quantizer``.
    """

    def __init__(self, quantizer: Any) -> None:
        self.quantizer = quantizer

    def transform_for_annotation(self, model: fx.GraphModule) -> fx.GraphModule:
        return self.quantizer.transform_for_annotation(model)

    def annotate(self, model: fx.GraphModule) -> fx.GraphModule:
        model = self.quantizer.annotate(model) or model
        for node in _float_nodes(model.graph):
            node.meta.pop(_ANNOTATION, None)
        return model

    def validate(self, model: fx.GraphModule) -> None:
        self.quantizer.validate(model)

    def prepare_obs_or_fq_callback(self, model: fx.GraphModule, edge_or_node_to_obs_or_fq: dict) -> None:
        self.quantizer.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)


def remove_markers(graph: fx.GraphModule) -> int:
    """Take the stubs' clones out of a prepared graph; return how many."""
    markers = [node for node in graph.graph.nodes if _marker_kind(node)]
    for node in markers:
        node.replace_all_uses_with(node.args[0])
        graph.graph.erase_node(node)
    if markers:
        graph.recompile()
    return len(markers)
