"""A plain training loop that calls callback hooks the way HAT's own loop does.

HAT's ``LoopBase.fit`` and its batch processor pass each hook a fixed set of keywords, fewer than
hat-ignite's engine (no ``loop`` after loop begin, no ``batch`` at step end, no ``batch_idx``...),
and fire one more ``on_step_begin`` per epoch when the loader runs out. :class:`HatStyleLoop`
trains a real model and calls every hook with exactly those keywords, so a test can check that a
built-in callback works in a HAT loop (a project's own loop, HAT's unit tests) and what it
logged, stored or saved.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from hat_ignite.engine.state import EventStorage


class HatStyleLoop:
    """Train ``model`` for ``num_epochs`` over ``data_loader``, calling hooks as HAT's loop does.

    Args:
        model: called as ``model(*batch)``; returns ``(loss, outputs)``.
        optimizer: stepped after every batch.
        data_loader: yields list/tuple batches.
        callbacks: objects with HAT's ``on_*`` hooks.
        num_epochs: epochs to run.
        train_metrics / val_metrics: passed on, as HAT's loop does.
        loss_of: picks the loss tensor from the model's outputs.
    """

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data_loader: Any, callbacks: Sequence[Any],
        num_epochs: int, train_metrics: Any = None, val_metrics: Any = None,
        loss_of: Callable[[Any], torch.Tensor] = lambda outs: outs[0],
    ) -> None:
        self.model, self.optimizer, self.data_loader = model, optimizer, data_loader
        self.callbacks = list(callbacks)
        self.num_epochs = num_epochs
        self.train_metrics, self.val_metrics = train_metrics, val_metrics
        self.loss_of = loss_of
        self.storage = EventStorage()
        self.ema_model = None
        self.device = None
        self.grad_scaler = torch.amp.GradScaler("cpu", enabled=False)

    def _call(self, hook: str, **kwargs: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(**kwargs)

    def _shared(self) -> dict[str, Any]:
        return {"train_metrics": self.train_metrics, "val_metrics": self.val_metrics, "storage": self.storage}

    def fit(self) -> EventStorage:
        shared = self._shared()
        self.model.train()
        self._call("on_loop_begin", model=self.model, optimizer=self.optimizer, data_loader=self.data_loader,
                   num_epochs=self.num_epochs, num_steps=None, loop=self, profiler=None, **shared)
        global_step_id = 0
        for epoch_id in range(self.num_epochs):
            self._call("on_epoch_begin", model=self.model, epoch_id=epoch_id, optimizer=self.optimizer,
                       global_step_id=global_step_id, data_loader=self.data_loader, profiler=None, **shared)
            batches = iter(self.data_loader)
            step_id = 0
            while True:
                self._call("on_step_begin", model=self.model, optimizer=self.optimizer, epoch_id=epoch_id,
                           step_id=step_id, data_loader=self.data_loader, start_epoch=0, start_step=0,
                           global_step_id=global_step_id, profiler=None, **shared)
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                self._step(batch, {"global_step_id": global_step_id, "step_id": step_id, "epoch_id": epoch_id})
                self._call("on_step_end", epoch_id=epoch_id, step_id=step_id, global_step_id=global_step_id,
                           data_loader=self.data_loader, model=self.model, ema_model=self.ema_model,
                           optimizer=self.optimizer, num_steps=None, device=self.device, callbacks=self.callbacks,
                           profiler=None, **shared)
                step_id += 1
                global_step_id += 1
            self._call("on_epoch_end", epoch_id=epoch_id, global_step_id=global_step_id, model=self.model,
                       ema_model=self.ema_model, optimizer=self.optimizer, num_epochs=self.num_epochs,
                       device=self.device, callbacks=self.callbacks, profiler=None, **shared)
        self._call("on_loop_end", model=self.model, ema_model=self.ema_model, optimizer=self.optimizer,
                   epoch_id=self.num_epochs, global_step_id=global_step_id, device=self.device,
                   callbacks=self.callbacks, profiler=None, **shared)
        return self.storage

    def _step(self, batch: Any, ids: dict[str, int]) -> None:
        """HAT's basic batch processor: its hooks and their keywords."""
        shared = self._shared()
        model, optimizer = self.model, self.optimizer
        self._call("on_batch_begin", batch=batch, **ids, **shared)
        optimizer.zero_grad(set_to_none=True)
        self._call("on_forward_begin", batch=batch, model=model, **ids)
        model_outs = model(*batch)
        self._call("on_forward_end", model_outs=model_outs, **ids)
        loss = self.loss_of(model_outs)
        self._call("on_backward_begin", model=model, optimizer=optimizer, **ids)
        loss.backward()
        self._call("on_backward_end", batch=batch, grad_scaler=self.grad_scaler, model=model, optimizer=optimizer,
                   **ids)
        self._call("on_optimizer_step_begin", grad_scaler=self.grad_scaler, model=model, optimizer=optimizer, **ids)
        optimizer.step()
        self._call("on_batch_end", batch=batch, losses=loss, model_outs=model_outs, **ids, **shared)
