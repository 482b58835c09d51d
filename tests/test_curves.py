"""Training curves: hat-train leaves an event file and float_training_curves.png; hat-curves redraws it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import DIGITS_CONFIG, ROOT, run_tool, time_limit
from pty_run import run_on_a_pty

from hat_ignite.cli import curves as curves_cli
from hat_ignite.visualize.curves import CURVES_FILE, curves_file, plot_scalars
from hat_ignite.visualize.event_file import event_files, read_scalars

STEPS = 2 * 23  # two epochs of 1437 training digits in batches of 64


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real two-epoch run of the shipped digits config (bin/hat-train in a subprocess)."""
    work_dir = tmp_path_factory.mktemp("runs") / "digits"
    proc = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--opts", "float_trainer.num_epochs=2",
                    cwd=tmp_path_factory.mktemp("cwd"), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work_dir, proc


def _png_image(path):
    from matplotlib.image import imread

    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    return imread(path)


def test_hat_train_writes_the_event_file_and_the_curves(run):
    work_dir, proc = run
    files = event_files(work_dir / "tensorboard")
    assert len(files) == 1
    scalars = read_scalars(work_dir / "tensorboard")
    # the config writes every 5 steps as HAT does: ceil(STEPS / 5) points, at global_step_id 0, 5, ...
    assert [s for s, _ in scalars["loss/cls_loss"]] == list(range(0, STEPS, 5)) and -(-STEPS // 5) == 10
    assert len(scalars["lr/group_0"]) == len(scalars["lr/group_1"]) == len(scalars["train/accuracy"]) == 10
    assert [s for s, _ in scalars["val/accuracy"]] == [23, 46]
    assert scalars["loss/cls_loss"][-1][1] < scalars["loss/cls_loss"][0][1]  # it trained
    png = work_dir / curves_file("float")
    image = _png_image(png)
    assert image.shape[0] > 200 and image.shape[1] > 600 and image.std() > 0.01  # a real picture
    assert f"training curves: {png} (3 panels)" in proc.stderr


def test_hat_curves_redraws_the_png_from_the_work_dir(run, tmp_path):
    work_dir, _ = run
    out = tmp_path / "again.png"
    proc = run_tool("hat-curves", work_dir, "--out", out, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"{out} (loss, learning rate, accuracy; from {work_dir / 'tensorboard'})")
    assert os.path.getsize(out) > 10_000
    assert _png_image(out).shape == _png_image(work_dir / curves_file("float")).shape


def test_the_title_names_the_run_wherever_the_png_goes(run, tmp_path):
    from hat_ignite.visualize.curves import draw_training_curves

    work_dir, _ = run
    elsewhere = tmp_path / "plots"
    elsewhere.mkdir()
    for source in (work_dir, work_dir / "tensorboard"):
        drawn = draw_training_curves(source, elsewhere / "x.png", stage="float")
        assert drawn.title == f"{work_dir.name}: float"  # not "plots", the PNG's folder


def test_the_panels_hold_one_line_per_series(run, tmp_path):
    work_dir, _ = run
    scalars = read_scalars(work_dir / "tensorboard")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401  (the canvas plot_scalars uses)

    panels = plot_scalars(scalars, tmp_path / "c.png")
    assert [(p.title, [label for label, _ in p.lines]) for p in panels] == [
        ("loss", ["cls_loss", "cls_loss (train metric)"]),
        ("learning rate", ["group_0", "group_1"]),
        ("accuracy", ["train", "val"]),
    ]
    for panel in panels:  # each line is drawn from its tag's points
        for _, tag in panel.lines:
            assert scalars[tag]


def test_missing_or_empty_work_dirs_give_one_clear_error(tmp_path, capsys):
    assert curves_cli.main([str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert f"hat-curves: error: {tmp_path / 'nope'} does not exist." in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert curves_cli.main([str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "holds no TensorBoard event file" in err and "dict(type='TensorBoard'" in err
    assert not (tmp_path / "empty" / CURVES_FILE).exists()


def test_event_files_without_curves_to_draw_are_an_error(tmp_path, capsys):
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("stats/step_time", 0.1, 0)
    assert curves_cli.main([str(tmp_path)]) == 1
    assert "nothing to draw" in capsys.readouterr().err


def test_a_terminal_gets_a_progress_bar_with_loss_and_lr(tmp_path):
    """stderr on a pseudo-terminal: Ignite's tqdm bar shows loss and lr; no per-epoch log lines."""
    cmd = [sys.executable, str(ROOT / "bin" / "hat-train"), str(DIGITS_CONFIG), "--work-dir", str(tmp_path / "wd"),
           "--opts", "float_trainer.num_epochs=1", "float_trainer.callbacks=[]"]
    code, text = run_on_a_pty(cmd, tmp_path, 40, 160, stdout_too=False)  # 40 x 160, as a real terminal has
    assert code == 0
    assert "23/23" in text and "loss=" in text and "lr=" in text
    assert "Epoch[0] last loss=" not in text  # that line is for logs that are not a terminal


def test_a_log_file_gets_a_line_per_epoch_with_loss_and_lr(run):
    work_dir, _ = run
    log = (work_dir / "float_train.log").read_text()
    assert re.search(r"Epoch\[0\] last loss=\S+ lr=0\.09565 ", log)
    assert re.search(r"Epoch\[1\] last loss=\S+ lr=0\.1 ", log)


# A Python where matplotlib cannot be imported, as where hat-ignite is installed without its
# `curves` extra: the import system finds None for the name and raises ImportError.
_NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; from hat_ignite.cli.{} import main; sys.exit(main())"


def test_without_matplotlib_hat_train_trains_and_one_line_names_the_extra(tmp_path):
    work_dir = tmp_path / "wd"
    proc = subprocess.run(
        [sys.executable, "-c", _NO_MATPLOTLIB.format("train"), str(DIGITS_CONFIG), "--work-dir", str(work_dir),
         "--opts", "float_trainer.num_epochs=1"], cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(240),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "matplotlib is" in line or "hat-ignite[" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"no float_training_curves.png: matplotlib is not installed (pip install 'hat-ignite[curves]'); the "
        f"TensorBoard event files in {work_dir / 'tensorboard'} hold the same values"), lines
    assert (work_dir / "metrics.json").exists() and event_files(work_dir / "tensorboard")
    assert not (work_dir / curves_file("float")).exists() and "Traceback" not in proc.stderr


def test_without_matplotlib_hat_curves_is_an_error_naming_the_extra(run, tmp_path):
    work_dir, _ = run
    proc = subprocess.run([sys.executable, "-c", _NO_MATPLOTLIB.format("curves"), str(work_dir), "--out",
                           str(tmp_path / "c.png")], cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(120))
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("hat-curves: error: drawing training curves needs matplotlib, which is not "
                                   "installed: pip install 'hat-ignite[curves]'. (run again with --debug for the "
                                   "traceback)")
    assert not (tmp_path / "c.png").exists()
