"""What a ``.pt2`` archive may hold, checked entry by entry before torch reads any of it.

:func:`torch.export.load` runs code from the file in several places: a weight or constant
marked ``use_pickle`` in the payload configs is unpickled with ``weights_only=False``, as are
``opaque_obj_*`` constants (``pickle.loads``) and the pre-2.8 ``data/weights/model.pt`` /
``data/constants/model.pt`` payloads; the sample inputs are unpickled with
``weights_only=False`` when a weights-only load of them fails; ``custom_obj_*`` constants go
through TorchScript's unpickler; ``data/aotinductor/`` holds native libraries that are loaded
and run; every ``models/*.json`` is deserialized, with the code strings of
:mod:`~hat_ignite.pt2.code_strings` in it. :func:`inspect_archive` reads the archive with the
same reader torch uses (:class:`torch.export.pt2_archive.PT2ArchiveReader`) from the bytes in
memory, so what it checks is exactly what torch will read, and accepts only what
``torch.export.save`` writes for a program of plain tensors:

========================================  ==================================================
entry                                     checked
========================================  ==================================================
``archive_format``, ``archive_version``,  torch's own markers
``byteorder``, ``.data/*``
``models/model.json``                     the one program; its code strings (see above)
``data/weights/weight_N``,                raw tensor bytes, each named by the config
``data/constants/tensor_N``
``data/*/model_*_config.json``            no entry with ``use_pickle: true``
``data/sample_inputs/model.pt``           loads with ``torch.load(weights_only=True)``
``extra/*``                               plain text (torch reads it as a string)
========================================  ==================================================

Anything else is refused naming the entry. The same pass computes the archive's content hash
(:func:`content_digest`: every entry's name and bytes but the per-write
``.data/serialization_id`` and the hash record itself), which hat-ignite stores inside each
``.pt2`` it writes (:data:`RECORD_ENTRY`).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import attrs
import torch
from torch.export.pt2_archive import PT2ArchiveReader
from torch.export.pt2_archive import constants as pt2

from hat_ignite.errors import CheckpointError
from hat_ignite.pt2.code_strings import GUARD, SYMPY, expression_problem, treespec_problem

__all__ = ["RECORD_NAME", "RECORD_ENTRY", "FORMAT", "Inspected", "inspect_archive", "content_digest"]

#: The extra file (``extra/<name>``) holding hat-ignite's record of a ``.pt2`` it wrote.
RECORD_NAME = "hat_ignite.json"
RECORD_ENTRY = pt2.EXTRA_DIR + RECORD_NAME
#: Version of that record's layout.
FORMAT = 1

_MODEL = "model"
_PROGRAM = pt2.MODELS_FILENAME_FORMAT.format(_MODEL)
_WEIGHTS_CONFIG = pt2.WEIGHTS_CONFIG_FILENAME_FORMAT.format(_MODEL)
_CONSTANTS_CONFIG = pt2.CONSTANTS_CONFIG_FILENAME_FORMAT.format(_MODEL)
_SAMPLE_INPUTS = pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(_MODEL)
_SERIALIZATION_ID = ".data/serialization_id"
_MARKERS = {pt2.ARCHIVE_FORMAT_PATH, pt2.ARCHIVE_VERSION_PATH, "byteorder", ".data/version", _SERIALIZATION_ID}
_PAYLOADS = {
    _WEIGHTS_CONFIG: (pt2.WEIGHTS_DIR, re.compile(re.escape(pt2.WEIGHT_FILENAME_PREFIX) + r"\d+")),
    _CONSTANTS_CONFIG: (pt2.CONSTANTS_DIR, re.compile(re.escape(pt2.TENSOR_CONSTANT_FILENAME_PREFIX) + r"\d+")),
}
_READ_WHOLE = {_PROGRAM, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG, _SAMPLE_INPUTS, RECORD_ENTRY}

#: What torch would do with entries hat-ignite refuses, by name prefix.
_REFUSED = (
    (pt2.AOTINDUCTOR_DIR, "compiled native code (AOTInductor), which torch loads and runs"),
    (pt2.EXECUTORCH_DIR, "an ExecuTorch payload"),
    (pt2.MTIA_DIR, "an MTIA payload"),
    (pt2.XL_MODEL_WEIGHTS_DIR, "externally stored weights"),
    (pt2.CONSTANTS_DIR + pt2.CUSTOM_OBJ_FILENAME_PREFIX, "a pickled TorchScript object, which torch unpickles"),
    (pt2.CONSTANTS_DIR + pt2.OPAQUE_OBJ_FILENAME_PREFIX, "a pickled Python object, which torch unpickles"),
    (f"{pt2.WEIGHTS_DIR}{_MODEL}.pt", "pickled weights (an older torch layout), which torch unpickles"),
    (f"{pt2.CONSTANTS_DIR}{_MODEL}.pt", "pickled constants (an older torch layout), which torch unpickles"),
    (pt2.MODELS_DIR, "a second program, which torch would deserialize too"),
)

_RESAVE = (
    "hat-ignite loads only programs of plain tensors and no code. If you trust the file's source, "
    "export the model again where it was made and save it with hat_ignite.quantization.save_quantized_model "
    "(or hat_ignite.pt2.save_program), which writes such files; never load this one with torch.export.load, "
    "which would run what it holds."
)


@attrs.frozen
class Inspected:
    """What :func:`inspect_archive` found.

    Attributes:
        content_sha256: the hash of the archive's content (:func:`content_digest`).
        record: hat-ignite's record from :data:`RECORD_ENTRY` (``None``: the file has none).
    """

    content_sha256: str
    record: Optional[Mapping[str, Any]]


def _refuse(path: str, entry: str, what: str) -> CheckpointError:
    return CheckpointError(f"Refusing to load {path}: its entry {entry} {what}. {_RESAVE}")


def _entry_problem(name: str) -> Optional[str]:
    """Why ``name`` may not be in an archive we load, or ``None`` when it may."""
    if name in _MARKERS or name in _READ_WHOLE or name.startswith(pt2.EXTRA_DIR):
        return None
    for directory, pattern in _PAYLOADS.values():
        if name.startswith(directory) and pattern.fullmatch(name[len(directory):]):
            return None
    for prefix, what in _REFUSED:
        if name.startswith(prefix):
            return f"is {what}"
    return "is not one torch.export.save writes for a program"


def content_digest(entries: Iterator[tuple[str, bytes]]) -> str:
    """SHA-256 (hex) of ``(name, bytes)`` entries in name order, without the per-write ones.

    >>> a = content_digest(iter([("models/model.json", b"{}"), (".data/serialization_id", b"1")]))
    >>> a == content_digest(iter([(".data/serialization_id", b"2"), ("models/model.json", b"{}")]))
    True
    """
    h = hashlib.sha256()
    for name, data in sorted(entries):
        if name in (_SERIALIZATION_ID, RECORD_ENTRY):
            continue
        h.update(f"{len(name)}:{name}{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _read_entries(reader: PT2ArchiveReader, names: list[str], kept: dict[str, bytes]) -> Iterator[tuple[str, bytes]]:
    """Yield every entry once; keep the small ones :func:`inspect_archive` reads whole."""
    for name in names:
        data = reader.read_bytes(name)
        if name in _READ_WHOLE:
            kept[name] = data
        yield name, data


def _json(path: str, name: str, data: Optional[bytes]) -> Any:
    if data is None:
        raise CheckpointError(f"Cannot load {path}: it has no {name}, so it is not a complete torch.export archive. "
                              f"Write it again (hat-predict CONFIG --stage int_infer, or save_quantized_model).")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"Cannot load {path}: its entry {name} is not valid JSON ({exc}). The file is corrupt; "
                              f"write it again or copy it again.") from exc


def _check_payload_config(path: str, name: str, config: Any, names: set[str]) -> None:
    directory, pattern = _PAYLOADS[name]
    entries = config.get("config") if isinstance(config, Mapping) else None
    if not isinstance(entries, Mapping):
        raise _refuse(path, name, "is not a payload config (no 'config' mapping)")
    for fqn, meta in entries.items():
        if not isinstance(meta, Mapping):
            raise _refuse(path, name, f"describes {fqn!r} with {meta!r}")
        stored = meta.get("path_name")
        where = f"{directory}{stored}" if isinstance(stored, str) else repr(stored)
        if meta.get("use_pickle") is not False:
            raise _refuse(path, where, f"({fqn}) is pickled (use_pickle: {json.dumps(meta.get('use_pickle'))} in "
                                       f"{name}), and torch unpickles it with weights_only=False, running any code it holds")
        if not isinstance(stored, str) or not pattern.fullmatch(stored) or where not in names:
            raise _refuse(path, name, f"points {fqn} at {where}, which is not a tensor entry of the archive")
        if not isinstance(meta.get("tensor_meta"), Mapping):
            raise _refuse(path, name, f"gives {fqn} no tensor_meta")


def _check_sample_inputs(path: str, data: Optional[bytes]) -> None:
    """torch unpickles the sample inputs without restrictions when a weights-only load fails."""
    if not data:
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # torch raises many types; any failure makes torch unpickle freely
        from hat_ignite.checkpoint.loading import refused_global

        refused = refused_global(exc)
        what = f"the global {refused}" if refused else f"{type(exc).__name__}"
        raise _refuse(path, _SAMPLE_INPUTS, f"is a pickle that a weights-only load refuses ({what}); torch would then "
                                            f"unpickle it with weights_only=False") from exc


def _walk(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """Every ``(key path, key, value)`` of a JSON document, without recursion."""
    pending = [(node, where)]
    while pending:
        value, at = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in items:
            path = f"{at}.{key}" if isinstance(key, str) else f"{at}[{key}]"
            yield path, str(key), child
            pending.append((child, path))


def _check_program(path: str, program: Any) -> None:
    if not isinstance(program, Mapping):
        raise _refuse(path, _PROGRAM, "is not a serialized program")
    for i, guard in enumerate(program.get("guards_code") or []):
        problem = expression_problem(guard, GUARD)
        if problem:
            raise _refuse(path, _PROGRAM, f"has an input guard (guards_code[{i}], which torch compiles with exec) that "
                                          f"{problem}: {str(guard)[:120]!r}")
    checked: dict[str, Optional[str]] = {}  # the same size expression recurs on many tensors
    for at, key, value in _walk(program, "model"):
        if key == "expr_str":
            if not isinstance(value, str) or value not in checked:
                problem = expression_problem(value, SYMPY)
                if isinstance(value, str):
                    checked[value] = problem
            else:
                problem = checked[value]
            kind = "a symbolic size (which torch evaluates with sympy.sympify)"
        elif key in ("in_spec", "out_spec") and isinstance(value, str):
            problem, kind = treespec_problem(value), "a pytree spec"
        else:
            continue
        if problem:
            raise _refuse(path, _PROGRAM, f"has {kind} at {at} that {problem}: {str(value)[:120]!r}")


def _check_zip_view(path: str, data: bytes) -> None:
    """The entry names Python's zip reader sees: torch falls back to an older, pickled layout
    when an archive has a top-level ``version`` entry."""
    try:
        listed = zipfile.ZipFile(io.BytesIO(data)).namelist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return  # torch's fallback reads the archive with this same reader: it would fail too
    twice = sorted({name for name in listed if listed.count(name) > 1})
    if "version" in listed:
        raise _refuse(path, "version", "belongs to the pickled layout of torch 2.7 and earlier, which torch would "
                                       "fall back to")
    if twice:
        raise _refuse(path, twice[0], "is in the archive twice, so two readers may see different files")


def inspect_archive(data: bytes, path: str) -> Inspected:
    """Check the bytes of a ``.pt2`` file without running anything in it; hash its content.

    Args:
        data: the whole file.
        path: its path, for messages.

    Raises:
        CheckpointError: the bytes are not a torch.export archive, or hold an entry or a code
            string torch would run; names ``path`` and the entry.
    """
    try:
        reader = PT2ArchiveReader(io.BytesIO(data))
        names = list(reader.get_file_names())
    except Exception as exc:  # torch's reader raises RuntimeError/AssertionError for what it cannot read
        raise CheckpointError(
            f"Cannot load {path}: it is not a torch.export archive ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}). The file is truncated (an "
            f"interrupted write or copy), damaged, or of another kind; write it again or copy it again."
        ) from exc
    _check_zip_view(path, data)
    for name in names:
        problem = _entry_problem(name)
        if problem:
            raise _refuse(path, name, problem)
    kept: dict[str, bytes] = {}
    try:
        digest = content_digest(_read_entries(reader, names, kept))
    except Exception as exc:  # a damaged entry: torch's reader checks sizes and checksums
        raise CheckpointError(f"Cannot load {path}: an entry cannot be read ({type(exc).__name__}: "
                              f"{str(exc).strip()[:200]}). The file is damaged; write it again or copy it again.") from exc
    for config in _PAYLOADS:
        _check_payload_config(path, config, _json(path, config, kept.get(config)), set(names))
    _check_sample_inputs(path, kept.get(_SAMPLE_INPUTS))
    _check_program(path, _json(path, _PROGRAM, kept.get(_PROGRAM)))
    record = _json(path, RECORD_ENTRY, kept[RECORD_ENTRY]) if RECORD_ENTRY in kept else None
    if record is not None and not isinstance(record, Mapping):
        raise CheckpointError(f"Cannot load {path}: its entry {RECORD_ENTRY} is not hat-ignite's record. The file "
                              f"was altered; write it again.")
    return Inspected(content_sha256=digest, record=record)
