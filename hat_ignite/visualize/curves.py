"""Training curves: a run's loss, learning rate and metrics drawn into one PNG.

Source: the TensorBoard event files the :class:`~hat_ignite.callbacks.tensorboard.TensorBoard`
callback writes (read with :func:`~hat_ignite.visualize.event_file.read_scalars`). They already
hold every scalar of the run with its step, survive a crash up to the last flush, and need no
second log format; a run without a ``TensorBoard`` callback has no curves.

Panels, in this order (the x axis of each is the global step):

* ``loss``: every ``loss/<name>`` series, and the loss metrics (a ``train/`` or ``val/`` metric
  named ``loss`` or like one of the losses, e.g. ``LossShow``'s running mean);
* ``learning rate``: every ``lr/<group>`` series (log scale when it spans a factor of 20 or more);
* one panel per metric, with its ``train/<metric>`` and ``val/<metric>`` (or
  ``val/<key>/<metric>``) series together, so training and validation accuracy share axes.

Other tags (``stats/*``, tags added by ``tb_update_funcs``) are left to TensorBoard.

matplotlib is imported when a figure is drawn, and only its object-oriented API is used
(``Figure`` with the Agg canvas): no ``pyplot``, no global backend switch, nothing shown.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, NamedTuple, Union

from hat_ignite.errors import MissingExtraError
from hat_ignite.visualize.event_file import (
    Scalars,
    event_files,
    file_stage,
    find_event_dirs,
    read_scalars,
    stage_suffix,
)

__all__ = [
    "CURVES_FILE", "Panel", "Curves", "curves_file", "panels_of", "plot_scalars", "draw_training_curves",
    "require_matplotlib",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

#: File name of the PNG ``hat-curves`` writes into the work dir (``hat-train``: see :func:`curves_file`).
CURVES_FILE = "training_curves.png"


def curves_file(stage: str | None = None) -> str:
    """The PNG's file name for ``stage``: each stage of a work dir has its own.

    >>> curves_file("float"), curves_file()
    ('float_training_curves.png', 'training_curves.png')
    """
    return f"{stage}_{CURVES_FILE}" if stage else CURVES_FILE


class Panel(NamedTuple):
    """One subplot: its title and the ``(label, tag)`` of each line on it."""

    title: str
    lines: list[tuple[str, str]]


class Curves(NamedTuple):
    """What :func:`draw_training_curves` drew: the PNG's path, the panels, the source and the title."""

    path: str
    panels: list[Panel]
    source: str
    title: str = ""


def panels_of(tags: Any) -> list[Panel]:
    """Group scalar tags into panels (see the module docstring).

    >>> tags = ["loss/cls_loss", "lr/group_0", "lr/group_1", "train/accuracy", "val/accuracy",
    ...         "train/loss", "stats/step_time"]
    >>> for panel in panels_of(tags):
    ...     print(panel.title, [label for label, _ in panel.lines])
    loss ['cls_loss', 'loss (train metric)']
    learning rate ['group_0', 'group_1']
    accuracy ['train', 'val']
    """
    losses: list[tuple[str, str]] = []
    lrs: list[tuple[str, str]] = []
    metrics: dict[str, list[tuple[str, str]]] = {}
    for tag in sorted(tags):
        head, _, rest = tag.partition("/")
        if not rest:
            continue
        if head == "loss":
            losses.append((rest, tag))
        elif head == "lr":
            lrs.append((rest, tag))
        elif head in ("train", "val"):
            key, _, name = rest.rpartition("/")
            label = head if not key else f"{head} {key}"
            metrics.setdefault(name, []).append((label, tag))
    loss_names = {label for label, _ in losses}
    for name in [n for n in metrics if n in loss_names or n == "loss"]:  # a loss metric joins the losses
        losses += [(f"{name} ({label} metric)", tag) for label, tag in metrics.pop(name)]
    panels = []
    if losses:
        panels.append(Panel("loss", losses))
    if lrs:
        panels.append(Panel("learning rate", lrs))
    for name, lines in metrics.items():
        title = f"{name} (metric)" if name == "learning rate" else name
        panels.append(Panel(title, sorted(lines, key=lambda line: (not line[0].startswith("train"), line[0]))))
    return panels


