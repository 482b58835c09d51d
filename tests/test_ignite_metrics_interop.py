"""Ignite and torchmetrics metrics next to HAT's: MetricUpdater, naming, Checkpoint and TensorBoard."""

from __future__ import annotations

import pytest
import torch
from ignite.engine import Events
from ignite.metrics import Accuracy as IgniteAccuracy
from ignite.metrics import RunningAverage
from sklearn.metrics import accuracy_score, f1_score
from torch.utils.data import DataLoader, Subset
from torchmetrics.classification import MulticlassF1Score

from conftest import DIGITS_CONFIG
from hat_ignite.callbacks import Checkpoint, MetricUpdater, TensorBoard
from hat_ignite.callbacks.checkpoint_io import load_checkpoint
from hat_ignite.cli.common import load_config
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_index, loss_output
from hat_ignite.metrics import Accuracy, MetricAdapter, metric_name_values
from hat_ignite.models.mlp import MLPClassifier
from hat_ignite.visualize.event_file import read_scalars

VAL = DataLoader(Subset(DigitsDataset("val"), range(160)), batch_size=40)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = MLPClassifier(hidden_features=32)
    train = DataLoader(Subset(DigitsDataset("train"), range(256)), batch_size=64)
    Trainer(net, train, torch.optim.SGD(net.parameters(), lr=0.5),
            BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None, num_epochs=3).fit()
    return net


@pytest.fixture(scope="module")
def reference(model):
    model.eval()
    with torch.no_grad():
        preds = torch.cat([model(b["img"]).argmax(1) for b in VAL])
    labels = torch.cat([b["labels"] for b in VAL])
    return labels.numpy(), preds.numpy()


def shipped_update_val_metrics(tmp_path):
    cfg, _ = load_config(str(DIGITS_CONFIG), [], str(tmp_path))
    return cfg["update_val_metrics"]  # metric.update(batch["labels"], model_outs): HAT's order


def predict(model, metrics, update):
    updater = MetricUpdater(update, metrics=metrics, step_log_freq=0)
    state = Predictor(model, VAL, BasicBatchProcessor(need_grad_update=False), callbacks=[updater]).fit()
    return state.storage["monitor_obj"]


def test_an_ignite_metric_in_metric_updater(model, reference):
    def update(metrics, batch, model_outs):
        metrics[0].update((model_outs, batch["labels"]))  # Ignite's own call

    stored = predict(model, [IgniteAccuracy()], update)
    assert stored == {"Accuracy": pytest.approx(accuracy_score(*reference))}


def test_torchmetrics_and_ignite_metrics_take_the_shipped_configs_hat_order(tmp_path, model, reference):
    metrics = [
        Accuracy(),
        MetricAdapter(MulticlassF1Score(num_classes=10, average="macro"), name="f1_macro"),
        MetricAdapter(dict(type="torchmetrics.classification.MulticlassF1Score", num_classes=10, average="micro"),
                      name="f1_micro"),
        MetricAdapter(IgniteAccuracy(), name="ignite_accuracy"),
    ]
    stored = predict(model, metrics, shipped_update_val_metrics(tmp_path))
    labels, preds = reference
    assert stored == {
        "accuracy": pytest.approx(accuracy_score(labels, preds)),
        "f1_macro": pytest.approx(f1_score(labels, preds, average="macro", labels=range(10)), abs=1e-6),
        "f1_micro": pytest.approx(f1_score(labels, preds, average="micro"), abs=1e-6),
        "ignite_accuracy": pytest.approx(accuracy_score(labels, preds)),
    }
    assert stored["f1_macro"] != stored["f1_micro"]


def test_two_metrics_of_one_class_both_show(model, reference):
    def update(metrics, batch, model_outs):
        for m in metrics:
            m.update(model_outs, batch["labels"])  # torchmetrics' own order

    macro, micro = (MulticlassF1Score(num_classes=10, average=a) for a in ("macro", "micro"))
    stored = predict(model, [macro, micro], update)
    labels, preds = reference
    assert stored == {
        "MulticlassF1Score": pytest.approx(f1_score(labels, preds, average="macro", labels=range(10)), abs=1e-6),
        "MulticlassF1Score_2": pytest.approx(f1_score(labels, preds, average="micro"), abs=1e-6),
    }
    named = [MetricAdapter(macro, name="f1_macro"), MetricAdapter(micro, name="f1_micro")]
    assert [n for n, _ in metric_name_values(named)] == ["f1_macro", "f1_micro"]


def test_metric_adapter_refuses_what_is_not_a_metric():
    with pytest.raises(TypeError, match="MetricAdapter needs a torchmetrics or Ignite metric.*no update"):
        MetricAdapter(object())


def test_checkpoint_monitor_and_tensorboard_see_ignite_metrics_in_state_metrics(tmp_path):
    torch.manual_seed(0)
    net = MLPClassifier(hidden_features=32)
    train = DataLoader(Subset(DigitsDataset("train"), range(256)), batch_size=64)
    ckpt = Checkpoint(tmp_path / "ckpt", mode="min", monitor_metric_key="loss_avg")
    tb = TensorBoard(tmp_path / "tb", update_freq=1, update_by="epoch")
    trainer = Trainer(net, train, torch.optim.SGD(net.parameters(), lr=0.5),
                      BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None,
                      num_epochs=3, callbacks=[ckpt, tb])
    RunningAverage(output_transform=loss_output(trainer), alpha=0.9).attach(trainer, "loss_avg")
    averages = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: averages.append(e.state.metrics["loss_avg"]))
    trainer.fit()
    assert ckpt.best == pytest.approx(min(averages))
    assert load_checkpoint(ckpt.best_path)["epoch"] == averages.index(min(averages))
    written = read_scalars(tmp_path / "tb")["metrics/loss_avg"]
    assert [s for s, _ in written] == [4, 8, 12]  # at the steps done, as the other epoch-mode tags
    assert [v for _, v in written] == pytest.approx(averages)
