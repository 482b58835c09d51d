"""TensorBoard: event files written during real digits training, read back tag by tag and step by step."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader

from hat_ignite.callbacks import CallbackMixin, MetricUpdater, StatsMonitor, TensorBoard, Validation
from hat_ignite.data.digits import DigitsDataset
from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index
from hat_ignite.metrics import Accuracy, LossShow
from hat_ignite.models.mlp import MLPClassifier
from hat_ignite.visualize.event_file import event_files, read_scalars
from conftest import time_limit

STEPS_PER_EPOCH = 23  # 1437 training digits, batch size 64


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """The event files' scalars, through tensorboard's own reader where it is installed."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return read_scalars(directory)
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class RecordLosses(CallbackMixin):
    """The loss of every step, as the batch processor saw it."""

    def __init__(self):
        self.losses: dict[int, float] = {}

    def on_batch_end(self, model_outs, global_step_id, **kwargs):
        self.losses[global_step_id] = float(model_outs[0]["cls_loss"].detach())


def _update_train(metrics, batch, model_outs):
    losses, logits = model_outs
    metrics[0].update(losses)
    metrics[1].update(batch["labels"], logits)


def _update_val(metrics, batch, model_outs):
    metrics[0].update(batch["labels"], model_outs)


def _trainer(board: TensorBoard, num_epochs: int = 2, lr: float = 0.1, after: tuple = ()) -> tuple[Trainer, RecordLosses]:
    torch.manual_seed(0)
    model = MLPClassifier(in_features=64, hidden_features=32, num_classes=10)
    train = DataLoader(DigitsDataset("train"), batch_size=64, shuffle=True)
    val = DataLoader(DigitsDataset("val"), batch_size=256)
    recorder = RecordLosses()
    validation = Validation(
        data_loader=val, batch_processor=BasicBatchProcessor(need_grad_update=False),
        callbacks=[MetricUpdater(_update_val, step_log_freq=0, epoch_log_freq=0)], log_interval=0,
    )
    trainer = Trainer(
        model=model, data_loader=train, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
        batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
        device=None, num_epochs=num_epochs,
        callbacks=[StatsMonitor(log_freq=0), recorder,
                   MetricUpdater(_update_train, step_log_freq=0, epoch_log_freq=0, storage_key="train_obj"),
                   validation, board, *after],
        train_metrics=[LossShow(), Accuracy()], val_metrics=[Accuracy()],
    )
    return trainer, recorder


def test_step_mode_writes_every_update_freq_steps_and_each_validation(tmp_path):
    trainer, recorder = _trainer(TensorBoard(str(tmp_path / "tb"), update_freq=4))
    storage = trainer.fit().storage
    assert len(event_files(tmp_path / "tb")) == 1
    scalars = _scalars(tmp_path / "tb")
    steps = [s for s in range(2 * STEPS_PER_EPOCH) if s % 4 == 0]  # as HAT: the first step, then every 4th
    assert len(steps) == -(-(2 * STEPS_PER_EPOCH) // 4) == 12
    for tag in ("loss/cls_loss", "lr/group_0", "train/cls_loss", "train/accuracy"):
        assert [s for s, _ in scalars[tag]] == steps, tag
    for step, value in scalars["loss/cls_loss"]:  # the step's own loss (float32 in the file)
        assert value == pytest.approx(recorder.losses[step], rel=1e-6)
    assert all(v == pytest.approx(0.1) for _, v in scalars["lr/group_0"])
    # one point per validation, at the steps done when it ran, with the validation's value
    assert [s for s, _ in scalars["val/accuracy"]] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert scalars["val/accuracy"][-1][1] == pytest.approx(storage["validation"]["results"]["monitor_obj"]["accuracy"], rel=1e-6)
    assert scalars["val/accuracy"][-1][1] > 0.8
    # StatsMonitor logs at each epoch end: its figures follow
    assert [s for s, _ in scalars["stats/epoch_time"]] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert {t.split("/")[0] for t in scalars} == {"loss", "lr", "train", "val", "stats"}


def test_epoch_mode_writes_the_epoch_mean_loss_and_custom_functions(tmp_path):
    seen_kwargs = []

    def hat_style(writer, model_outs, step_id):  # HAT's tb_update_funcs signature
        writer.add_scalar("custom/logit_mean", float(model_outs[1].detach().mean()), step_id)

    def with_kwargs(writer, step_id, **kwargs):
        seen_kwargs.append(sorted(kwargs))

    board = TensorBoard(str(tmp_path / "tb"), update_by="epoch", update_freq=1, tb_update_funcs=[hat_style, with_kwargs])
    trainer, recorder = _trainer(board, num_epochs=3)
    trainer.fit()
    scalars = _scalars(tmp_path / "tb")
    ends = [STEPS_PER_EPOCH * (e + 1) for e in range(3)]
    assert [s for s, _ in scalars["loss/cls_loss"]] == ends
    for epoch, (_, value) in enumerate(scalars["loss/cls_loss"]):
        in_epoch = [recorder.losses[s] for s in range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH)]
        assert value == pytest.approx(sum(in_epoch) / len(in_epoch), rel=1e-5)
    assert [s for s, _ in scalars["custom/logit_mean"]] == ends
    assert len(seen_kwargs) == 3 and {"epoch_id", "storage", "model_outs", "loop"} <= set(seen_kwargs[0])


