"""Running int8 graphs fast: through inductor with freezing, else as saved.

A converted PT2E graph (after ``QAT2Quantize``, or loaded with
:func:`~hat_ignite.quantization.io.load_quantized_model`) runs on the CPU with reference ops:
every quantized op is dequantize -> float op -> quantize, slower than the float model.
``torch.compile`` with inductor's freezing lowers those patterns to oneDNN's int8 kernels (conv,
linear with their fused post-ops), which run faster than float on CPUs with AVX-512 VNNI or AMX.
:class:`InductorRunner` does this by default:

* It compiles lazily, at the first call in eval mode without gradients, and logs a start line and
  a done line with the time taken (seconds to tens of seconds for a conv net on a CPU).
* Shapes are static: each new input shape (a predictor's last, smaller batch; also a new layout,
  dtype or device) compiles once more, logged the same way, up to
  :attr:`InductorRunner.MAX_SHAPES` shapes; further shapes run as saved. (With a dynamic batch
  dimension torch 2.13's int8 lowering fails on some graphs: a stride assertion.)
* A compile or first-run failure (no C++ compiler, a compile error, an op inductor cannot
  lower) is logged once, with the reason, and from then on the graph runs as saved. An input the
  graph itself refuses raises the graph's own error.
* In training mode, with gradients wanted, or while the surrounding model is being exported,
  compiled or traced (``torch.jit.trace``), the graph runs as saved.
* Turn it off with ``inductor=False`` (``QAT2Quantize``, ``load_quantized_model``) or the
  environment variable ``HAT_IGNITE_INT8_INDUCTOR=0``.

torch 2.13 note: ``torch.compile(graph, options={"freezing": True})`` fails on these graphs
(``UnsupportedOperatorException: onednn.qconv_prepack`` while inductor compiles), so freezing is
switched on with ``torch._inductor.config.patch(freezing=True)`` around each call that compiles:
the setting torchao's x86 inductor guide makes process-wide, here scoped to these calls.

>>> runner = InductorRunner("an example graph", enabled=False)
>>> runner.state
'off'
>>> import torch
>>> runner(torch.nn.Linear(2, 1), False, (torch.ones(3, 2),), {}).shape   # runs the graph as is
torch.Size([3, 1])
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Callable, Iterator, cast

import torch
from torch import nn

__all__ = ["ENV_VAR", "inductor_enabled", "InductorRunner", "LoadedProgram"]

logger = logging.getLogger(__name__)

#: The environment variable that turns the inductor path off (``0``, ``false``, ``no``, ``off``).
ENV_VAR = "HAT_IGNITE_INT8_INDUCTOR"


def inductor_enabled(inductor: bool | None = None) -> bool:
    """Whether to run int8 graphs through inductor: ``inductor`` when given, else :data:`ENV_VAR`
    (on unless it says ``0`` / ``false`` / ``no`` / ``off``).

    >>> inductor_enabled(False), inductor_enabled(True)
    (False, True)
    """
    if inductor is not None:
        return bool(inductor)
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def _first_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text[:240]}" if text else type(exc).__name__


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts (the inputs a graph takes).

    >>> [tuple(t.shape) for t in _tensors(({"a": torch.ones(2)}, [torch.ones(1, 3)], 5))]
    [(2,), (1, 3)]
    """
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _shapes(args: tuple, kwargs: dict) -> tuple:
    """What compiled code is specialised on: shape, strides, dtype, device, requires_grad of each input."""
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad) for t in _tensors((args, kwargs)))


