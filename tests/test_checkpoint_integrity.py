"""Checkpoint integrity under hard kills, hostile files and rotation (docs/reliability.md).

Real subprocesses killed with SIGKILL, real files on disk, real pickles; no mocks.
"""

from __future__ import annotations

import ast
import logging
import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hat_ignite.callbacks.checkpoint import Checkpoint, latest_valid_checkpoint, list_checkpoints
from hat_ignite.callbacks.checkpoint_io import (
    FORMAT_KEY,
    FORMAT_VERSION,
    HASH_KEY,
    atomic_save,
    content_hash,
    load_checkpoint,
    with_content_hash,
)
from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint, resume_from
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.errors import CheckpointError
from conftest import time_limit

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Net(nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.body = nn.Linear(width, width)
        self.head = nn.Linear(width, 1)

    def forward(self, x, y):
        return (nn.functional.mse_loss(self.head(torch.relu(self.body(x))), y),)


def make_trainer(callbacks, model=None, lr=0.05, num_epochs=3, **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = model or Net()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))
    return Trainer(
        model=model, data_loader=DataLoader(data, batch_size=4),
        optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0), **kwargs),
        device=None, callbacks=callbacks, num_epochs=num_epochs,
    )


# -- SIGKILL during large writes -----------------------------------------------------------------
WRITER = """
import sys, torch
from torch import nn
from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

class Big(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 2048)  # 8 MiB of weights, 8 MiB of momentum: a 16 MiB file
    def forward(self, x):
        return (self.fc(x).pow(2).mean(),)

class Announce(Checkpoint):
    def save_point(self, *args, **kwargs):
        path = super().save_point(*args, **kwargs)
        print("SAVED", path, flush=True)
        return path

model = Big()
trainer = Trainer(
    model=model, data_loader=[torch.randn(2, 1024)] * 1000,
    optimizer=torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
    batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
    device=None, num_epochs=1,
    callbacks=[Announce(sys.argv[1], interval_by="step", keep_n=2)],
)
trainer.fit()
"""


def _temp_files(directory: pathlib.Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(".") and n.endswith(".tmp")]


@pytest.mark.parametrize("tmpdir_elsewhere", [False, True], ids=["default-TMPDIR", "TMPDIR-other-fs"])
def test_sigkill_during_large_writes_keeps_the_previous_checkpoint(tmp_path, caplog, tmpdir_elsewhere):
    save_dir = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    other_tmp = None
    if tmpdir_elsewhere:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
        other_tmp = pathlib.Path(base) / f"hat-ignite-tmpdir-{os.getpid()}"
        other_tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(other_tmp)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, "-u", str(script), str(save_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    saved: list[str] = []
    try:
        deadline = time.monotonic() + time_limit(90)
        while len(saved) < 3 and time.monotonic() < deadline:  # a few complete saves first
            line = proc.stdout.readline()
            if line.startswith("SAVED"):
                saved.append(line.split()[1])
        assert len(saved) >= 3, "the writer never saved"
        while not _temp_files(save_dir) and time.monotonic() < deadline:  # then kill mid-write
            pass
        killed_mid_write = bool(_temp_files(save_dir))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=time_limit(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=time_limit(30))
        proc.stdout.close()
    assert killed_mid_write and proc.returncode == -signal.SIGKILL
    # every finished file loads and matches its recorded hash; last is one of the announced saves
    periodic = list_checkpoints(save_dir)
    assert periodic and all(load_checkpoint(p)[HASH_KEY] for p in periodic)
    last = load_checkpoint(save_dir / "checkpoint-last.pth.tar")
    assert last[HASH_KEY] == content_hash(last)
    announced = {os.path.basename(p)[-16:-8] for p in saved} | {os.path.basename(p)[-16:-8] for p in periodic}
    assert last[HASH_KEY][:8] in announced
    if other_tmp is not None:
        assert os.listdir(other_tmp) == []  # temporary files live next to the destination only
        other_tmp.rmdir()
    # the next run removes the stray temporary file and says so
    stray = _temp_files(save_dir)
    with caplog.at_level(logging.WARNING, logger="hat_ignite.callbacks.checkpoint"):
        make_trainer([Checkpoint(save_dir, interval_by="step", save_interval=10**6, save_on_train_end=False)],
                     num_epochs=1).fit()
    assert stray and _temp_files(save_dir) == []
    assert any(f"Removed {len(stray)} temporary file(s)" in r.getMessage() and stray[0] in r.getMessage()
               for r in caplog.records)


# -- hostile and foreign files ---------------------------------------------------------------
class RunsCode:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("container", ["torch.save", "plain-pickle"])
def test_a_pickle_that_would_run_code_is_refused_and_does_not_run(tmp_path, container):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pth.tar"
    payload = {"state_dict": {}, "config": RunsCode(str(marker))}
    if container == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    for load in (load_checkpoint, lambda p: LoadCheckpoint(p)(Net()), lambda p: resume_from(make_trainer([]), p)):
        with pytest.raises(CheckpointError, match=re.escape(str(path)) + r".*(weights-only load refuses|posix\.system|os\.system|not a complete)") as info:
            load(path)
        if "weights-only load refuses" in str(info.value):  # how to convert a trusted file without running it here
            assert "separate, throw-away environment" in str(info.value) and "clean.pth.tar" in str(info.value)
    assert not marker.exists()


class CallsGlobal:
    """Unpickles to ``function(argument)``: each a global a weights-only load refuses."""

    def __init__(self, function, argument) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self):
        return (self.function, (self.argument,))


