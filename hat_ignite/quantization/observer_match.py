"""Loading a calibration or QAT checkpoint into a model prepared from another graph (HAT's deploy model).

A prepared graph's fake-quantize modules are named by the order prepare inserted them
(``activation_post_process_0``, ``_1``, ...). HAT's export-only ``int_infer`` stage prepares the
*deploy* model and loads the QAT checkpoint of the *training* model: the two graphs share the
quantized ops, but one may compute more (post-processing) or less (a head built but not called),
and any op quantized in one graph only shifts the numbers of every observer after it. Loading by
name would then give observers silently the ranges of others (activation scales are scalars: no
shape check catches it).

So every prepared module records *what* each of its observers observes
(:func:`observer_identities`: the op producing the observed tensor, named by the module call it
belongs to, and the ops reading it), and checkpoints keep that record. :func:`align_observers`
renames a checkpoint's observer entries to the loading model's observers that observe the same
thing, and then:

* drops the checkpoint's observers of ops the model does not compute, and the weights of modules
  the model builds but never calls (a deploy model without the training head), with a log line;
* gives an observer the checkpoint lacks the range it has by construction when one is recorded:
  the same tensor's other observer, or for an op whose output range follows from its input
  (pooling, ``cat``, reshapes, ``split``) the observer of that input;
* leaves any other missing range missing, so that loading refuses it by name (an uncalibrated
  range is never used silently).

Checkpoints without the record (written before it existed) load by name, as before.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from torch import fx, nn

from hat_ignite.errors import CheckpointError

__all__ = ["observer_identities", "uncalled_modules", "align_observers"]

logger = logging.getLogger(__name__)

_OBSERVER = "activation_post_process_"
#: aten ops whose output lies within the range of their (first) input: quantized, their observer
#: takes that input's range
_RANGE_FOLLOWING = {
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "cat", "concat", "flatten", "reshape", "view",
    "permute", "transpose", "squeeze", "unsqueeze", "split", "split_with_sizes", "chunk", "getitem", "slice",
    "select", "contiguous", "clone", "upsample_nearest2d", "pixel_shuffle", "pixel_unshuffle",
}


def _is_observer(node: fx.Node) -> bool:
    return node.op == "call_module" and str(node.target).startswith(_OBSERVER)


def _scope(node: fx.Node) -> str:
    """The module call an op belongs to: its innermost ``nn_module_stack`` entry, call count included."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    key, (fqn, _) = list(stack.items())[-1]
    _, at, count = str(key).rpartition("@")
    return f"{fqn}@{count}" if at and count.isdigit() else str(fqn)


def _op_name(node: fx.Node) -> str:
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    return name.split(".")[0] if node.op == "call_function" else str(name)


def _names(graph: fx.GraphModule) -> dict[fx.Node, str]:
    """A name for every node that does not depend on how many observers precede it."""
    counts: Counter[tuple[str, str]] = Counter()
    names: dict[fx.Node, str] = {}
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            names[node] = f"input:{node.name}"
        elif node.op == "get_attr":
            names[node] = f"attr:{node.target}"
        elif node.op == "output":
            names[node] = "output"
        elif not _is_observer(node):
            key = (_scope(node), _op_name(node))
            names[node] = f"{key[0]}/{key[1]}#{counts[key]}"
            counts[key] += 1
    return names


def _observed(node: fx.Node) -> fx.Node:
    """The tensor an observer call observes, through observers of observers."""
    source = node.args[0]
    while isinstance(source, fx.Node) and _is_observer(source):
        source = source.args[0]
    return source if isinstance(source, fx.Node) else node


def _readers(node: fx.Node) -> list[fx.Node]:
    out = []
    for user in node.users:
        out.extend(_readers(user) if _is_observer(user) else [user])
    return out


