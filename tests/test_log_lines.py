"""The log of a 3-epoch run of the shipped digits config, line by line: one numbering (HAT's 0-based ids)."""

from __future__ import annotations

import re

import pytest
from conftest import DIGITS_CONFIG, run_tool

NUMBER = r"[0-9.e+-]+"


def _expected(work_dir: str) -> list[str]:
    """The line patterns (after the ``HH:MM:SS LEVEL logger: `` head, kept in the pattern)."""
    head = r"\d\d:\d\d:\d\d INFO "
    wd = re.escape(work_dir)
    lines = [
        head + re.escape("hat_ignite.cli: hat.* imports are served by hat-ignite (hat_ignite.hat_alias)"),
        head + r"hat_ignite\.cli: seed: 0",
        head + rf"hat_ignite\.cli\.train: config \S+digits_mlp\.py, stage float_trainer, work dir {wd}",
    ]
    for epoch in range(3):
        lr = "0" if epoch == 0 else "0.1"  # the warm-up starts at 0; one value for both param groups
        lines += [
            head + rf"hat_ignite\.callbacks\.lr_updater_base: Epoch\[{epoch}\] Step\[0\] GlobalStep\[{23 * epoch}\] lr={lr}",
            head + rf"hat_ignite\.callbacks\.stats_monitor: Epoch\[{epoch}\] done in {NUMBER}s: 23 steps, .*",
            head + rf"hat_ignite\.callbacks\.metric_updater: Validation Epoch\[{epoch}\] accuracy={NUMBER}",
            head + rf"hat_ignite\.callbacks\.checkpoint: Saved checkpoint {wd}/checkpoints/float-checkpoint-epoch-"
                   rf"000{epoch}-\w+\.pth\.tar \(new best accuracy={NUMBER}\)\.",
        ]
        if epoch:  # keep_n=1: the file the previous epoch's line named goes, and says so
            lines.append(head + rf"hat_ignite\.callbacks\.checkpoint: Removed old checkpoint {wd}/checkpoints/"
                                rf"float-checkpoint-epoch-000{epoch - 1}-\w+\.pth\.tar \(keep_n=1\)\.")
        lines += [
            head + rf"hat_ignite\.cli\.train: Epoch\[{epoch}\] last loss={NUMBER} lr={NUMBER} \({NUMBER} s\)",
        ]
    lines += [
        head + rf"hat_ignite\.cli\.curves: training curves: {wd}/float_training_curves\.png \(3 panels\)",
        head + rf"hat_ignite\.cli\.train: done in {NUMBER} s: train cls_loss={NUMBER} accuracy={NUMBER}, "
               rf"val accuracy={NUMBER} -> {wd}/metrics\.json",
    ]
    return lines


@pytest.fixture(scope="module")
def three_epochs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    work_dir = cwd / "wd"
    proc = run_tool("hat-train", DIGITS_CONFIG, "--work-dir", work_dir, "--opts", "float_trainer.num_epochs=3",
                    cwd=cwd, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr.splitlines(), work_dir


def test_the_log_of_three_epochs_is_these_lines(three_epochs):
    lines, work_dir = three_epochs
    expected = _expected(str(work_dir))
    assert len(lines) == len(expected), "\n".join(lines)
    for line, pattern in zip(lines, expected):
        assert re.fullmatch(pattern, line), f"{line!r}\n  does not match\n{pattern!r}"


def test_every_id_in_the_log_is_0_based(three_epochs):
    lines, work_dir = three_epochs
    text = "\n".join(lines)
    assert {int(n) for n in re.findall(r"Epoch\[(\d+)\]", text)} == {0, 1, 2}
    assert not re.search(r"(?i)epoch \d+/\d+|Complete\. Time taken|Engine run", text)
    # the log file holds the same lines
    logged = (work_dir / "float_train.log").read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in logged] == [line.split(": ", 1)[1] for line in lines]


def test_a_typod_callback_argument_is_one_message_with_the_right_name(tmp_path):
    config = tmp_path / "typo.py"
    config.write_text(DIGITS_CONFIG.read_text().replace("lr_decay_id=[12, 17]", "lr_decay_idd=[12, 17]"))
    proc = run_tool("hat-train", config, "--work-dir", tmp_path / "wd", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "lr_decay_idd" in line]
    assert len(errors) == 1 and errors[0].startswith("hat-train: error: ")
    assert "Did you mean 'lr_decay_id'" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "wd").exists()
