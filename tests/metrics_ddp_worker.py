"""Run in a subprocess by tests/test_metrics_ddp.py: HAT metrics in 2 gloo processes vs 1.

``python tests/metrics_ddp_worker.py OUT_FILE`` starts two gloo processes with hat-ignite's launcher;
each updates the metrics with its own half of fixed data (unequal halves, as a DistributedSampler
tail can give) and rank 0 saves ``get()`` of every metric to ``OUT_FILE``.
"""

from __future__ import annotations

import sys

import torch


def fixed_data() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Seven batches: labels, logits, a loss, segmentation labels and predictions."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(7):
        n = 5 + i  # batches of different sizes
        labels = torch.randint(0, 4, (n,), generator=gen)
        logits = torch.randn(n, 4, generator=gen)
        seg_labels = torch.randint(0, 3, (2, 4, 4), generator=gen)
        seg_preds = torch.randint(0, 3, (2, 4, 4), generator=gen)
        out.append((labels, logits, torch.rand((), generator=gen), seg_labels, seg_preds))
    return out


def metric_values(rank: int, world_size: int) -> dict[str, object]:
    """Update fresh metrics with this rank's batches (round-robin) and return ``get()`` of each."""
    from hat_ignite.metrics import Accuracy, LossShow, MeanAveragePrecision, MeanIoU, TopKAccuracy

    metrics = {"acc": Accuracy(), "top2": TopKAccuracy(top_k=2), "loss": LossShow(), "miou": MeanIoU(num_classes=3),
               "map": MeanAveragePrecision(num_classes=4), "acc_ignore": Accuracy(ignore_index=-1),
               "acc_index": Accuracy(), "losses": LossShow(), "first_only": Accuracy(), "loss_first": LossShow()}
    for i, (labels, logits, loss, seg_labels, seg_preds) in enumerate(fixed_data()):
        if i == 0 and rank == 0:  # updated on one rank only: the others still take part in get()
            metrics["first_only"].update(labels, logits)
            metrics["loss_first"].update(loss)
        if i % world_size != rank:
            continue
        metrics["acc"].update(labels, logits)
        metrics["top2"].update(labels, logits)
        metrics["loss"].update(loss)
        metrics["map"].update(labels, logits)
        metrics["miou"].update(seg_labels, seg_preds)
        metrics["acc_ignore"].update(torch.where(labels == 3, -1, labels), logits)
        metrics["acc_index"].update(labels, logits.argmax(1))
        metrics["losses"].update({"cls": loss, "reg": loss * 2 + logits.mean()})
    return {key: metric.get() for key, metric in metrics.items()}


def _per_rank(local_rank: int, out_file: str) -> None:
    import ignite.distributed as idist

    values = metric_values(idist.get_rank(), idist.get_world_size())
    if idist.get_rank() == 0:
        torch.save(values, out_file)


if __name__ == "__main__":
    from hat_ignite.engine.launcher import launch_distributed

    launch_distributed(_per_rank, num_processes=2, timeout=60, args=(sys.argv[1],))
