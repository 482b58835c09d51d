"""`SimpleProfiler`: where a run's time goes, as one table at the end of the run."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from hat_ignite.profiler.base import ProfilerBase

if TYPE_CHECKING:  # pragma: no cover
    from hat_ignite.engine.loop import LoopBase

__all__ = ["SimpleProfiler"]

logger = logging.getLogger(__name__)


class SimpleProfiler(ProfilerBase):
    """Time every phase of a run and report a table sorted by total time when the loop ends.

    The rows are the data wait, the batch processor's phases (``forward`` — batch transforms,
    device move, forward and loss collection —, ``backward``, ``optimizer``), the rest of the
    process function, and every event handler by event (HAT callbacks as ``Class.on_hook``, the
    engine's own bridge handlers by function name). Times are *exclusive*: a handler that runs a
    nested loop (``Validation``) or fires HAT events (the engine's bridges) is charged only for
    its own work, so the rows add up to the run's wall time less the engine loop's own
    bookkeeping, which the table shows as the last row.

    On CUDA, kernels run asynchronously: a phase's time is the time to *queue* its work, and the
    wait shows wherever the host next waits for the device (often ``optimizer`` or the data
    wait). Pass ``cuda_sync=True`` to synchronise at every section boundary for exact phase
    times, at the price of a slower run.

    Args:
        log: log the table through this module's logger at the end of each run.
        output_file: also write the table to this path at the end of each run.
        cuda_sync: call ``torch.cuda.synchronize()`` at every section boundary.

    Attributes:
        results: after a run, one dict per row (``name``, ``calls``, ``total_s``, ``mean_ms``,
            ``percent``), sorted by total time, most first.
        wall_s: the run's wall time in seconds, from ``STARTED`` to ``COMPLETED``.

    Example:
        >>> import torch
        >>> from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = torch.nn.Linear(4, 3)
        ...     def forward(self, x, y):
        ...         return torch.nn.functional.cross_entropy(self.fc(x), y), None
        >>> model = Net()
        >>> trainer = Trainer(model=model, data_loader=[(torch.randn(8, 4), torch.randint(0, 3, (8,)))] * 4,
        ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...     batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        ...     device=None, num_epochs=1, profiler="simple")
        >>> profiler = trainer.fit() and trainer.profiler
        >>> sorted(r["name"] for r in profiler.results if r["name"] in ("forward", "backward", "optimizer"))
        ['backward', 'forward', 'optimizer']
        >>> [r["calls"] for r in profiler.results if r["name"] == "forward"]
        [4]
    """

    def __init__(self, log: bool = True, output_file: str | None = None, cuda_sync: bool = False) -> None:
        self.log = log
        self.output_file = output_file
        self.cuda_sync = cuda_sync
        self.results: list[dict[str, Any]] = []
        self.wall_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self._totals: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._stack: list[list[Any]] = []  # [name, start, time of nested sections]
        self._t0 = time.perf_counter()

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def begin(self, name: str) -> None:
        if self.cuda_sync:
            self._sync()
        self._stack.append([name, time.perf_counter(), 0.0])

    def end(self) -> None:
        if self.cuda_sync:
            self._sync()
        now = time.perf_counter()
        name, start, nested = self._stack.pop()
        elapsed = now - start
        self._totals[name] = self._totals.get(name, 0.0) + elapsed - nested
        self._calls[name] = self._calls.get(name, 0) + 1
        if self._stack:
            self._stack[-1][2] += elapsed

    def run_started(self, engine: LoopBase) -> None:
        self._reset()

    def run_finished(self, engine: LoopBase) -> None:
        self.wall_s = wall = time.perf_counter() - self._t0
        rows: list[dict[str, Any]] = [
            {"name": name, "calls": self._calls[name], "total_s": total,
             "mean_ms": total / self._calls[name] * 1e3, "percent": 100.0 * total / wall if wall else 0.0}
            for name, total in self._totals.items()
        ]
        rows.sort(key=lambda r: r["total_s"], reverse=True)
        self.results = rows
        if self.log or self.output_file:
            text = self.table()
            if self.log:
                logger.info("Profile of the %s run:\n%s", type(engine).__name__, text)
            if self.output_file:
                with open(self.output_file, "w", encoding="utf-8") as f:
                    f.write(text + "\n")

    def top_sections(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` sections that took the most time so far in the running (or last) run.

        Live: counts every section closed up to now, so it can be read during a run (HAT's
        ``StatsMonitor(log_profiler=True)`` logs it at each step log).

        Returns:
            ``(name, total seconds)`` pairs, most first.
        """
        totals = self._totals
        return sorted(totals.items(), key=lambda item: item[1], reverse=True)[:n]

    def timed_total_s(self) -> float:
        """The sum of every row's total: the run's time that some section accounts for."""
        return sum(r["total_s"] for r in self.results)

    def get_results(self) -> list[dict[str, Any]]:
        """The last run's rows (as :attr:`results`), named as Ignite's profilers name theirs.

        With ``attach(engine)`` (also as Ignite's), code written for Ignite's
        ``HandlersTimeProfiler`` switches by changing the class; see ``docs/ignite.md`` for why
        Ignite's profilers misreport HAT hooks.
        """
        return list(self.results)

    def write_results(self, output_path: str) -> None:
        """Write the last run's rows as CSV (``name,calls,total_s,mean_ms,percent``), one per section."""
        import csv

        with open(output_path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["name", "calls", "total_s", "mean_ms", "percent"])
            writer.writeheader()
            writer.writerows(self.results)

    def table(self) -> str:
        """The last run's results as a fixed-width text table."""
        width = max([len(r["name"]) for r in self.results] + [20])
        lines = [f"{'section':<{width}} {'calls':>8} {'total s':>10} {'mean ms':>10} {'% run':>7}"]
        for r in self.results:
            lines.append(f"{r['name']:<{width}} {r['calls']:>8d} {r['total_s']:>10.4f} {r['mean_ms']:>10.4f} "
                         f"{r['percent']:>7.2f}")
        rest = self.wall_s - self.timed_total_s()
        lines.append(f"{'(engine loop, not in any section)':<{width}} {'':>8} {rest:>10.4f} {'':>10} "
                     f"{100.0 * rest / self.wall_s if self.wall_s else 0.0:>7.2f}")
        lines.append(f"{'run wall time':<{width}} {'':>8} {self.wall_s:>10.4f}")
        return "\n".join(lines)