def observer_identities(graph: nn.Module) -> dict[str, str]:
    """``{observer name: "<observed op> -> <readers>"}`` for every fake-quantize call of a prepared graph.

    An op is named by its module call (``head.conv.0@1``: the second call of that conv), its aten
    op and its rank among the same ops of that call; a weight by its attribute, an input by its
    name.
    """
    if not isinstance(graph, fx.GraphModule):
        return {}
    names = _names(graph)
    out: dict[str, str] = {}
    for node in graph.graph.nodes:
        if _is_observer(node):
            readers = ",".join(sorted(names.get(r, r.name) for r in _readers(node)))
            out[str(node.target)] = f"{names.get(_observed(node), '?')} -> {readers}"
    return out


def uncalled_modules(module: nn.Module, graph: fx.GraphModule) -> list[str]:
    """The submodules of ``module`` holding weights that no op of its exported ``graph`` belongs to."""
    called: set[str] = set()
    for node in graph.graph.nodes:
        for fqn, _ in (node.meta.get("nn_module_stack") or {}).values():
            called.add(str(fqn))
    read = {str(node.target).rpartition(".")[0] for node in graph.graph.nodes if node.op == "get_attr" and node.users}
    return [
        name for name, sub in module.named_modules()
        if name and name not in called and name not in read
        and any(True for _ in sub.parameters(recurse=False))
    ]


def _observed_part(identity: str) -> str:
    return identity.split(" -> ", 1)[0]