@pytest.mark.parametrize("function, argument, name", [
    (eval, "1 + 1", "eval"),
    (exec, "x = 1", "exec"),
    (subprocess.getoutput, "true", "getoutput"),  # pickled as commands.getoutput
    (torch.storage._load_from_bytes, b"", "torch.storage._load_from_bytes"),
])
def test_a_refused_file_never_gets_torchs_allow_listing_advice(tmp_path, function, argument, name):
    """torch's refusal advises ``add_safe_globals([that global])``: following it would let the file's
    code run, so our error names the global and never repeats the advice."""
    path = tmp_path / "refused.pth.tar"
    torch.save({"state_dict": {}, "config": CallsGlobal(function, argument)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert re.search(rf"refuses \(the global ([\w]+\.)*{re.escape(name)}\)", message), message
    for advice in ("add_safe_globals", "safe_globals", "allowlist", "weights_only` set to `False"):
        assert advice not in message, message


def test_no_code_path_loads_with_weights_only_false():
    offenders = []
    for file in sorted((ROOT / "hat_ignite").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.load", "torch.serialization.load"):
                flag = [k for k in node.keywords if k.arg == "weights_only"]
                if not flag or not (isinstance(flag[0].value, ast.Constant) and flag[0].value.value is True):
                    offenders.append(f"{file.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.keyword) and node.arg == "weights_only" and not (
                    isinstance(node.value, ast.Constant) and node.value.value is True):
                offenders.append(f"{file.relative_to(ROOT)}:{node.value.lineno} (weights_only not True)")
            if isinstance(node, ast.Attribute) and node.attr in ("add_safe_globals", "safe_globals"):
                offenders.append(f"{file.relative_to(ROOT)}:{node.lineno} (extra safe globals)")
    assert offenders == []


def test_every_written_checkpoint_loads_weights_only_without_extra_safe_globals(tmp_path):
    from hat_ignite.callbacks.lr_updater import CosLrUpdater

    trainer = make_trainer([CosLrUpdater(warmup_len=2), Checkpoint(tmp_path, mode="min", monitor_metric_key="loss")])
    trainer.ema_model = Net()
    trainer.fit()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 4  # three epochs and last (no best: nothing monitored)
    registered = torch.serialization.get_safe_globals()  # what torch itself registers on import
    torch.serialization.clear_safe_globals()
    try:
        assert torch.serialization.get_safe_globals() == []
        for name in names:
            torch.load(tmp_path / name, weights_only=True)
    finally:
        torch.serialization.add_safe_globals(registered)


def test_a_newer_format_version_is_refused(tmp_path):
    path = tmp_path / "future.pth.tar"
    atomic_save({**with_content_hash({"state_dict": Net().state_dict(), "versions": {"hat_ignite": "9.0"}}),
                 FORMAT_KEY: FORMAT_VERSION + 1}, path)
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + rf".*format {FORMAT_VERSION + 1} \(written by hat_ignite 9\.0\), newer"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="newer"):
        load_checkpoint(path, check_hash=False)


def test_config_text_stored_in_a_checkpoint_is_data(tmp_path):
    marker = tmp_path / "marker"
    code = f"open({str(marker)!r}, 'w').write('ran')\nfloat_trainer = dict(type='Trainer')\n"
    path = atomic_save(with_content_hash({"state_dict": Net().state_dict(), "config": code}), tmp_path / "c.pth.tar")
    trainer = make_trainer([])
    resume_from(trainer, path)
    assert load_checkpoint(path)["config"] == code and trainer.checkpoint["config"] == code
    assert not marker.exists()


# -- --resume auto and rotation --------------------------------------------------------------
def _corrupt_in_place(path) -> None:
    """Flip one byte in the middle of the file's largest tensor data (the inode is kept)."""
    data = bytearray(pathlib.Path(path).read_bytes())
    data[len(data) // 2] ^= 0x40
    with open(path, "r+b") as f:
        f.write(data)


def test_resume_auto_skips_a_corrupt_newest_checkpoint_and_says_so(tmp_path, caplog):
    make_trainer([Checkpoint(tmp_path, name_prefix="float-")], num_epochs=3).fit()
    files = list_checkpoints(tmp_path, "float-")
    assert len(files) == 3
    _corrupt_in_place(files[-1])  # "last" is a hard link to it: both are now corrupt
    with caplog.at_level(logging.WARNING, logger="hat_ignite.checkpoint.files"):
        path, checkpoint = latest_valid_checkpoint(tmp_path, "float-")
    assert path == files[1] and checkpoint["epoch"] == 1
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Skipping corrupt checkpoint" in text and "float-checkpoint-last.pth.tar" in text
    assert f"Resuming from {files[1]}" in text
    for p in files[:2]:
        _corrupt_in_place(p)
    with pytest.raises(CheckpointError, match="No valid checkpoint .* all 3 are corrupt"):
        latest_valid_checkpoint(tmp_path, "float-")
    assert latest_valid_checkpoint(tmp_path / "fresh") is None


def test_rotation_keeps_the_resumed_from_file(tmp_path, caplog):
    make_trainer([Checkpoint(tmp_path, save_hash=False)], num_epochs=2).fit()
    resumed_from = tmp_path / "checkpoint-epoch-0000.pth.tar"
    trainer = make_trainer([Checkpoint(tmp_path, save_hash=False, keep_n=1)], num_epochs=4)
    trainer.resume_epoch_or_step = True
    resume_from(trainer, resumed_from)
    with caplog.at_level(logging.INFO, logger="hat_ignite.callbacks.checkpoint"):
        trainer.fit()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-epoch-0000.pth.tar", "checkpoint-epoch-0003.pth.tar",
                                            "checkpoint-last.pth.tar"]
    assert any("the run resumed from it" in r.getMessage() for r in caplog.records)
    load_checkpoint(resumed_from)


def test_rotation_keeps_the_last_checkpoint_with_finite_weights(tmp_path):
    from hat_ignite.callbacks import CallbackMixin

    class PoisonAt(CallbackMixin):
        def on_epoch_end(self, epoch_id, model, **kwargs):
            if epoch_id == 1:
                with torch.no_grad():
                    model.head.weight.fill_(float("nan"))

    make_trainer([PoisonAt(), Checkpoint(tmp_path, keep_n=1)], num_epochs=4, check_finite_loss=False).fit()
    files = list_checkpoints(tmp_path)
    assert [os.path.basename(p)[:22] for p in files] == ["checkpoint-epoch-0000-", "checkpoint-epoch-0003-"]
    finite = load_checkpoint(files[0])["state_dict"]
    assert all(bool(torch.isfinite(t).all()) for t in finite.values())
    assert torch.isnan(load_checkpoint(files[1])["state_dict"]["head.weight"]).all()
