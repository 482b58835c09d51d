"""`Predictor`: run a model over one or several data loaders without gradients."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Callable, Sequence

import torch

from hat_ignite.engine.events import HatEvents
from hat_ignite.engine.loop import LoopBase, build_if_config
from hat_ignite.engine.state import HatState

__all__ = ["Predictor"]


def _is_loader_list(data_loader: Any) -> bool:
    """A list/tuple of loaders (not a list of batches): every item is a non-batch iterable."""
    if not isinstance(data_loader, (list, tuple)) or not data_loader:
        return False
    return all(
        isinstance(d, Iterable) and not isinstance(d, (torch.Tensor, Mapping, list, tuple, str))
        for d in data_loader
    )


class Predictor(LoopBase):
    """Run the model in eval mode over ``data_loader`` (one loader, or a list of loaders).

    With several loaders, the loop runs once per loader, in order (each run fires its own
    loop/epoch hooks). The callbacks are shared by all loaders when ``share_callbacks`` is true;
    otherwise ``callbacks`` is a list holding one callback list per loader.

    Args:
        model: a ``torch.nn.Module`` or its config.
        data_loader: a loader, or a list/tuple of loaders.
        batch_processor: usually a processor with ``need_grad_update=False``.
        device: ``None`` (CPU) or an int GPU id.
        num_epochs: passes over each loader (default 1).
        model_convert_pipeline: callable(s) ``model -> model`` applied before running.
        callbacks: callbacks (see ``share_callbacks``).
        metrics: metrics on the predicted data; hooks receive them as ``train_metrics`` (as in
            HAT) and as ``val_metrics``.
        profiler: a profiler passed to every hook.
        log_interval: log progress after the steps whose ``step_id`` is a multiple of it, as HAT
            does (a float too; ``0`` or less: never); see :class:`~hat_ignite.engine.loop.LoopBase`.
        share_callbacks: whether all loaders share ``callbacks``.
        compiler: compile the model (see :class:`~hat_ignite.engine.loop.LoopBase`).
        **kwargs: other :class:`~hat_ignite.engine.loop.LoopBase` arguments, as HAT's
            ``Predictor`` passes them on (``resume_epoch_or_step``, ``val_metrics`` ...).

    Example:
        >>> import torch
        >>> from hat_ignite.engine import Predictor
        >>> from hat_ignite.engine.processors import BasicBatchProcessor
        >>> seen = []
        >>> model = torch.nn.Linear(3, 1)
        >>> from torch.utils.data import DataLoader
        >>> loaders = [DataLoader(torch.ones(4, 3), batch_size=2), DataLoader(torch.zeros(4, 3), batch_size=4)]
        >>> predictor = Predictor(model, loaders, BasicBatchProcessor(need_grad_update=False))
        >>> @predictor.on(HatEvents.STEP_END)
        ... def keep(engine):
        ...     seen.append(tuple(engine.state.output.shape))
        >>> _ = predictor.fit()
        >>> seen
        [(2, 1), (2, 1), (4, 1)]
    """

    def __init__(
        self,
        model: torch.nn.Module | dict,
        data_loader: Iterable | Sequence[Iterable] | dict,
        batch_processor: Callable | dict,
        device: int | None = None,
        num_epochs: int = 1,
        model_convert_pipeline: Any = None,
        callbacks: Sequence[Any] | None = None,
        metrics: Any = None,
        profiler: Any = None,
        log_interval: float = 0,
        share_callbacks: bool = True,
        compiler: Any = None,
        **kwargs: Any,
    ) -> None:
        data_loader = build_if_config(data_loader, "data_loader")
        self.data_loaders: list[Iterable] = list(data_loader) if _is_loader_list(data_loader) else [data_loader]
        self.share_callbacks = share_callbacks
        callbacks = list(callbacks or [])
        per_loader: list[list[Any]] = []
        if not share_callbacks:
            if len(callbacks) != len(self.data_loaders):
                raise ValueError(
                    f"share_callbacks=False needs one callback (or list of them) per data loader: got "
                    f"{len(self.data_loaders)} loader(s) and callbacks={callbacks!r}. Pass "
                    f"[[callbacks of loader 0], [callbacks of loader 1], ...] or share_callbacks=True."
                )
            # as HAT: each entry is that loader's callback, or a list of them
            per_loader = [list(c) if isinstance(c, (list, tuple)) else [c] for c in callbacks]
            callbacks = []
        metrics = build_if_config(metrics, "metrics")
        super().__init__(
            model=model,
            data_loader=self.data_loaders[0],
            optimizer=None,
            batch_processor=batch_processor,
            device=device,
            model_convert_pipeline=model_convert_pipeline,
            stop_by="epoch",
            num_epochs=num_epochs,
            callbacks=callbacks,
            train_metrics=metrics,
            val_metrics=metrics,
            profiler=profiler,
            log_interval=log_interval,
            compiler=compiler,
            **kwargs,
        )
        self.metrics = metrics
        self._per_loader_callbacks = [
            [build_if_config(cb, f"callbacks[{i}][{j}]") for j, cb in enumerate(cbs)]
            for i, cbs in enumerate(per_loader)
        ]

    def set_model_mode(self) -> None:
        self.model.eval()

    def fit(self) -> HatState:
        """Run over every data loader in turn; return the state of the last run."""
        state = self.state
        for i, loader in enumerate(self.data_loaders):
            self.data_loader = loader
            if self.share_callbacks:
                state = super().fit()
                continue
            handles_before = len(self._callback_handles)
            callbacks_before = len(self.callbacks)
            self.attach_callbacks(self._per_loader_callbacks[i], key=f"callbacks[{i}]")
            try:
                state = super().fit()
            finally:
                for handle in self._callback_handles[handles_before:]:
                    handle.remove()
                del self._callback_handles[handles_before:]
                del self.callbacks[callbacks_before:]
        return state
