"""One run at a time in a work dir: the lock file ``<work_dir>/.hat-ignite.lock``.

Two runs writing into one work dir mix their checkpoints, logs and event files, and one run's
checkpoint rotation deletes the other's files. ``hat-train`` and ``hat-predict`` therefore take
the work dir's lock before they write anything into it and hold it until they end. The lock is
an exclusive ``flock`` on the lock file (the kernel drops it when the holder dies, however it
dies); the file names the holder's process id, host and command, so a refused run can say who
holds it. A lock file left by a process that is gone (same host, no such process) is taken over
with a warning. In a multi-process run rank 0 takes the lock for the whole job.

A lock is never held by a child process. ``flock`` belongs to the open file, which a ``fork``
shares with the child (close-on-exec only acts on ``exec``, and data-loader workers are forked
without one): a worker stuck in a dataset that outlived its run would keep the work dir locked,
and the next run would be refused naming the dead main process. So every child closes its copy
of the lock's file descriptor right after the fork (``os.register_at_fork``); subprocesses
started with ``exec`` get it closed by close-on-exec.

>>> import tempfile
>>> work = tempfile.mkdtemp()
>>> lock = WorkDirLock(work, "hat-train cfg.py")
>>> lock.acquire()
>>> holder = read_holder(os.path.join(work, LOCK_FILE))
>>> holder["pid"] == os.getpid(), holder["command"]
(True, 'hat-train cfg.py')
>>> lock.release(); os.path.exists(os.path.join(work, LOCK_FILE))
False
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import time
import weakref
from typing import Any

from hat_ignite.errors import HatIgniteError
from hat_ignite.regular_files import NotRegularFileError, open_regular

__all__ = [
    "LOCK_FILE", "WorkDirBusyError", "WorkDirLock", "read_holder", "held_by_another_run", "hold_work_dir",
    "release_held_locks",
]

logger = logging.getLogger("hat_ignite.cli")

#: The lock file's name inside the work dir.
LOCK_FILE = ".hat-ignite.lock"

try:  # pragma: no branch
    import fcntl
except ImportError:  # pragma: no cover - Windows: the pid check alone
    fcntl = None  # type: ignore[assignment]


class WorkDirBusyError(HatIgniteError):
    """Another run holds the work dir's lock."""


def read_holder(path: str) -> dict[str, Any]:
    """The holder recorded in a lock file (``{}`` when it is empty or unreadable)."""
    try:
        with open_regular(path) as f:  # a FIFO in its place must not block the run
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    when = f", started {started}" if started else ""
    return f"process {holder.get('pid')} on host {holder.get('host')} ({holder.get('command') or '?'}{when})"


_OPEN_LOCKS: weakref.WeakSet[WorkDirLock] = weakref.WeakSet()  # locks holding a descriptor in this process
_FORK_HOOK: list[bool] = []  # whether the after-fork hook is registered


def _close_in_child() -> None:
    """After a fork, in the child: close the inherited lock descriptors (the parent keeps its lock)."""
    for lock in list(_OPEN_LOCKS):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    _OPEN_LOCKS.clear()


def _track(lock: WorkDirLock) -> None:
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_close_in_child)
        _FORK_HOOK.append(True)
    _OPEN_LOCKS.add(lock)