class InductorRunner:
    """Runs a graph module through ``torch.compile`` (inductor, freezing), or as saved.

    One runner serves one graph; the graph's plain forward is passed at each call (and compiled
    at the first), so a deep copy of the owner gets a fresh runner that compiles its own copy
    (see :meth:`__deepcopy__`). Freezing folds the weights into the compiled code: after loading
    new weights call :meth:`reset`.

    Args:
        where: what runs, for the log lines ("the int8 module 'net'").
        enabled: ``False`` runs the graph as saved (state ``"off"``).

    Attributes:
        state: ``"pending"`` (not compiled yet), ``"compiled"``, ``"fallback"`` (building
            failed; :attr:`reason` says why) or ``"off"``.
        reason: why the runner fell back, ``""`` otherwise.
        compile_seconds: how long the first compiled call took (compile and run), or ``None``.
    """

    #: input shapes compiled at most (torch's ``recompile_limit``); further shapes run as saved
    MAX_SHAPES = 8

    def __init__(self, where: str, enabled: bool = True) -> None:
        self.where = where
        self.state = "pending" if enabled else "off"
        self.reason = ""
        self.compile_seconds: float | None = None
        self._compiled: Callable[..., Any] | None = None
        self._shapes: set[tuple] = set()

    def reset(self) -> None:
        """Forget the compiled code (the next eval call compiles again); a fallback stays."""
        self._compiled = None
        self._shapes = set()
        if self.state == "compiled":
            self.state = "pending"

    def __deepcopy__(self, memo: dict[int, Any]) -> InductorRunner:
        fresh = InductorRunner(self.where, enabled=self.state != "off")
        if self.state == "fallback":  # it would fail again: keep the reason, not the attempt
            fresh.state, fresh.reason = self.state, self.reason
        return fresh

    def __getstate__(self) -> dict[str, Any]:  # pickling (torch.save of a whole model): no compiled code
        fresh = self.__deepcopy__({})
        return dict(fresh.__dict__)

    def _wanted(self, training: bool, args: tuple, kwargs: dict) -> bool:
        if self.state in ("off", "fallback") or training or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return False
        if torch.is_grad_enabled():  # inference only: no compiled path if a gradient is wanted
            return not any(t.requires_grad for t in _tensors((args, kwargs)))
        return True

    @staticmethod
    def _compile_and_run(compiled: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """The call that compiles for new inputs: freezing on (read while compiling only; the
        patch costs ~30 us, so calls on compiled shapes skip it)."""
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True), warnings.catch_warnings():
            # torch's int8 conv lowering copies a tensor with torch.tensor(): a warning for torch
            warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning,
                                    "torch._inductor.mkldnn_lowerings")
            return compiled(*args, **kwargs)

    def __call__(self, plain: Callable[..., Any], training: bool, args: tuple, kwargs: dict) -> Any:
        """``plain(*args, **kwargs)``, through inductor when it can (see the module doc).

        Args:
            plain: the graph as saved (a graph module, or its class ``forward`` bound to it);
                compiled at the first call that wants it.
            training: the owner's mode (training runs as saved).
            args: positional inputs.
            kwargs: keyword inputs.
        """
        if not self._wanted(training, args, kwargs):
            return plain(*args, **kwargs)
        shapes = _shapes(args, kwargs)
        new = shapes not in self._shapes
        if new:
            if len(self._shapes) >= self.MAX_SHAPES:
                if len(self._shapes) == self.MAX_SHAPES:
                    logger.info("%s is compiled for %d input shapes; other shapes run as saved", self.where,
                                self.MAX_SHAPES)
                    self._shapes.add(())  # logged once
                return plain(*args, **kwargs)
            sizes = ", ".join("x".join(map(str, shape)) for shape, *_ in shapes)
            logger.info("compiling %s with inductor for inputs of shape %s (freezing: int8 kernels); this takes a "
                        "while on a CPU", self.where, sizes)
        compiled = self._compiled
        if compiled is None:
            # static shapes: with a dynamic batch dimension, torch 2.13's int8 lowering fails on
            # some graphs (a stride assertion); each new batch size compiles once instead
            compiled = self._compiled = torch.compile(plain, dynamic=False)
        start = time.perf_counter()
        failure: Exception | None = None
        try:
            with torch.no_grad():
                out = self._compile_and_run(compiled, args, kwargs) if new else compiled(*args, **kwargs)
        except Exception as exc:  # any build failure: run as saved
            failure = exc
        if failure is not None:
            out = plain(*args, **kwargs)  # inputs the graph refuses raise the graph's own error here
            self._compiled, self._shapes = None, set()
            self.state, self.reason = "fallback", _first_line(failure)
            hint = " Inductor needs a working C++ compiler (g++, or the one CXX names);" if "Cxx" in self.reason else ""
            logger.warning(
                "%s runs as saved (reference int8 ops, usually slower than float): inductor could not "
                "build it: %s.%s %s=0 skips the attempt.", self.where, self.reason, hint, ENV_VAR,
            )
            return out
        if new:
            seconds = time.perf_counter() - start
            self._shapes.add(shapes)
            if self.compile_seconds is None:
                self.compile_seconds = seconds
            self.state = "compiled"
            logger.info("compiled %s in %.1f s", self.where, seconds)
        return out


class LoadedProgram(nn.Module):
    """A loaded ``torch.export`` program (``program``) run through an :class:`InductorRunner`.

    What :func:`~hat_ignite.quantization.io.load_quantized_model` returns. ``eval()`` /
    ``train()`` switch the program's dropout and batch norm (torchao's exported-model modes) and
    return the module; in training mode, or with ``inductor`` off, the program runs as saved.
    Exporting it (``save_quantized_model``) captures the program as saved. Its ``state_dict``
    keys are the program's, under ``program.``.

    Args:
        program: the module of a loaded ``ExportedProgram`` (``program.module()``).
        where: what it is, for the log lines ("the int8 model /path/model.pt2").
        inductor: as for :func:`inductor_enabled`.
    """

    def __init__(self, program: nn.Module, where: str, inductor: bool | None = None) -> None:
        super().__init__()
        self.program = program
        #: how the program runs (``inductor.state``: compiled, fallback with its reason, off)
        self.inductor = InductorRunner(where, enabled=inductor_enabled(inductor))

    @property
    def graph(self) -> torch.fx.Graph:
        """The program's FX graph, as saved."""
        return cast(torch.fx.Graph, self.program.graph)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.inductor.reset()  # compiled code holds the frozen weights: compile again

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inductor(self.program, self.training, args, kwargs)