def require_matplotlib() -> None:
    """Raise :class:`~hat_ignite.errors.MissingExtraError` naming the ``curves`` extra when
    matplotlib is not installed (it is an optional dependency of hat-ignite)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise MissingExtraError("matplotlib", "curves", "drawing training curves")


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's Agg canvas and ``Figure`` classes."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return FigureCanvasAgg, Figure


def plot_scalars(scalars: Scalars, path: PathLike, title: str = "") -> list[Panel]:
    """Draw ``scalars`` (``{tag: [(step, value), ...]}``) as panels into the PNG ``path``.

    The file is written next to ``path`` first and renamed over it, so ``path`` is never a
    half-written image.

    Returns:
        The panels drawn, one axes each, one line per ``(label, tag)``.

    Raises:
        ValueError: ``scalars`` has no loss, learning-rate or metric series.
        MissingExtraError: matplotlib is not installed (``pip install 'hat-ignite[curves]'``).
    """
    panels = panels_of(tag for tag, points in scalars.items() if points)
    if not panels:
        raise ValueError(
            f"nothing to draw: the scalars hold no loss/, lr/, train/ or val/ series (tags: "
            f"{sorted(scalars) or 'none'}). They are written by the TensorBoard callback."
        )
    FigureCanvasAgg, Figure = _matplotlib()
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5.0 * ncols, 3.6 * nrows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    for ax, panel in zip(axes, panels):
        positive = True
        values_all: list[float] = []
        for label, tag in panel.lines:
            steps = [s for s, _ in scalars[tag]]
            values = [v for _, v in scalars[tag]]
            values_all += [v for v in values if math.isfinite(v)]
            positive = positive and all(v > 0 for v in values)
            ax.plot(steps, values, label=label, marker="o" if len(steps) <= 30 else None, markersize=3, linewidth=1.2)
        if panel.title == "learning rate" and positive and values_all and max(values_all) >= 20 * min(values_all):
            ax.set_yscale("log")
        ax.set_title(panel.title)
        ax.set_xlabel("global step")
        ax.grid(True, alpha=0.3)
        if len(panel.lines) > 1 or panel.lines[0][0] not in (panel.title, ""):
            ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    path = os.path.abspath(os.fspath(path))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return panels


def _event_source(source: str, stage: str | None = None) -> str:
    """The event file or run directory to read for ``source`` (a work dir, a run dir or a file)."""
    if os.path.isfile(source):
        return source
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source} does not exist. Give the work dir of a run (or its TensorBoard save_dir).")
    if event_files(source, stage):
        return source
    dirs = find_event_dirs(source, stage)
    if not dirs:
        of_stage = f" of stage {stage!r} (*{stage_suffix(stage)})" if stage else ""
        raise FileNotFoundError(
            f"{source} holds no TensorBoard event file{of_stage} (events.out.tfevents.*), so there are no curves "
            f"to draw. Add dict(type='TensorBoard', save_dir=os.path.join(work_dir, 'tensorboard')) to "
            f"the trainer's callbacks and train again."
        )
    if len(dirs) > 1:
        logger.info("%d directories under %s hold event files; drawing the most recent, %s", len(dirs), source, dirs[-1])
    return dirs[-1]


def _latest_stage(directory: str) -> str | None:
    """The stage of the newest event file in ``directory`` when it holds the files of several
    ``hat-train`` stages (each stage's history is drawn alone), else ``None`` (all files)."""
    stages = [file_stage(f) for f in event_files(directory)]
    named = [s for s in stages if s is not None]
    if len(set(named)) < 2:
        return None
    logger.info("%s holds the event files of stages %s; drawing the latest, %r (choose one with --stage)",
                directory, ", ".join(sorted(set(named))), named[-1])
    return named[-1]


def draw_training_curves(
    source: PathLike, out: PathLike | None = None, title: str | None = None, stage: str | None = None,
) -> Curves:
    """Read a run's TensorBoard scalars and draw them into a PNG.

    Args:
        source: a work dir (searched for event files; the most recently written directory of
            them is used), a TensorBoard ``save_dir``, or one event file.
        out: the PNG to write; default ``<source>/training_curves.png`` (for a file source, next
            to the file; ``<stage>_training_curves.png`` with ``stage``).
        title: the figure's title; default the run's name (:func:`run_name` of ``source``,
            wherever ``out`` is), and the stage.
        stage: draw only the event files of this ``hat-train`` stage (stages may share a
            TensorBoard directory, see :func:`~hat_ignite.visualize.event_file.stage_suffix`);
            ``None``: all of them, or, when they belong to several stages, those of the stage
            written last.

    Returns:
        The PNG's path, the panels drawn and the event source read.

    Raises:
        FileNotFoundError: ``source`` does not exist or holds no event file.
        ValueError: the event files hold nothing to draw, or are corrupt.
        MissingExtraError: matplotlib is not installed (``pip install 'hat-ignite[curves]'``).
    """
    require_matplotlib()  # before reading any file
    source = os.path.abspath(os.fspath(source))
    events = _event_source(source, stage)
    if stage is None and os.path.isdir(events):
        stage = _latest_stage(events)
    if out is None:
        out = os.path.join(source if os.path.isdir(source) else os.path.dirname(source), curves_file(stage))
    scalars = read_scalars(events, stage)
    try:
        if title is None:
            title = f"{run_name(source)}: {stage}" if stage else run_name(source)
        panels = plot_scalars(scalars, out, title=title)
    except ValueError as exc:
        raise ValueError(f"{events}: {exc}") from exc
    return Curves(os.path.abspath(os.fspath(out)), panels, events, title)


def run_name(source: PathLike) -> str:
    """The run a source of event files belongs to: its work dir's name.

    ``source`` is a work dir, a TensorBoard ``save_dir`` inside one (HAT's ``ckpt_dir/tensorboard``)
    or an event file; wherever the PNG is written, the title names the run.

    >>> run_name("/runs/digits_mlp"), run_name("/runs/digits_mlp/tensorboard")
    ('digits_mlp', 'digits_mlp')
    """
    folder = os.path.abspath(os.fspath(source))
    if os.path.isfile(folder) or ".tfevents." in os.path.basename(folder):
        folder = os.path.dirname(folder)
    if os.path.basename(folder) in ("tensorboard", "tb", "logs"):
        folder = os.path.dirname(folder)
    return os.path.basename(folder)
