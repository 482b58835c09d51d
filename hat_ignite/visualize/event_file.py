"""Read the scalars of TensorBoard event files (the files the `TensorBoard` callback writes).

An event file is a sequence of TFRecords: an 8-byte little-endian length, a 4-byte masked
CRC-32C of the length, the serialized ``Event`` protocol buffer, and a 4-byte masked CRC-32C of
it. The ``Event`` messages are parsed with the protocol buffer classes tensorboardX ships
(imported when a file is read), so reading needs neither TensorFlow nor the tensorboard package.

A directory is one run, as TensorBoard treats it: all its event files are read in name order
(their names start with the creation time), and a later value for the same tag and step replaces
an earlier one, so a resumed run that writes a new file into the same directory continues its
curves. A purge marker (a ``SessionLog.START`` event at step ``N``: what tensorboardX writes for
``purge_step=N``, and what a resumed run writes) drops the points at step ``N`` and later read
before it, as TensorBoard does: the points a killed run wrote after its last checkpoint give way to
those the resumed run writes. A file whose last record is cut short (the writer is still running, or was killed) is read
up to that record; a record whose checksum does not match is an error naming the file and offset.

>>> import tempfile
>>> from tensorboardX import SummaryWriter
>>> tmp = tempfile.TemporaryDirectory()
>>> with SummaryWriter(tmp.name) as writer:
...     for step in range(3):
...         writer.add_scalar("loss/cls_loss", 1.0 / (step + 1), step)
>>> read_scalars(tmp.name)["loss/cls_loss"]
[(0, 1.0), (1, 0.5), (2, 0.3333333432674408)]
>>> tmp.cleanup()
"""

from __future__ import annotations

import glob
import os
import struct
from typing import Any, Iterator, Union

from hat_ignite.regular_files import open_regular

