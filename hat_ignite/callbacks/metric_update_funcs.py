"""HAT's ready-made ``metric_update_func`` builders for :class:`MetricUpdater`.

* :func:`update_metric_using_regex`: pick labels out of the batch and predictions out of the
  model outputs by regex over their flattened keys
  (:func:`~hat_ignite.engine.processors.loss_collectors.to_flat_ordered_dict`: ``_``-joined
  paths, namedtuple field names kept).
* :func:`update_metric_using_index`: pick them by position in a list/tuple batch and outputs.

Each returns ``f(metrics, batch, model_outs)``; metric ``i`` gets ``metric.update(*labels,
*preds)`` with the values its patterns (indexes) select, in the order of the patterns, and is
left alone on a batch where nothing matches its prediction pattern (in multitask training the
other tasks' batches). A metric without a label pattern (``label_pattern=None``) is updated with
the predictions alone (a loss metric).

In a multitask config whose loader yields ``(batch, task)`` pairs, the pair is what is
flattened: ``({"img": ..., "task1_label": ...}, "task1")`` has the keys ``"0_img"``,
``"0_task1_label"`` and ``"1"``.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Mapping, Sequence

from hat_ignite.engine.processors.loss_collectors import to_flat_ordered_dict

__all__ = ["update_metric_using_index", "update_metric_using_regex"]


def _as_list(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _update(metric: Any, values: list) -> None:
    update = getattr(metric, "update", None)
    (update if callable(update) else metric)(*values)


def _check_count(name: str, metrics: Any, expected: int) -> list:
    found = list(metrics.values()) if isinstance(metrics, Mapping) else _as_list(metrics)
    if len(found) != expected:
        raise ValueError(
            f"{name}: {expected} pattern(s) are given for {len(found)} metric(s); give one per metric, "
            f"in the metrics' order."
        )
    return found


def update_metric_using_regex(
    per_metric_patterns: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    flat_condition: Callable[[str, Any], bool] | None = None,
) -> Callable[[Any, Any, Any], None]:
    """Update each metric with the batch values and outputs whose flattened keys match its patterns.

    Args:
        per_metric_patterns: one dict per metric, ``{"label_pattern": ..., "pred_pattern": ...}``;
            each a regex or a list of them (matched with ``re.match``); ``label_pattern`` may be
            ``None``.
        flat_condition: ``f(key, value) -> bool`` deciding whether a value is flattened further
            (see ``to_flat_ordered_dict``); it must take exactly two arguments.

    Returns:
        ``f(metrics, batch, model_outs)``.

    Example:
        >>> import torch
        >>> from hat_ignite.metrics import Accuracy
        >>> metrics = [Accuracy(), Accuracy()]
        >>> batch = dict(data=torch.tensor([1.0]), target=torch.tensor([1]))
        >>> model_outs = dict(pred1=torch.tensor([1]), pred2=torch.tensor([0]))
        >>> update = update_metric_using_regex([
        ...     dict(label_pattern=".*target.*", pred_pattern=".*pred1.*"),
        ...     dict(label_pattern=".*target.*", pred_pattern=".*pred2.*"),
        ... ])
        >>> update(metrics, batch, model_outs)
        >>> metrics[0].get(), metrics[1].get()
        (('accuracy', 1.0), ('accuracy', 0.0))
    """
    label_patterns: list[list[re.Pattern] | None] = []
    pred_patterns: list[list[re.Pattern]] = []
    for i, patterns in enumerate(_as_list(per_metric_patterns)):
        if not isinstance(patterns, Mapping) or "pred_pattern" not in patterns:
            raise ValueError(
                f"update_metric_using_regex: per_metric_patterns[{i}] must be a dict with 'pred_pattern' "
                f"(and 'label_pattern', may be None), got {patterns!r}."
            )
        label = patterns.get("label_pattern")
        label_patterns.append(None if label is None else [re.compile(p) for p in _as_list(label)])
        pred_patterns.append([re.compile(p) for p in _as_list(patterns["pred_pattern"])])
    if flat_condition is not None:
        if not callable(flat_condition) or len(inspect.signature(flat_condition).parameters) != 2:
            raise TypeError("update_metric_using_regex: flat_condition must be a function of (key, value).")

    def select(patterns: list[re.Pattern] | None, flat: Mapping[str, Any]) -> list:
        # in the order of the patterns, then of the keys
        return [v for p in patterns or () for k, v in flat.items() if p.match(k)]

    def update(metrics: Any, batch: Any, model_outs: Any) -> None:
        found = _check_count("update_metric_using_regex", metrics, len(pred_patterns))
        flat_batch = to_flat_ordered_dict(batch, flat_condition=flat_condition)
        flat_outs = to_flat_ordered_dict(model_outs, flat_condition=flat_condition)
        for metric, label_pat, pred_pat in zip(found, label_patterns, pred_patterns):
            preds = select(pred_pat, flat_outs)
            if preds:
                _update(metric, select(label_pat, flat_batch) + preds)

    return update


def update_metric_using_index(
    per_metric_idxs: Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> Callable[[Any, Any, Any], None]:
    """Update each metric with the batch items and outputs at its indexes.

    Args:
        per_metric_idxs: one dict per metric, ``{"label_idx": ..., "pred_idx": ...}``; each an
            int or a list of ints (``label_idx`` may be ``None`` for a metric of the outputs alone).

    Returns:
        ``f(metrics, batch, model_outs)``; ``batch`` and ``model_outs`` must be lists or tuples.

    Example:
        >>> import torch
        >>> from hat_ignite.metrics import Accuracy
        >>> metrics = [Accuracy(), Accuracy()]
        >>> batch = [torch.tensor([1]), torch.tensor([2])]
        >>> model_outs = [torch.tensor([1]), torch.tensor([3])]
        >>> update = update_metric_using_index([dict(label_idx=0, pred_idx=0), dict(label_idx=1, pred_idx=1)])
        >>> update(metrics, batch, model_outs)
        >>> metrics[0].get(), metrics[1].get()
        (('accuracy', 1.0), ('accuracy', 0.0))
    """
    label_idxs: list[list[int]] = []
    pred_idxs: list[list[int]] = []
    for i, idxs in enumerate(_as_list(per_metric_idxs)):
        if not isinstance(idxs, Mapping) or "pred_idx" not in idxs:
            raise ValueError(
                f"update_metric_using_index: per_metric_idxs[{i}] must be a dict with 'pred_idx' "
                f"(and 'label_idx', may be None), got {idxs!r}."
            )
        labels = [j for j in _as_list(idxs.get("label_idx")) if j is not None]
        preds = _as_list(idxs["pred_idx"])
        for j in labels + preds:
            if isinstance(j, bool) or not isinstance(j, int):
                raise TypeError(f"update_metric_using_index: per_metric_idxs[{i}] indexes must be ints, got {j!r}.")
        label_idxs.append(labels)
        pred_idxs.append(preds)

    def pick(data: Sequence, idxs: list[int], what: str) -> list:
        for j in idxs:
            if j >= len(data):
                raise IndexError(f"update_metric_using_index: {what} index {j} is out of range for {len(data)} items.")
        return [data[j] for j in idxs]

    def update(metrics: Any, batch: Any, model_outs: Any) -> None:
        found = _check_count("update_metric_using_index", metrics, len(pred_idxs))
        for value, what in ((batch, "batch"), (model_outs, "model_outs")):
            if not isinstance(value, (list, tuple)):
                raise TypeError(
                    f"update_metric_using_index needs a list or tuple {what}, got {type(value).__name__}; "
                    f"use update_metric_using_regex for dicts."
                )
        for metric, labels, preds in zip(found, label_idxs, pred_idxs):
            chosen = pick(model_outs, preds, "model_outs")
            if chosen:
                _update(metric, pick(batch, labels, "batch") + chosen)

    return update