def test_overwrite_replaces_old_event_files_and_append_merges_them(tmp_path):
    save_dir = tmp_path / "tb"
    save_dir.mkdir()
    (save_dir / "notes.txt").write_text("kept")
    for _ in range(2):
        _trainer(TensorBoard(str(save_dir), update_freq=23), num_epochs=1)[0].fit()
    assert len(event_files(save_dir)) == 2  # overwrite=False: one file per run
    assert [s for s, _ in read_scalars(save_dir)["loss/cls_loss"]] == [0]  # same steps: the later run's value
    _trainer(TensorBoard(str(save_dir), overwrite=True, update_freq=23), num_epochs=1)[0].fit()
    assert len(event_files(save_dir)) == 1
    assert (save_dir / "notes.txt").read_text() == "kept"  # only event files are removed
    assert os.path.isfile(save_dir / "notes.txt")


@pytest.mark.parametrize("kwargs, message", [
    (dict(update_by="iter"), "update_by must be 'step' or 'epoch'"),
    (dict(update_freq=0), "update_freq must be an integer >= 1"),
    (dict(loss_name_reg="(loss"), "is not a valid regex"),
    (dict(tb_update_funcs=["not a function"]), "tb_update_funcs[0] is a str"),
    (dict(logdir="elsewhere"), "pass the directory as save_dir"),
])
def test_bad_arguments_name_the_argument(tmp_path, kwargs, message):
    with pytest.raises((ValueError, TypeError)) as info:
        TensorBoard(str(tmp_path), **kwargs)
    assert message in str(info.value)


def test_importing_the_callbacks_does_not_import_tensorboardx():
    import subprocess
    import sys

    code = "import sys, hat_ignite.callbacks, hat_ignite.visualize; print('tensorboardX' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_event_records_are_checksummed_by_the_c_crc32c():
    # tensorboardX falls back to a pure-Python CRC (tens of µs per record, milliseconds per image)
    # when the crc32c package is missing; it is a dependency of the project
    from tensorboardX import crc32c as tb_crc

    assert tb_crc._crc32c_native is not None
    assert tb_crc.crc32c(b"123456789") == 0xE3069283  # CRC-32C's standard check value


def _events_of(path) -> list:
    from hat_ignite.visualize.event_file import iter_events

    return list(iter_events(path))  # checks every record's checksums


def test_step_scalars_are_in_the_file_at_once_and_flushed_after_flush_secs(tmp_path):
    from hat_ignite.callbacks.tensorboard_scalars import StepScalars

    scalars = StepScalars(str(tmp_path), flush_secs=0.0)  # every write reaches the disk
    try:
        for step in range(3):
            scalars.add("loss/cls", float(step), step)
            scalars.add("lr/group_0", 0.5, step)
            scalars.write()
        # written on the spot and flushed, while the file is still open
        assert read_scalars(str(tmp_path)) == {
            "loss/cls": [(0, 0.0), (1, 1.0), (2, 2.0)], "lr/group_0": [(0, 0.5), (1, 0.5), (2, 0.5)],
        }
    finally:
        scalars.close()
    (path,) = event_files(tmp_path)
    events = _events_of(path)
    assert events[0].file_version == "brain.Event:2"
    assert [len(e.summary.value) for e in events[1:]] == [2, 2, 2]  # one event per step


def test_step_scalars_keep_points_in_the_buffer_until_flush_secs_or_flush(tmp_path):
    from hat_ignite.callbacks.tensorboard_scalars import StepScalars

    scalars = StepScalars(str(tmp_path), flush_secs=3600.0)
    scalars.add("loss", 1.0, 0)
    scalars.write()
    assert read_scalars(str(tmp_path)) == {}  # in the file's buffer, not yet on disk
    scalars.add("loss", 2.0, 1)
    scalars.flush()
    assert read_scalars(str(tmp_path)) == {"loss": [(0, 1.0), (1, 2.0)]}
    scalars.close()


def test_step_scalars_write_nothing_once_closed(tmp_path):
    from hat_ignite.callbacks.tensorboard_scalars import StepScalars

    scalars = StepScalars(str(tmp_path))
    scalars.add("loss", 1.0, 0)
    scalars.close()
    scalars.add("loss", 2.0, 1)
    scalars.flush()  # no error, and the closed file is left as it was
    scalars.close()
    assert scalars.closed and read_scalars(str(tmp_path)) == {"loss": [(0, 1.0)]}


