"""Shared pieces of the training-control tests: a small conv+BN digits classifier and its trainer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

N_SAMPLES, BATCH = 192, 32  # 6 steps per epoch


class ConvBNNet(nn.Module):
    """Conv+BN backbone and Linear+BN head for 8x8 digits; returns ``(loss, logits)`` in training."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, img: Any, labels: torch.Tensor | None = None) -> Any:
        if isinstance(img, dict):  # a multitask sub-batch
            img, labels = img["img"], img["labels"]
        logits = self.head(self.backbone(img))
        if not self.training:
            return logits
        return F.cross_entropy(logits, labels), logits


def digits_tensors(split: str = "train", n: int = N_SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    ds = DigitsDataset(split, as_image=True)
    items = [ds[i] for i in range(min(n, len(ds)))]
    return torch.stack([it["img"] for it in items]), torch.stack([it["labels"] for it in items])


def digits_loader(split: str = "train", n: int = N_SAMPLES, batch_size: int = BATCH, dtype=torch.float32) -> DataLoader:
    x, y = digits_tensors(split, n)
    return DataLoader(TensorDataset(x.to(dtype), y), batch_size=batch_size, shuffle=False)


def make_trainer(callbacks, model=None, seed: int = 0, lr: float = 0.1, loader=None, processor=None,
                 **kwargs: Any) -> Trainer:
    torch.manual_seed(seed)
    model = model if model is not None else ConvBNNet()
    if "num_steps" in kwargs:
        kwargs.setdefault("stop_by", "step")
    else:
        kwargs.setdefault("num_epochs", 2)
    processor = processor or {}
    if isinstance(processor, dict):
        processor = BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), **processor)
    return Trainer(
        model=model, data_loader=loader if loader is not None else digits_loader(),
        optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        batch_processor=processor, device=None, callbacks=callbacks, log_interval=0, **kwargs,
    )


def clone_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class AtStep(CallbackMixin):
    """Calls ``fn(loop)`` at the begin of the given global step (or epoch, with ``epoch=True``)."""

    def __init__(self, when: int, fn, epoch: bool = False) -> None:
        self.when, self.fn, self.epoch = when, fn, epoch

    def overridden_hooks(self) -> list[str]:
        return ["on_epoch_begin"] if self.epoch else ["on_step_begin"]

    def on_step_begin(self, loop, global_step_id, **kwargs):
        if global_step_id == self.when:
            self.fn(loop)

    def on_epoch_begin(self, loop, epoch_id, **kwargs):
        if epoch_id == self.when:
            self.fn(loop)


class LossLog(CallbackMixin):
    """Keeps each batch's loss value."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_batch_end(self, losses, **kwargs):
        self.values.append(float(sum(t.detach().float() for t in losses)))
