"""`Torch2Compile`: HAT's ``compiler`` argument, ``torch.compile`` applied to a model in place.

HAT's loops take ``compiler=`` (a converter config such as ``dict(type="Torch2Compile",
backend="inductor", mode="max-autotune")``) and apply it to the model once it is built,
converted and on its device. Ours does the same with one difference in *how*: instead of
returning ``torch.compile(model)`` (an ``OptimizedModule`` whose ``state_dict`` keys gain an
``_orig_mod.`` prefix), :class:`Torch2Compile` replaces the ``forward`` of the model (or of the
chosen submodules) by a compiled one. The model stays the same object of the same class: its
``state_dict`` keys, ``named_modules`` names, checkpoints, EMA copies, ``FreezeModule`` names and a
later ``DistributedDataParallel`` wrapper are those of the uncompiled model.

Compilation happens at the first forward, as with ``torch.compile``. Nothing is imported from
``torch._dynamo`` until a compiler is used.

>>> import torch
>>> graphs = []
>>> def counting_backend(gm, example_inputs):
...     graphs.append(gm)
...     return gm.forward
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
>>> compiled = Torch2Compile(backend=counting_backend)(model)
>>> compiled is model, is_compiled(model), sorted(model.state_dict())
(True, True, ['0.bias', '0.weight'])
>>> _ = model(torch.randn(4, 3))
>>> len(graphs)
1
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

__all__ = ["Torch2Compile", "TorchCompile", "apply_compiler", "build_compiler", "is_compiled", "remove_compiled_forward"]

logger = logging.getLogger(__name__)


def _compile_parameters() -> set[str]:
    return {name for name in inspect.signature(torch.compile).parameters if name != "model"}


class _CompiledForward:
    """A module's ``forward`` run through ``torch.compile`` (compiled at the first call).

    Held as the module's instance attribute ``forward``. Deep copies (EMA, validation copies)
    get a compiled forward of *their* module, not one calling the original's.
    """

    def __init__(self, module: nn.Module, options: dict[str, Any]) -> None:
        self.module = module
        self.options = options
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            plain = type(self.module).forward.__get__(self.module)
            compiled = self._compiled = torch.compile(plain, **self.options)
        return compiled(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _CompiledForward:
        return _CompiledForward(copy.deepcopy(self.module, memo), dict(self.options))


class _EagerForward:
    """A module's ``forward`` run outside any ``torch.compile`` graph (``skip_modules``)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _run_eagerly(type(self.module).forward, self.module, *args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _EagerForward:
        return _EagerForward(copy.deepcopy(self.module, memo))


