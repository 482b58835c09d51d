"""hat-train on a real pseudo-terminal: log lines go around the tqdm bar, and no bar outlives the run."""

from __future__ import annotations

import re
import sys

from conftest import DIGITS_CONFIG, ROOT
from pty_run import run_on_a_pty

LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|WARNING|ERROR) [\w.]+: \S")
BAR_TEXT = re.compile(r"\d+/\d+ \[|it/s|s/it|\d+%\|")
COLUMNS = 200


def _screen(data: str) -> list[str]:
    """What a terminal shows after ``data``: carriage returns, newlines, cursor-up and erase-line."""
    lines = [""]
    row = col = 0
    i = 0
    while i < len(data):
        char = data[i]
        if char == "\x1b":
            match = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", data[i:])
            if match:
                args, command = match.groups()
                if command == "A":
                    row = max(row - int(args or 1), 0)
                elif command == "B":
                    row += int(args or 1)
                    lines.extend([""] * (row + 1 - len(lines)))
                elif command == "K":
                    lines[row] = lines[row][:col] if args in ("", "0") else ""
                i += len(match.group(0))
                continue
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            lines.extend([""] * (row + 1 - len(lines)))
        elif char >= " ":
            line = lines[row].ljust(col)
            lines[row] = line[:col] + char + line[col + 1:]
            col += 1
        i += 1
    return [line.rstrip() for line in lines if line.strip()]


def _run_on_a_terminal(tmp_path, *args: str) -> tuple[int, list[str], str]:
    code, raw = run_on_a_pty([sys.executable, str(ROOT / "bin" / "hat-train"), *args], tmp_path, 50, COLUMNS)
    return code, _screen(raw), raw


def test_log_lines_are_printed_whole_around_the_bar_and_no_bar_is_left(tmp_path):
    code, screen, raw = _run_on_a_terminal(
        tmp_path, str(DIGITS_CONFIG), "--work-dir", str(tmp_path / "wd"), "--opts", "float_trainer.num_epochs=2",
    )
    assert code == 0, "\n".join(screen[-20:])
    assert "23/23" in raw and "loss=" in raw  # the bar was drawn, with the loss
    for line in screen:  # every line on the screen is a whole log line: none was printed into the bar
        assert LOG_LINE.match(line) and not BAR_TEXT.search(line), line
    text = "\n".join(screen)
    for expected in ("Epoch[0] done in", "Validation Epoch[0] accuracy=", "Validation Epoch[1] accuracy=", "done in "):
        assert expected in text
    assert screen[-1].split(": ", 1)[1].startswith("done in ")  # nothing drawn after the last line


def test_an_error_is_reported_once_under_no_stale_bar(tmp_path):
    bad = tmp_path / "bad_key.py"  # the training metrics read a batch key the batches do not have
    bad.write_text(DIGITS_CONFIG.read_text().replace('accuracy.update(batch["labels"], logits)',
                                                     'accuracy.update(batch["label"], logits)'))
    code, screen, _ = _run_on_a_terminal(
        tmp_path, str(bad), "--work-dir", str(tmp_path / "wd"), "--opts", "float_trainer.num_epochs=1",
    )
    assert code == 1
    assert screen[-1].startswith("hat-train: error: training float_trainer failed at epoch_id=0, global_step_id=0: KeyError")
    assert sum("'label'" in line for line in screen) == 1  # one message, not three
    for line in screen[:-1]:
        assert LOG_LINE.match(line) and not BAR_TEXT.search(line), line


def test_a_batch_without_labels_is_reported_once(tmp_path):
    bad = tmp_path / "no_labels.py"  # the model looks for labels under a key the batches do not have
    bad.write_text(DIGITS_CONFIG.read_text().replace('hidden_features=128, num_classes=10)',
                                                     'hidden_features=128, num_classes=10, label_key="lbl")'))
    assert bad.read_text() != DIGITS_CONFIG.read_text()
    code, screen, _ = _run_on_a_terminal(
        tmp_path, str(bad), "--work-dir", str(tmp_path / "wd"), "--opts", "float_trainer.num_epochs=1",
    )
    assert code == 1
    starts = [i for i, line in enumerate(screen) if line.startswith("hat-train: error:")]
    assert len(starts) == 1, screen  # one message, not three
    message = " ".join(screen[starts[0]:])  # the message and its lines on the batch, to the end
    assert message.startswith("hat-train: error: training float_trainer failed at epoch_id=0, global_step_id=0:")
    assert "needs labels: pass a dict batch with 'lbl'" in message and "this batch:" in message
    assert sum("needs labels" in line for line in screen) == 1
    for line in screen[:starts[0]]:
        assert LOG_LINE.match(line) and not BAR_TEXT.search(line), line


def test_a_terminal_with_no_size_gets_the_line_per_epoch(tmp_path):
    """A pseudo-terminal nobody sized (0 x 0, as some job runners give) cannot show a bar: each
    epoch still ends with its line."""
    code, raw = run_on_a_pty(
        [sys.executable, str(ROOT / "bin" / "hat-train"), str(DIGITS_CONFIG), "--work-dir", str(tmp_path / "wd"),
         "--opts", "float_trainer.num_epochs=1"], tmp_path, 0, 0)
    screen = _screen(raw)
    assert code == 0, "\n".join(screen[-20:])
    assert any(re.search(r"hat_ignite.cli.train: Epoch\[0\] last loss=[0-9.]+ lr=[0-9.]+ \(", line) for line in screen)
    for line in screen:
        assert LOG_LINE.match(line) and not BAR_TEXT.search(line), line