def _pair_up(saved: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """``{own observer: saved observer}`` observing the same thing; by the whole identity, then by the
    observed tensor alone where that is unambiguous on both sides."""
    by_identity: dict[str, list[str]] = {}
    for name, identity in saved.items():
        by_identity.setdefault(identity, []).append(name)
    pairs: dict[str, str] = {}
    for name, identity in own.items():
        candidates = by_identity.get(identity, [])
        if len(candidates) == 1 or name in candidates:  # observers of one identity see the same tensor
            pairs[name] = name if name in candidates else candidates[0]
    taken = set(pairs.values())
    saved_by_tensor: dict[str, list[str]] = {}
    for name, identity in saved.items():
        if name not in taken:
            saved_by_tensor.setdefault(_observed_part(identity), []).append(name)
    own_by_tensor: dict[str, list[str]] = {}
    for name, identity in own.items():
        if name not in pairs:
            own_by_tensor.setdefault(_observed_part(identity), []).append(name)
    for tensor, names in own_by_tensor.items():
        if len(names) == 1 and len(saved_by_tensor.get(tensor, [])) == 1:
            pairs[names[0]] = saved_by_tensor[tensor][0]
    return pairs


def _input_tensor(graph: fx.GraphModule, names: Mapping[fx.Node, str], own_name: str) -> str | None:
    """The name of the input of the range-following op whose output observer ``own_name`` observes."""
    for node in graph.graph.nodes:
        if _is_observer(node) and node.target == own_name:
            produced = _observed(node)
            if produced.op != "call_function" or _op_name(produced) not in _RANGE_FOLLOWING:
                return None
            first = produced.args[0]
            first = first[0] if isinstance(first, (list, tuple)) and first else first
            if isinstance(first, fx.Node) and _is_observer(first):
                first = _observed(first)
            return names.get(first) if isinstance(first, fx.Node) else None
    return None


def _sources(module: Any, saved: Mapping[str, str]) -> tuple[dict[str, str], list[str], list[str]]:
    """``({own observer: saved observer to load it from}, own observers with none, what was taken)``.

    Paired observers load their own; an observer of a tensor another paired observer sees takes
    that one's range; an observer of a range-following op's output takes the range saved for the
    op's input (iterated, for chains such as ``cat`` then ``split``).
    """
    own = module.observers
    sources = _pair_up(saved, own)
    names = _names(module.graph)
    saved_by_tensor: dict[str, str] = {}
    for name, identity in saved.items():
        saved_by_tensor.setdefault(_observed_part(identity), name)
    taken: list[str] = []
    progress = True
    while progress:
        progress = False
        for name in [o for o in own if o not in sources]:
            tensor = _observed_part(own[name])
            source = next((sources[o] for o in sources if _observed_part(own[o]) == tensor), None)
            if source is None:
                before = _input_tensor(module.graph, names, name)
                if before is not None:
                    source = next((sources[o] for o in sources if _observed_part(own[o]) == before),
                                  saved_by_tensor.get(before))
                    if source is not None:
                        taken.append(f"{tensor} takes the range of {before}")
            if source is not None:
                sources[name] = source
                progress = True
    return sources, [o for o in own if o not in sources], taken


def _load_under_own_names(weights: dict[str, Any], prefix: str, sources: Mapping[str, str]) -> dict[str, Any]:
    """``weights`` with every saved observer's entries replaced by those of the own observers loading from it."""
    out = {k: v for k, v in weights.items() if not k.startswith(prefix + _OBSERVER)}
    for own_name, saved_name in sources.items():
        head = f"{prefix}{saved_name}."
        for key, value in weights.items():
            if key.startswith(head):
                out[f"{prefix}{own_name}.{key[len(head):]}"] = value
    return out


def align_observers(model: nn.Module, weights: Mapping[str, Any], records: Any, path: str,
                    allow_miss: bool = False) -> dict[str, Any]:
    """``weights`` (a checkpoint's state dict) with its observer entries under the names ``model``'s
    prepared modules give the same observers (see the module docstring).

    Args:
        model: the model to load into (DDP wrappers already looked through).
        weights: the checkpoint's weights.
        records: the checkpoint's ``prepared_modules`` entry (``None`` for a float checkpoint).
        path: the checkpoint, named in messages.
        allow_miss: leave a range the checkpoint lacks as the model has it, with a warning.

    Raises:
        CheckpointError: the checkpoint lacks a range the model quantizes and cannot take from a
            saved one (without ``allow_miss``).
    """
    from hat_ignite.quantization.prepared import PreparedModule

    out = dict(weights)
    own_keys = set(model.state_dict())
    saved_records = {r.get("path"): r for r in records or () if isinstance(r, Mapping)}
    for where, module in model.named_modules():
        if not isinstance(module, PreparedModule):
            continue
        prefix = f"{where}.graph." if where else "graph."
        for name in module.uncalled:
            dropped = [k for k in out if k.startswith(f"{prefix}{name}.") and k not in own_keys]
            if dropped:
                logger.info("%s: %s builds %s but does not call it; its %d saved tensor(s) are not loaded.",
                            path, module.where(), name, len(dropped))
                for key in dropped:
                    del out[key]
        record = saved_records.get(module.qname)
        saved = record.get("observers") if record else None
        if not isinstance(saved, Mapping):
            continue  # a checkpoint from before observers were recorded: loaded by name
        own = module.observers
        sources, missing, taken = _sources(module, saved)
        unused = [s for s in saved if s not in sources.values()]
        if unused:  # observed an op this graph does not compute
            logger.info("%s: %s does not compute what %d saved observer(s) observed (%s); they are not loaded.",
                        path, module.where(), len(unused), "; ".join(_observed_part(saved[s]) for s in unused[:5]))
        for line in taken:
            logger.info("%s: %s: %s (its output range follows from its input).", path, module.where(), line)
        if missing:
            details = "; ".join(f"{n}: {own[n]}" for n in missing[:5])
            if not allow_miss:
                raise CheckpointError(
                    f"Checkpoint {path} has no quantization range for {len(missing)} tensor(s) that "
                    f"{module.where()} quantizes [{details}]: the model it was trained as did not quantize "
                    f"them, and their range does not follow from a saved one. Calibrate this model, compute "
                    f"those ops outside the prepared module (after a DeQuantStub, as HAT's deploy models do), "
                    f"or load with allow_miss=True to keep them uncalibrated."
                )
            logger.warning("%s: no saved range for %d tensor(s) %s quantizes (allow_miss=True, left "
                           "uncalibrated): %s", path, len(missing), module.where(), details)
        out = _load_under_own_names(out, prefix, sources)
    return out
