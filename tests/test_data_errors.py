"""Bad data gets errors that say which batch and what differs (docs/reliability.md)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from hat_ignite.engine import BasicBatchProcessor, MultiBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.errors import BatchError, DataError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.fc(x), y),)


def trainer(data, processor=None, **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = Net()
    processor = processor or BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    kwargs.setdefault("num_epochs", 1)
    return Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   batch_processor=processor, device=None, **kwargs)


def good(n=4):
    return torch.randn(n, 4), torch.randn(n, 1)


@pytest.mark.parametrize("bad, difference", [
    ((torch.randn(4, 5), torch.randn(4, 1)), r"\[0\]: shape \(4, 5\) vs \(4, 4\)"),
    ((torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 1)), r"\[0\]: dtype float64 vs float32"),
])
def test_a_wrong_batch_names_its_index_and_expected_vs_actual(bad, difference):
    engine = trainer([good(), good(), good(3), bad], num_epochs=1)
    with pytest.raises(BatchError, match=r"epoch_id=0, step_id=3, global_step_id=3, batch_idx=0") as info:
        engine.fit()
    message = str(info.value)
    assert "first batch: ([0]: Tensor[4, 4] float32, [1]: Tensor[4, 1] float32)" in message
    assert re.search(difference, message)
    assert isinstance(info.value.__cause__, RuntimeError)  # the model's own error, chained
    assert "[1]" not in message.split("differences:")[1]  # a smaller last batch (3 rows) is not a difference


def test_a_wrong_sub_batch_of_a_multi_batch_step_is_named():
    processor = MultiBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0))
    engine = trainer([(good(), good()), (good(), (torch.randn(4, 6), torch.randn(4, 1)))], processor)
    with pytest.raises(BatchError, match=r"step_id=1, global_step_id=1, batch_idx=1") as info:
        engine.fit()
    assert "[0]: shape (4, 6) vs (4, 4)" in str(info.value)


def test_the_first_batch_failing_says_there_is_nothing_to_compare():
    with pytest.raises(BatchError, match="the first batch at this index, so there is nothing to compare"):
        trainer([(torch.randn(4, 7), torch.randn(4, 1))]).fit()


def test_an_empty_loader_with_stop_by_epoch_is_an_error():
    empty = DataLoader(TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1)), batch_size=2)
    with pytest.raises(DataError, match=r"data_loader \(DataLoader\) yields no batch.*stop_by='epoch'"):
        trainer(empty).fit()

    class Nothing(IterableDataset):
        def __iter__(self):
            return iter(())

    with pytest.raises(DataError, match="yields no batch"):  # no len(): found out while running
        trainer(DataLoader(Nothing(), batch_size=2)).fit()
    with pytest.raises(DataError, match=r"yields no batch.*stop_by='step'"):  # the same by steps
        trainer(DataLoader(Nothing(), batch_size=2), stop_by="step", num_steps=3).fit()


class Broken(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"sample {i} has no label in broken_dataset_getitem")
        return torch.zeros(4), torch.zeros(1)


def test_a_worker_crash_shows_the_workers_traceback():
    with pytest.raises(KeyError) as info:
        trainer(DataLoader(Broken(), batch_size=2, num_workers=2)).fit()
    message = str(info.value)
    assert "Caught KeyError in DataLoader worker process" in message
    assert "Original Traceback" in message and "in __getitem__" in message
    assert "broken_dataset_getitem" in message
