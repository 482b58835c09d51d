"""Write failures of a run's files (a full or read-only disk): name the file, leave nothing half-written.

A full disk makes ``write()`` or ``flush()`` fail with ``OSError: [Errno 28] No space left on
device`` (``EFBIG`` past a file-size limit, ``EROFS`` on a read-only mount) and the error names no
file when it comes from a buffered stream. :func:`failed_file` finds the file from the failing
call's frames; :func:`close_event_writers` closes the event files of a failed run so that
nothing (tensorboardX's exit hook included) fails again on the same file at exit; :class:`LogFile`, the run's
log file, reports its first failed write once instead of a logging error per record.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from types import TracebackType
from typing import Any

__all__ = ["failed_file", "close_event_writers", "write_error_text", "LogFile", "log_file_failures"]

logger = logging.getLogger("hat_ignite.cli")

_PATH_ATTRS = ("baseFilename", "path")  # logging handlers, tensorboardX's RecordWriter ...
_STREAM_ATTRS = ("_writer", "stream", "_file", "fileobj")


def _file_path(value: Any) -> str | None:
    if isinstance(value, str) and value and os.path.isfile(value):
        return os.path.abspath(value)
    return None


def _path_of(obj: Any) -> str | None:
    """The file an object writing a file holds (a file object, a handler, a writer with ``path``)."""
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return None
    if isinstance(obj, io.IOBase):
        return _file_path(getattr(obj, "name", None))
    for attr in _PATH_ATTRS:
        found = _file_path(getattr(obj, attr, None))
        if found is not None:
            return found
    for attr in _STREAM_ATTRS:
        stream = getattr(obj, attr, None)
        if isinstance(stream, io.IOBase):
            found = _file_path(getattr(stream, "name", None))
            if found is not None:
                return found
    return None


def _frames(tb: TracebackType | None) -> list[Any]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def failed_file(exc: BaseException) -> str | None:
    """The file a failed write was writing, from the exception or the frames it passed through.

    The innermost frame whose ``self`` is a file object or holds one (or a file path), or
    which has a file object in a local variable, names it; ``None`` when none does. Causes and contexts are searched too.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "out.txt")
    >>> try:
    ...     with open(path, "w") as f:
    ...         raise OSError(28, "No space left on device")
    ... except OSError as exc:
    ...     failed_file(exc) == path
    True
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and isinstance(exc.filename, str):
            return os.path.abspath(exc.filename)
        for frame in reversed(_frames(exc.__traceback__)):
            local = frame.f_locals
            path = _path_of(local.get("self"))  # a handler, a writer ... whose method failed
            for value in local.values():  # or a file object the frame was writing
                if path is None and isinstance(value, io.IOBase):
                    path = _path_of(value)
            if path is not None:
                return path
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def write_error_text(exc: BaseException) -> str:
    """``exc`` as one line, with the file it failed to write when it is an ``OSError`` naming none.

    >>> write_error_text(OSError(28, "No space left on device"))
    'OSError: [Errno 28] No space left on device'
    """
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and not exc.filename:
        path = failed_file(exc)
        if path is not None:
            text += f" (writing {path})"
    return text


def close_event_writers(trainer: Any) -> None:
    """Close the event files of ``trainer``'s callbacks, quietly, after the run failed.

    The ``TensorBoard`` callback's files are closed through its public ``close()``: a scalars file
    that cannot take its last points (a full disk) is closed all the same and retried by nothing.
    A tensorboardX ``SummaryWriter`` (one a ``tb_update_funcs`` function made, or another
    callback's ``writer``) that fails to close is marked closed (see :func:`_give_up_writer`).
    """
    from hat_ignite.callbacks.tensorboard import TensorBoard

    for cb in getattr(trainer, "callbacks", None) or []:
        if isinstance(cb, TensorBoard):
            writer = cb.writer_if_made  # never cb.writer: that would make a SummaryWriter now
            try:
                cb.close()
            except (OSError, ValueError) as exc:
                logger.debug("closing the event files of %s failed: %s", cb, exc)
                if writer is not None:
                    _give_up_writer(writer)
            continue
        writer = getattr(cb, "writer", None)
        if writer is None or getattr(writer, "file_writer", None) is None:
            continue
        try:
            writer.close()
        except (OSError, ValueError) as exc:
            logger.debug("closing the TensorBoard writer of %s failed: %s", type(cb).__name__, exc)
            _give_up_writer(writer)
        cb.writer = None


def _give_up_writer(writer: Any) -> None:
    """Stop a tensorboardX ``SummaryWriter`` whose ``close()`` failed, so its exit hook does nothing.

    tensorboardX registers an exit hook per writer that flushes its file again unless the
    writer's ``EventFileWriter`` is closed, and its ``close()`` sets the flag only after a
    successful flush: on a full disk the hook would print a traceback at exit. tensorboardX has no
    public way to drop a file's unwritable events, so this reaches into its private ``_worker``
    (the logger thread, stopped) and ``_closed``. Only user-made ``SummaryWriter`` objects get
    here: the callback's own scalars go through a public ``EventsWriter`` and close publicly.
    """
    event_writer = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    if event_writer is None:
        return
    stop = getattr(getattr(event_writer, "_worker", None), "stop", None)
    if callable(stop):
        try:
            stop()
        except Exception:  # pragma: no cover - the worker thread is gone already
            pass
    if hasattr(event_writer, "_closed"):
        event_writer._closed = True  # tensorboardX's exit hook skips a closed writer


class LogFile(logging.FileHandler):
    """The run's log file; a failed write (a full disk) is reported once, on stderr, naming the file.

    After the first failure the file is no longer written (the console log goes on) and
    :func:`log_file_failures` lists it, so that the command ends with a non-zero exit code
    instead of printing a logging error for every record.
    """

    failures: list[str] = []  # "path: reason" of every log file that failed in this process

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        reason = (exc.strerror or str(exc)) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, OSError):  # a record that cannot be formatted: logging's own report
            super().handleError(record)
            return
        LogFile.failures.append(f"{self.baseFilename}: {reason}")
        print(f"error: cannot write the log file {self.baseFilename}: {reason}. It is no longer written; the "
              f"log goes on on the console only.", file=sys.stderr, flush=True)
        self._drop()

    def _drop(self) -> None:
        """Stop writing: detach the handler; what is still buffered goes to the null device."""
        logging.getLogger().removeHandler(self)
        stream, self.stream = self.stream, None
        if stream is None:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, stream.fileno())  # closing the stream then flushes into nothing, quietly
            finally:
                os.close(null)
            stream.close()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        try:
            super().close()
        except (OSError, ValueError) as exc:
            LogFile.failures.append(f"{self.baseFilename}: {getattr(exc, 'strerror', None) or exc}")
            print(f"error: cannot write the end of the log file {self.baseFilename}: "
                  f"{getattr(exc, 'strerror', None) or exc}.", file=sys.stderr, flush=True)


def log_file_failures() -> list[str]:
    """The log files that could not be written in this process (``"path: reason"``), and forget them."""
    failed, LogFile.failures = LogFile.failures, []
    return failed