def _run_eagerly(forward: Callable[..., Any], module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    global _disabled_run
    if _disabled_run is None:
        _disabled_run = torch.compiler.disable(lambda f, m, *a, **k: f(m, *a, **k))
    return _disabled_run(forward, module, *args, **kwargs)


_disabled_run: Callable[..., Any] | None = None


def is_compiled(module: nn.Module) -> bool:
    """Whether :class:`Torch2Compile` compiled ``module``'s forward (or any submodule's)."""
    return any(isinstance(m.__dict__.get("forward"), _CompiledForward) for m in module.modules())


def remove_compiled_forward(module: nn.Module) -> nn.Module:
    """Give ``module`` and its submodules their class's plain ``forward`` back; return ``module``.

    For exporting or tracing a copy of a compiled model (``SaveTraced``).
    """
    for m in module.modules():
        if isinstance(m.__dict__.get("forward"), (_CompiledForward, _EagerForward)):
            del m.__dict__["forward"]
    return module


def _match_children(model: nn.Module, patterns: Sequence[str], regex: bool, strict: bool,
                    what: str) -> Iterator[tuple[str, nn.Module]]:
    """Top-level children of ``model`` named by ``patterns`` (``re.match`` or exact names)."""
    children = dict(model.named_children())
    matched: dict[str, nn.Module] = {}
    for pattern in patterns:
        if regex:
            found = [n for n in children if re.match(pattern, n)]
        else:
            found = [pattern] if pattern in children else []
        if strict and not found:
            raise ValueError(
                f"Torch2Compile: {what} entry {pattern!r} matches no submodule of "
                f"{type(model).__name__} (its children: {sorted(children)}). Fix the name or "
                f"pattern, or set strict=False to allow it."
            )
        matched.update((n, children[n]) for n in found)
    yield from matched.items()


class Torch2Compile:
    """Compile a model with ``torch.compile``, in place (a ``model -> model`` converter).

    Args:
        compile_submodules: compile only these top-level submodules (regexes, or names when
            ``regex=False``) instead of the whole model.
        skip_modules: top-level submodules to run outside the compiled graph (the rest of the
            model is compiled). Exclusive with ``compile_submodules``.
        regex: whether the entries above are regular expressions (matched from the start of
            the child's name) or exact names.
        strict: whether an entry matching no submodule is an error.
        dynamo_cfg: ``torch._dynamo.config`` settings to apply (global to the process), e.g.
            ``{"cache_size_limit": 64}``; ``log_level`` sets dynamo's log level. An unknown key
            is logged and skipped, as in HAT.
        **compile_kwargs: ``torch.compile`` arguments: ``backend`` (default ``"inductor"``),
            ``mode``, ``dynamic``, ``fullgraph``, ``options``, ``disable`` ...

    Raises:
        ValueError: both ``compile_submodules`` and ``skip_modules`` given; a ``strict``
            entry matches nothing.
        TypeError: a keyword ``torch.compile`` does not take.
    """

    def __init__(
        self,
        compile_submodules: Sequence[str] | None = None,
        skip_modules: Sequence[str] | None = None,
        regex: bool = True,
        strict: bool = False,
        dynamo_cfg: dict[str, Any] | None = None,
        **compile_kwargs: Any,
    ) -> None:
        if compile_submodules and skip_modules:
            raise ValueError(
                "Torch2Compile: compile_submodules and skip_modules cannot be used together; give the "
                "submodules to compile, or the ones to leave out of the compiled model."
            )
        unknown = sorted(set(compile_kwargs) - _compile_parameters())
        if unknown:
            raise TypeError(
                f"Torch2Compile got {', '.join(map(repr, unknown))}, which torch.compile (torch "
                f"{torch.__version__}) does not take; its arguments are {sorted(_compile_parameters())}."
            )
        compile_kwargs.setdefault("backend", "inductor")
        self.compile_submodules = list(compile_submodules or [])
        self.skip_modules = list(skip_modules or [])
        self.regex = regex
        self.strict = strict
        self.dynamo_cfg = dict(dynamo_cfg or {})
        self.compile_kwargs = compile_kwargs

    def _configure_dynamo(self) -> None:
        if not self.dynamo_cfg:
            return
        import torch._dynamo as dynamo

        for key, value in self.dynamo_cfg.items():
            if key == "log_level":
                torch._logging.set_logs(dynamo=value)
            elif hasattr(dynamo.config, key):
                setattr(dynamo.config, key, value)
            else:
                logger.warning("Torch2Compile: torch._dynamo.config has no %r (torch %s); dynamo_cfg[%r] is "
                               "not applied.", key, torch.__version__, key)

    def __call__(self, model: nn.Module) -> nn.Module:
        if not isinstance(model, nn.Module):
            raise TypeError(f"Torch2Compile compiles a torch.nn.Module, got {type(model).__name__}.")
        self._configure_dynamo()
        for name, child in _match_children(model, self.skip_modules, self.regex, self.strict, "skip_modules"):
            child.forward = _EagerForward(child)
            logger.info("Torch2Compile: %s runs outside the compiled graph.", name)
        if self.compile_submodules:
            targets = list(_match_children(model, self.compile_submodules, self.regex, self.strict,
                                           "compile_submodules"))
        else:
            targets = [("", model)]
        for _, module in targets:
            module.forward = _CompiledForward(module, dict(self.compile_kwargs))
        names = ", ".join(n for n, _ in targets) if self.compile_submodules else type(model).__name__
        logger.info("Torch2Compile: %s compiled with torch.compile(%s); the first steps are slower "
                    "while it compiles.", names, ", ".join(f"{k}={v!r}" for k, v in self.compile_kwargs.items()))
        return model

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.compile_kwargs.items())
        return f"Torch2Compile({args})"


