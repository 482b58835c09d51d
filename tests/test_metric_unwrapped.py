"""A torchmetrics or Ignite metric used in MetricUpdater without MetricAdapter: one warning naming it."""

from __future__ import annotations

import logging

import pytest
import torch
from ignite.metrics import Precision as IgnitePrecision
from sklearn.metrics import precision_score, recall_score
from torch.utils.data import DataLoader, Subset
from torchmetrics.classification import MulticlassPrecision

from hat_ignite.callbacks import MetricUpdater
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Predictor, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy, MetricAdapter
from hat_ignite.models.mlp import MLPClassifier

VAL = DataLoader(Subset(DigitsDataset("val"), range(160)), batch_size=40)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    net = MLPClassifier(hidden_features=16)
    train = DataLoader(Subset(DigitsDataset("train"), range(128)), batch_size=64)
    Trainer(net, train, torch.optim.SGD(net.parameters(), lr=0.5),
            BasicBatchProcessor(True, loss_collector=collect_loss_by_index(0)), device=None, num_epochs=2).fit()
    return net.eval()


def hat_order_class_ids(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs.argmax(1))  # HAT's order, predictions as class ids


def predict(model, metrics, update, runs=1):
    updater = MetricUpdater(update, metrics=metrics, step_log_freq=0)
    for _ in range(runs):
        state = Predictor(model, VAL, BasicBatchProcessor(need_grad_update=False), callbacks=[updater]).fit()
    return state.storage["monitor_obj"]


def reference(model):
    with torch.no_grad():
        preds = torch.cat([model(b["img"]).argmax(1) for b in VAL]).numpy()
    labels = torch.cat([b["labels"] for b in VAL]).numpy()
    return (precision_score(labels, preds, average="macro", zero_division=0),
            recall_score(labels, preds, average="macro", zero_division=0))


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "used unwrapped" in r.getMessage()]


def test_an_unwrapped_torchmetrics_metric_is_warned_about_once(model, caplog):
    precision, recall = reference(model)
    assert abs(precision - recall) > 0.01  # the two differ on this model
    metric = MulticlassPrecision(num_classes=10, average="macro")
    with caplog.at_level(logging.WARNING):
        values = predict(model, [metric, Accuracy()], hat_order_class_ids, runs=2)
    # what the warning is about: called in HAT's order, torchmetrics' precision is the recall
    assert values["MulticlassPrecision"] == pytest.approx(recall, abs=1e-6)
    (message,) = warnings_of(caplog)  # once, over two runs; HAT's own Accuracy is not named
    assert "torchmetrics metric MulticlassPrecision is used unwrapped" in message
    assert "update(preds, target)" in message and "MetricAdapter(MulticlassPrecision(...)" in message

    caplog.clear()
    wrapped = MetricAdapter(MulticlassPrecision(num_classes=10, average="macro"), name="precision")
    with caplog.at_level(logging.WARNING):
        values = predict(model, [wrapped], hat_order_class_ids)
    assert values["precision"] == pytest.approx(precision, abs=1e-6)
    assert warnings_of(caplog) == []


def test_an_unwrapped_ignite_metric_is_warned_about_once(model, caplog):
    def ignite_order(metrics, batch, model_outs):
        metrics[0].update((model_outs, batch["labels"]))

    with caplog.at_level(logging.WARNING):
        predict(model, [IgnitePrecision(average=True)], ignite_order, runs=2)
    (message,) = warnings_of(caplog)
    assert "Ignite metric Precision is used unwrapped" in message and "update((y_pred, y))" in message
    assert "MetricAdapter(Precision(...), name='precision')" in message

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        values = predict(model, [MetricAdapter(IgnitePrecision(average=True), name="precision")],
                         hat_order_class_ids_as_scores)
    assert warnings_of(caplog) == [] and values["precision"] == pytest.approx(reference(model)[0], abs=1e-6)


def hat_order_class_ids_as_scores(metrics, batch, model_outs):
    for metric in metrics:
        metric.update(batch["labels"], model_outs)  # Ignite's Precision takes scores