class WorkDirLock:
    """The exclusive lock of one work dir, held by one run.

    Args:
        work_dir: the work dir (it must exist).
        command: the command line, recorded for the message a refused run prints.
    """

    def __init__(self, work_dir: str, command: str) -> None:
        self.path = os.path.join(os.path.abspath(work_dir), LOCK_FILE)
        self.command = command
        self._fd: int | None = None
        self._flocked = fcntl is not None  # False where the file system has no flock: pid check only

    def acquire(self) -> None:
        """Take the lock, or raise :class:`WorkDirBusyError` naming the run that holds it.

        Raises:
            WorkDirBusyError: another live run holds it; names its process id, host and command.
            OSError: the lock file cannot be written (a read-only or full work dir); the
                message names the file.
        """
        for _ in range(20):  # another run may remove the file between our open and our lock
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot create the work dir lock {self.path}: {exc.strerror}") from exc
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise WorkDirBusyError(f"the work dir lock {NotRegularFileError(self.path, mode)}.")
            if not self._lock(fd):
                os.close(fd)
                raise self._busy(read_holder(self.path))
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:
                os.close(fd)
                continue
            try:
                self._take(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            _track(self)
            return
        raise WorkDirBusyError(f"could not take the work dir lock {self.path}: it keeps being replaced.")

    def _lock(self, fd: int) -> bool:
        if fcntl is None:  # pragma: no cover
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):  # no flock here: pid check only
                self._flocked = False
                return True
            raise
        return True

    def _take(self, fd: int) -> None:
        """Check what the file records, then record this process in it."""
        holder = read_holder(self.path)
        host = socket.gethostname()
        pid = holder.get("pid")
        if holder and pid != os.getpid():
            if holder.get("host") != host:
                raise self._busy(holder, other_host=True)
            if isinstance(pid, int) and _alive(pid) and not self._flocked:  # pragma: no cover
                raise self._busy(holder)
            logger.warning(
                "Taking over the work dir lock %s left by %s: that process is gone.", self.path, _describe(holder),
            )
        record = {
            "pid": os.getpid(), "host": host, "command": self.command,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        data = (json.dumps(record) + "\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write the work dir lock {self.path}: {exc.strerror}") from exc

    def _busy(self, holder: dict[str, Any], other_host: bool = False) -> WorkDirBusyError:
        work_dir = os.path.dirname(self.path)
        who = _describe(holder) if holder else "another process (it has not written its name yet)"
        if other_host:
            how = (f"If that run is over, delete {self.path} (a process on another host cannot be checked "
                   f"from here); otherwise pass another --work-dir.")
        elif isinstance(holder.get("pid"), int) and holder.get("host") == socket.gethostname() and not _alive(holder["pid"]):
            how = (f"That process is gone, yet another process still holds the lock: one it started that "
                   f"inherited the lock (a version of hat-ignite before the lock was closed in child processes "
                   f"let data-loader workers keep it). `fuser -v {self.path}` names it; end it, or pass "
                   f"another --work-dir.")
        else:
            how = "Wait for it to finish, stop it, or pass another --work-dir."
        return WorkDirBusyError(
            f"work dir {work_dir} is in use by {who}: two runs in one work dir would overwrite each "
            f"other's checkpoints, logs and event files. {how}"
        )

    def release(self) -> None:
        """Remove the lock file and drop the lock (no-op when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if read_holder(self.path).get("pid") == os.getpid():
                os.remove(self.path)
        except OSError as exc:
            logger.warning("could not remove the work dir lock %s: %s", self.path, exc)
        finally:
            os.close(fd)

    def __enter__(self) -> WorkDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def held_by_another_run(work_dir: str) -> bool:
    """Whether a run other than this process holds (or may hold) ``work_dir``'s lock.

    True when the lock file names a live process on this host other than this one, a process on
    another host (which cannot be checked from here), or is not a regular file; never takes the
    lock itself, so it cannot make a starting run see the dir as busy.
    """
    path = os.path.join(os.path.abspath(work_dir), LOCK_FILE)
    if not os.path.lexists(path):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return True  # a dangling link or an unreadable entry: not ours to judge
    if not stat.S_ISREG(mode):
        return True
    holder = read_holder(path)
    pid = holder.get("pid")
    if not holder or pid == os.getpid():
        return bool(not holder and os.path.getsize(path))  # an unreadable record: assume a holder
    if holder.get("host") != socket.gethostname():
        return True
    return isinstance(pid, int) and _alive(pid)


_HELD: list[WorkDirLock] = []  # the locks this process took with hold_work_dir, released at its end


def hold_work_dir(work_dir: str, command: str) -> WorkDirLock:
    """Take ``work_dir``'s lock for the rest of the command; :func:`release_held_locks` drops it.

    Raises:
        WorkDirBusyError: another run holds it (see :meth:`WorkDirLock.acquire`).
    """
    lock = WorkDirLock(work_dir, command)
    lock.acquire()
    _HELD.append(lock)
    return lock


def release_held_locks() -> None:
    """Release every lock taken with :func:`hold_work_dir` (the command's end, however it ends)."""
    while _HELD:
        _HELD.pop().release()