def build_compiler(compiler: Any, key: str = "compiler") -> Callable[[nn.Module], nn.Module] | None:
    """Turn a loop's ``compiler`` argument into a ``model -> model`` callable (or ``None``).

    Args:
        compiler: ``None``/``False`` (no compilation); ``True`` (``Torch2Compile()`` with its
            defaults); a config dict (``{"type": "Torch2Compile", ...}``); a dict of
            ``torch.compile`` settings without ``type``; or any callable ``model -> model``.
        key: the argument's name, for error messages.

    >>> build_compiler(None) is None, type(build_compiler({"backend": "eager"})).__name__
    (True, 'Torch2Compile')
    """
    if compiler is None or compiler is False:
        return None
    if compiler is True:
        return Torch2Compile()
    if isinstance(compiler, dict):
        if "type" in compiler:
            from hat_ignite.registry import build_from_cfg  # configs are optional: import on use

            compiler = build_from_cfg(compiler, key_path=key)
        else:
            compiler = Torch2Compile(**compiler)
    if not callable(compiler):
        raise TypeError(
            f"{key} must be None, a Torch2Compile config (dict(type='Torch2Compile', backend=...)), a dict "
            f"of torch.compile settings, or a callable model -> model; got {type(compiler).__name__}."
        )
    return compiler


def apply_compiler(compiler: Callable[[nn.Module], nn.Module] | None, model: nn.Module,
                   key: str = "compiler") -> nn.Module:
    """Apply a built compiler to ``model``; check that it returned a module."""
    if compiler is None:
        return model
    compiled = compiler(model)
    if not isinstance(compiled, nn.Module):
        raise TypeError(f"{key} ({compiler!r}) returned a {type(compiled).__name__}, not a torch.nn.Module.")
    return compiled


class TorchCompile(Torch2Compile):
    """HAT's older compile converter: the whole model through TorchDynamo with one backend.

    HAT's ``TorchCompile(compile_backend=..., load_extensions=...)`` predates ``torch.compile``
    (it wraps the model with the standalone ``torchdynamo`` package). Here it is
    :class:`Torch2Compile` with ``backend=compile_backend``: the model is compiled in place at its
    first forward, keeping its class and ``state_dict`` names.

    Args:
        compile_backend: a TorchDynamo backend name (``"inductor"``, ``"eager"``, ``"aot_eager"``...)
            or a backend callable ``(graph_module, example_inputs) -> callable``; ``None`` is
            ``torch.compile``'s default, ``"inductor"``.
        load_extensions: HAT's TensorRT FX extensions (``hat.utils.trt_fx_extension``), which
            hat-ignite does not provide: only ``None`` is accepted.

    Raises:
        ValueError: ``load_extensions`` given.

    >>> TorchCompile(compile_backend="eager")
    Torch2Compile(backend='eager')
    """

    def __init__(self, compile_backend: str | Callable[..., Any] | None = None,
                 load_extensions: str | Sequence[str] | None = None) -> None:
        if load_extensions:
            raise ValueError(
                f"TorchCompile(load_extensions={load_extensions!r}): HAT's TensorRT FX extensions "
                f"(hat.utils.trt_fx_extension) are not part of hat-ignite. Drop load_extensions; to use "
                f"a backend of your own, register it with torch._dynamo.register_backend and pass its name "
                f"(or the backend function) as compile_backend."
            )
        super().__init__(backend=compile_backend or "inductor")
