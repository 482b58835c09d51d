"""`Trainer`: the HAT training loop on one device (CPU or one GPU)."""

from __future__ import annotations

from hat_ignite.engine.loop import LoopBase

__all__ = ["Trainer"]


class Trainer(LoopBase):
    """A training loop: forward, backward and parameter update on every step.

    Takes exactly :class:`~hat_ignite.engine.loop.LoopBase`'s arguments. The model is put in
    training mode right before ``on_loop_begin``, and back in it before a step or an epoch whenever
    something else (a stock Ignite evaluator on the same model) left it in eval mode. The distributed trainers differ from it only in
    how the model is wrapped and where it runs.

    Example:
        >>> import torch
        >>> from hat_ignite.engine import Trainer
        >>> from hat_ignite.engine.processors import BasicBatchProcessor
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(4, 2)
        ...     def forward(self, x, y):
        ...         return {"loss": torch.nn.functional.cross_entropy(self.fc(x), y)}
        >>> _ = torch.manual_seed(0)
        >>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(3)]
        >>> model = Net()
        >>> trainer = Trainer(
        ...     model=model, data_loader=data,
        ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...     batch_processor=BasicBatchProcessor(need_grad_update=True,
        ...                                         loss_collector=lambda outs: [outs["loss"]]),
        ...     device=None, num_epochs=2)
        >>> state = trainer.fit()
        >>> state.epoch, state.iteration
        (2, 6)
    """

    def set_model_mode(self) -> None:
        self.model.train()
        self.train_mode_model = self.model
        self._train_modes = {}

    def restore_train_mode(self) -> None:
        """Put ``train_mode_model`` back in the modes noted at the epoch begin (else ``train()``).

        Called when a step or an epoch begins and the model is found in eval mode: a stock
        Ignite evaluator (``create_supervised_evaluator``) on the same model leaves it there.
        Sub-modules an ``on_epoch_begin`` hook put in eval mode (``FreezeModule``) stay so.
        """
        model = self.train_mode_model
        if model is None:
            return
        modes = self._train_modes
        if not modes:
            model.train()
            return
        for module, training in modes.items():
            module.training = training
        model.training = True

    def note_train_modes(self) -> None:
        """Note every sub-module's mode, for :meth:`restore_train_mode` (once an epoch)."""
        model = self.train_mode_model
        if model is not None and model.training:
            self._train_modes = {m: m.training for m in model.modules()}
