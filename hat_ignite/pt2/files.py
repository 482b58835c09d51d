"""Writing and loading ``.pt2`` files: a content hash inside each file, checked on every load.

:func:`program_bytes` serializes a program with :func:`torch.export.save` and stores hat-ignite's
record in it (the extra file ``hat_ignite.json``: the format and the content hash of every other
entry). :func:`save_program` writes those bytes crash-safely, after removing what an interrupted
earlier write of the same file left. :func:`load_program` reads the file once into memory,
checks it (:func:`~hat_ignite.pt2.archive.inspect_archive`: nothing pickled, no code), compares
the content with the recorded hash, and only then gives the same bytes to
:func:`torch.export.load`.

A ``.pt2`` written elsewhere carries no record: it is still checked for pickles and code, and
loads with a warning that its integrity cannot be checked, unless the caller gives the SHA-256
of the whole file (``sha256=``), which must then match.

>>> import tempfile, torch
>>> tmp = tempfile.TemporaryDirectory()
>>> program = torch.export.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
>>> path = save_program(program, f"{tmp.name}/linear.pt2")
>>> load_program(path).module()(torch.ones(1, 3)).shape
torch.Size([1, 2])
>>> tmp.cleanup()
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from typing import Any, Optional, Union

import torch

from hat_ignite.errors import CheckpointError
from hat_ignite.pt2.archive import FORMAT, RECORD_ENTRY, RECORD_NAME, content_digest, inspect_archive
from hat_ignite.regular_files import NotRegularFileError, open_regular

__all__ = ["program_bytes", "save_program", "load_program", "remove_stale_temp_files"]

logger = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]

_REWRITE = "write it again (hat-predict CONFIG --stage int_infer for the int8 model) or copy it again"


def program_bytes(program: torch.export.ExportedProgram) -> bytes:
    """The ``.pt2`` bytes of ``program`` with hat-ignite's record (format, content hash) inside.

    Raises:
        CheckpointError: torch would write the program in a form :func:`load_program` refuses
            (a pickled tensor subclass, a custom object); names the entry.
    """
    from hat_ignite import __version__
    from torch.export.pt2_archive import PT2ArchiveReader

    first = io.BytesIO()
    torch.export.save(program, first)
    with PT2ArchiveReader(io.BytesIO(first.getvalue())) as reader:
        digest = content_digest((name, reader.read_bytes(name)) for name in reader.get_file_names())
    record = {"format": FORMAT, "content_sha256": digest, "hat_ignite": __version__}
    final = io.BytesIO()
    torch.export.save(program, final, extra_files={RECORD_NAME: json.dumps(record)})
    data = final.getvalue()
    try:
        inspected = inspect_archive(data, "the program being saved")
    except CheckpointError as exc:
        raise CheckpointError(f"Cannot save this program as a .pt2 that hat-ignite loads: {exc}") from exc
    if inspected.content_sha256 != digest:  # torch.export.save wrote the same program differently
        raise CheckpointError("Cannot save this program: torch.export.save wrote it differently twice, so its content "
                              "hash cannot be recorded. Report this with your torch version.")
    return data


def _temp_pattern(path: str) -> re.Pattern[str]:
    # atomic_write's ".<name>.<hex>.tmp", and the ".<name>.<random>.tmp.pt2" of earlier releases
    return re.compile(r"\." + re.escape(os.path.basename(path)) + r"\.[A-Za-z0-9_]+\.tmp(\.pt2)?")


def remove_stale_temp_files(path: PathLike) -> list[str]:
    """Remove the temporary files an interrupted write of ``path`` left beside it; return them.

    A write goes to a hidden temporary file that is renamed over ``path`` when complete; a
    process killed in between leaves that file behind. Only one process writes a given
    ``.pt2`` at a time (the work dir's lock), so at the next write any such file is stale.

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> _ = open(f"{tmp.name}/.m.pt2.1a2b3c4d.tmp", "w"), open(f"{tmp.name}/m.pt2", "w")
    >>> [os.path.basename(p) for p in remove_stale_temp_files(f"{tmp.name}/m.pt2")], os.listdir(tmp.name)
    (['.m.pt2.1a2b3c4d.tmp'], ['m.pt2'])
    >>> tmp.cleanup()
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    pattern = _temp_pattern(path)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    removed = []
    for name in names:
        if pattern.fullmatch(name):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                continue
            removed.append(os.path.join(directory, name))
    if removed:
        logger.warning("Removed %d temporary file(s) of an interrupted write of %s: %s", len(removed), path,
                       ", ".join(os.path.basename(p) for p in removed))
    return removed


def save_program(program: torch.export.ExportedProgram, path: PathLike) -> str:
    """Write ``program`` to ``path`` (its directory is created) with its content hash inside.

    The write is crash-safe: a temporary file beside ``path``, fsync'ed and renamed over it.

    Returns:
        The absolute path written.

    Raises:
        CheckpointError: the program cannot be saved in a loadable form, or the file cannot
            be written; names the path.
    """
    from hat_ignite.checkpoint.atomic import atomic_write

    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = program_bytes(program)
    remove_stale_temp_files(path)
    return atomic_write(path, lambda f: f.write(data))


def _read(path: str) -> bytes:
    if not os.path.exists(path):
        raise CheckpointError(
            f"{path} does not exist. An int8 model is written by the int_infer stage (hat-predict CONFIG "
            f"--stage int_infer) or by save_quantized_model()."
        )
    try:
        with open_regular(path, "rb") as f:
            data = f.read()
    except NotRegularFileError as exc:
        raise CheckpointError(f"Cannot load {path}: {exc}. Give the path of a .pt2 file.") from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read {path}: {exc}.") from exc
    if not data:
        raise CheckpointError(f"Cannot load {path}: the file is empty (0 bytes), so the write that created it never "
                              f"finished (a crash or a full disk); {_REWRITE}.")
    return data


def _verify(path: str, data: bytes, digest: str, record: Optional[Any], sha256: Optional[str]) -> None:
    if sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256.lower():
            raise CheckpointError(f"{path} is not the file expected: its SHA-256 is {actual}, but {sha256} was given. "
                                  f"It was changed or damaged on disk or in transfer; {_REWRITE}.")
    if record is None:
        if sha256 is None:
            logger.warning(
                "%s records no content hash (it was not written by hat-ignite): it holds no pickled objects or code "
                "(checked), but a damaged copy cannot be told from the original. Give load_quantized_model(path, "
                "sha256=...) the SHA-256 its source publishes, or save it again with hat_ignite.pt2.save_program to "
                "record one.", path,
            )
        return
    fmt = record.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > FORMAT:
        raise CheckpointError(f"Cannot load {path}: its {RECORD_ENTRY} has format {fmt!r}; this hat-ignite reads "
                              f"format {FORMAT}. Upgrade hat-ignite, or {_REWRITE}.")
    if record.get("content_sha256") != digest:
        raise CheckpointError(
            f"{path} is corrupt: its content hashes to {digest}, but {record.get('content_sha256')!r} was recorded "
            f"when it was written, so some bytes changed on disk or in transfer; {_REWRITE}."
        )


def load_program(path: PathLike, sha256: Optional[str] = None) -> torch.export.ExportedProgram:
    """Load a ``.pt2`` program after checking that nothing in it runs code and that it is intact.

    Args:
        path: the ``.pt2`` file.
        sha256: the expected SHA-256 (hex) of the whole file, e.g. from ``lineage.json`` or the
            file's source; checked in addition to the hash the file records.

    Raises:
        CheckpointError: the file is missing, empty, not a torch.export archive, holds pickled
            entries or code, or its content (or whole bytes) does not match the recorded (or
            given) hash; names the path and, for a refused entry, the entry.
    """
    path = os.path.abspath(os.fspath(path))
    data = _read(path)
    inspected = inspect_archive(data, path)
    _verify(path, data, inspected.content_sha256, inspected.record, sha256)
    try:
        return torch.export.load(io.BytesIO(data))
    except Exception as exc:  # torch raises many types for archives it cannot deserialize
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise CheckpointError(
            f"Cannot load {path}: torch.export.load failed ({type(exc).__name__}: {first}). The program uses "
            f"operators or a format this torch does not have (check that the torch version that wrote it, "
            f"and torchao for int8 models, are installed), or the file is damaged; {_REWRITE}."
        ) from exc
