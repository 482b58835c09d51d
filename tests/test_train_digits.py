"""A small real model trains on real data (scikit-learn's handwritten digits) through the engine."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks import CallbackMixin
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_regex


class DigitsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, batch):
        logits = self.body(batch["img"])
        if self.training:
            return {"ce_loss": nn.functional.cross_entropy(logits, batch["label"]), "logits": logits}
        return {"logits": logits}


def loaders():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    train_idx, val_idx = perm[:1400], perm[1400:]

    def as_dicts(idx, shuffle):
        ds = TensorDataset(x[idx], y[idx])
        return DataLoader(ds, batch_size=32, shuffle=shuffle, generator=torch.Generator().manual_seed(1),
                          collate_fn=lambda items: {"img": torch.stack([i[0] for i in items]),
                                                    "label": torch.stack([i[1] for i in items])})

    return as_dicts(train_idx, True), as_dicts(val_idx, False)


class Accuracy(CallbackMixin):
    def __init__(self) -> None:
        self.correct = self.total = 0

    def on_batch_end(self, batch, model_outs, **kw):
        self.correct += int((model_outs["logits"].argmax(1) == batch["label"]).sum())
        self.total += len(batch["label"])

    @property
    def value(self) -> float:
        return self.correct / self.total


def evaluate(model, loader) -> float:
    acc = Accuracy()
    Predictor(model, loader, BasicBatchProcessor(need_grad_update=False), callbacks=[acc]).fit()
    return acc.value


def test_digits_validation_accuracy_rises_well_above_chance():
    torch.manual_seed(0)
    train_loader, val_loader = loaders()
    model = DigitsNet()
    before = evaluate(model, val_loader)
    trainer = Trainer(
        model=model, data_loader=train_loader, optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_regex("^.*loss.*")),
        device=None, num_epochs=5,
    )
    trainer.fit()
    after = evaluate(model, val_loader)
    assert before < 0.3  # chance is 0.1
    assert after > 0.9, after