__all__ = [
    "EVENT_FILE_GLOB", "Scalars", "file_stage", "find_event_dirs", "event_files", "iter_events", "read_scalars",
    "stage_suffix",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Names of event files (as tensorboardX and TensorBoard write them).
EVENT_FILE_GLOB = "events.out.tfevents.*"

#: ``{tag: [(step, value), ...]}`` with steps ascending.
Scalars = dict[str, list[tuple[int, float]]]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


def _masked_crc(data: bytes) -> int:
    from tensorboardX.crc32c import crc32c

    crc = crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def stage_suffix(stage: str | None) -> str:
    """The end of the names of the event files a stage writes (``""`` for no stage).

    ``hat-train`` tells the ``TensorBoard`` callback its stage, and the callback ends its event
    files' names with this, so stages sharing a ``save_dir`` (HAT's ``ckpt_dir/tensorboard``)
    keep their own histories: :func:`read_scalars` with ``stage`` reads that stage's files only.

    >>> stage_suffix("calibration"), stage_suffix(None)
    ('.stage-calibration', '')
    """
    if not stage:
        return ""
    return ".stage-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in str(stage))


def file_stage(path: PathLike) -> str | None:
    """The stage an event file was written for (see :func:`stage_suffix`), or ``None``.

    >>> file_stage("tb/events.out.tfevents.1700000000.host.17000000001.stage-qat")
    'qat'
    >>> file_stage("tb/events.out.tfevents.1700000000.host") is None
    True
    """
    name = os.path.basename(os.fspath(path))
    head, sep, stage = name.rpartition(".stage-")
    return stage if sep and head.startswith("events.out.tfevents.") and stage else None


def event_files(directory: PathLike, stage: str | None = None) -> list[str]:
    """The event files directly inside ``directory``, in name (= creation) order; with ``stage``,
    only the files that stage wrote (see :func:`stage_suffix`)."""
    files = sorted(glob.glob(os.path.join(glob.escape(os.fspath(directory)), EVENT_FILE_GLOB)))
    suffix = stage_suffix(stage)
    return [f for f in files if f.endswith(suffix)] if suffix else files


def find_event_dirs(root: PathLike, stage: str | None = None) -> list[str]:
    """Directories at or under ``root`` that hold event files (of ``stage``, when given), the most
    recently written last.

    >>> find_event_dirs("no/such/dir")
    []
    """
    found: dict[str, float] = {}
    suffix = stage_suffix(stage)
    for directory, _dirs, files in os.walk(os.fspath(root)):
        times = [os.path.getmtime(os.path.join(directory, f)) for f in files
                 if f.startswith("events.out.tfevents.") and f.endswith(suffix)]
        if times:
            found[directory] = max(times)
    return sorted(found, key=lambda d: (found[d], d))


def iter_events(path: PathLike) -> Iterator[Any]:
    """Yield the ``Event`` messages of one event file, in file order.

    Raises:
        ValueError: a record's checksum does not match (the file is corrupt); names the file and
            the byte offset.
    """
    from tensorboardX.proto.event_pb2 import Event

    path = os.fspath(path)
    with open_regular(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, length_crc = _HEADER.unpack_from(data, offset)
        if _masked_crc(data[offset:offset + 8]) != length_crc:
            raise ValueError(
                f"{path} is not a valid event file: the record at byte {offset} has a bad length checksum. "
                f"The file is corrupt or not a TensorBoard event file; delete it or write the run again."
            )
        start = offset + _HEADER.size
        end = start + length
        if end + _FOOTER.size > len(data):  # the last record is still being written, or was cut short
            return
        payload = data[start:end]
        if _masked_crc(payload) != _FOOTER.unpack_from(data, end)[0]:
            raise ValueError(
                f"{path} is corrupt: the record at byte {offset} does not match its checksum. Delete "
                f"the file or write the run again."
            )
        event = Event()
        event.ParseFromString(payload)
        yield event
        offset = end + _FOOTER.size


def _value_of(value: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":  # scalars written as 0-d tensors (TensorFlow 2 style)
        tensor = value.tensor
        for field in ("float_val", "double_val", "int_val", "int64_val"):
            items = getattr(tensor, field)
            if len(items) == 1:
                return float(items[0])
        if tensor.tensor_content and tensor.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE
            fmt = "<f" if tensor.dtype == 1 else "<d"
            if len(tensor.tensor_content) == struct.calcsize(fmt):
                return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None


def _is_purge(event: Any) -> bool:
    """Whether ``event`` is a purge marker: a ``SessionLog.START`` (``purge_step``, a resumed run)."""
    return event.HasField("session_log") and event.session_log.status == 1  # SessionLog.START


def _purge(series: dict[str, dict[int, float]], step: int) -> None:
    """Drop the points at ``step`` and later read so far, as TensorBoard does at a purge marker."""
    for points in series.values():
        for old in [s for s in points if s >= step]:
            del points[old]


def read_scalars(path: PathLike, stage: str | None = None) -> Scalars:
    """The scalar series in an event file, or in all event files of a directory (one run).

    Args:
        path: an event file, or a directory holding event files.
        stage: read only the directory's files of this ``hat-train`` stage (see
            :func:`stage_suffix`); ``None``: all of them.

    Returns:
        ``{tag: [(step, value), ...]}``, steps ascending, one value per step (the latest written).

    Raises:
        FileNotFoundError: ``path`` does not exist, or the directory holds no event file.
        ValueError: an event file is corrupt (see :func:`iter_events`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        files = event_files(path, stage)
        if not files:
            of_stage = f" of stage {stage!r} (*{stage_suffix(stage)})" if stage else ""
            raise FileNotFoundError(
                f"{os.path.abspath(path)} holds no TensorBoard event file{of_stage} ({EVENT_FILE_GLOB}). Give the "
                f"TensorBoard callback's save_dir, or add TensorBoard(save_dir=...) to the trainer's callbacks."
            )
    elif os.path.isfile(path):
        files = [path]
    else:
        raise FileNotFoundError(f"{os.path.abspath(path)} does not exist; give an event file or its directory.")
    series: dict[str, dict[int, float]] = {}
    for file in files:
        for event in iter_events(file):
            if _is_purge(event):
                _purge(series, int(event.step))
                continue
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _value_of(value)
                if number is not None:
                    series.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: sorted(points.items()) for tag, points in sorted(series.items()) if points}