def test_the_default_callback_makes_no_summary_writer(tmp_path, monkeypatch):
    import tensorboardX

    def refuse(*args, **kwargs):
        raise AssertionError("a SummaryWriter was made")

    monkeypatch.setattr(tensorboardX, "SummaryWriter", refuse)
    board = TensorBoard(str(tmp_path / "tb"), update_freq=4)
    trainer, _ = _trainer(board, num_epochs=1)
    trainer.fit()
    assert board.writer is None and board.writer_if_made is None  # outside a run: none, and none made
    assert len(event_files(tmp_path / "tb")) == 1
    assert [s for s, _ in read_scalars(tmp_path / "tb")["loss/cls_loss"]] == [0, 4, 8, 12, 16, 20]


def test_a_summary_writer_is_made_for_functions_that_take_it(tmp_path):
    made = []

    def no_writer(step_id, model_outs):  # takes no writer: none is made for it
        made.append(("no_writer", step_id))

    def images(writer, step_id):
        made.append(("images", type(writer).__name__))
        writer.add_scalar("custom/step", float(step_id), step_id)

    for funcs, files in (([no_writer], 1), ([no_writer, images], 2)):
        save_dir = tmp_path / str(files)
        board = TensorBoard(str(save_dir), update_freq=23, tb_update_funcs=funcs)
        _trainer(board, num_epochs=1)[0].fit()
        names = event_files(save_dir)
        assert len(names) == files  # the scalars file, then the SummaryWriter's: name order is creation order
        assert [s for s, _ in read_scalars(names[0])["loss/cls_loss"]] == [0]
    assert ("images", "SummaryWriter") in made
    assert read_scalars(tmp_path / "2")["custom/step"] == [(0, 0.0)]


@pytest.mark.parametrize("writer_kwargs", [{"purge_step": 5}, {"write_to_disk": False}])
def test_purge_step_and_write_to_disk_apply_to_the_scalars_file(tmp_path, writer_kwargs):
    save_dir = tmp_path / "tb"
    _trainer(TensorBoard(str(save_dir), update_freq=1), num_epochs=1)[0].fit()  # steps 0..22
    _trainer(TensorBoard(str(save_dir), update_freq=22, **writer_kwargs), num_epochs=1)[0].fit()  # steps 0, 22
    if writer_kwargs.get("write_to_disk") is False:
        assert len(event_files(save_dir)) == 1  # nothing written
        return
    first, second = event_files(save_dir)
    assert [e.step for e in _events_of(second) if e.HasField("session_log")] == [5]  # the marker comes first
    assert [s for s, _ in read_scalars(save_dir)["loss/cls_loss"]] == [0, 1, 2, 3, 4, 22]


def test_the_epoch_end_points_are_on_disk_before_the_next_epoch_begins(tmp_path):
    # the validation point is handed over at the epoch's end, just before its flush: a kill in the
    # next epoch must not lose it. Read the file while the run goes on.
    save_dir = tmp_path / "tb"
    seen = {}

    class ReadBack(CallbackMixin):
        def on_epoch_begin(self, epoch_id, **kwargs):
            if epoch_id:
                seen[epoch_id] = read_scalars(save_dir)

    _trainer(TensorBoard(str(save_dir), update_freq=23), num_epochs=3, after=(ReadBack(),))[0].fit()
    for epoch in (1, 2):
        ends = [STEPS_PER_EPOCH * e for e in range(1, epoch + 1)]
        assert [s for s, _ in seen[epoch]["val/accuracy"]] == ends
        assert [s for s, _ in seen[epoch]["stats/epoch_time"]] == ends
        assert [s for s, _ in seen[epoch]["loss/cls_loss"]] == [e - STEPS_PER_EPOCH for e in ends]


def test_points_written_before_a_crash_are_in_the_file(tmp_path):
    # a run that dies with an exception (the process exits with it) keeps every point written
    # before it: the event file is flushed when the interpreter exits
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import torch
        from hat_ignite.callbacks import CallbackMixin, TensorBoard
        from hat_ignite.engine import BasicBatchProcessor, Trainer, collect_loss_by_index

        class Boom(CallbackMixin):
            def on_step_begin(self, global_step_id, **kwargs):
                if global_step_id == 7:
                    raise RuntimeError("boom at step 7")

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 3)
            def forward(self, x, y):
                logits = self.fc(x)
                return {{"cls_loss": torch.nn.functional.cross_entropy(logits, y)}}, logits

        torch.manual_seed(0)
        model = Net()
        batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(20)]
        Trainer(model=model, data_loader=batches, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=collect_loss_by_index(0)),
                device=None, num_epochs=1, callbacks=[Boom(), TensorBoard({str(tmp_path)!r}, update_freq=1)]).fit()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=time_limit(120))
    assert out.returncode != 0 and "boom at step 7" in out.stderr
    scalars = read_scalars(str(tmp_path))
    assert [step for step, _ in scalars["loss/cls_loss"]] == list(range(7))
    assert [step for step, _ in scalars["lr/group_0"]] == list(range(7))
