"""Crafted ``.pt2`` files: a real int8 program with one place changed so that torch would run code.

Each attack rewrites a real archive entry by entry with torch's own writer
(``torch.export.pt2_archive.PT2ArchiveWriter``), as an attacker would, and plants a payload that
creates a marker file when torch unpickles or evaluates it (``touch MARKER``). ``ATTACKS`` maps a
name to ``(change, entry)``: the function changing the entries, and the entry a refusal must name.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Callable

from torch.export.pt2_archive import PT2ArchiveReader, PT2ArchiveWriter


class RunsCommand:
    """Unpickles to ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


Entries = dict[str, bytes]


def read_entries(path: str) -> Entries:
    with PT2ArchiveReader(path) as reader:
        return {name: reader.read_bytes(name) for name in reader.get_file_names()}


def write_entries(entries: Entries, path: str) -> None:
    with PT2ArchiveWriter(path) as writer:
        for name, data in entries.items():
            if not name.startswith(".data/"):  # the writer adds its own
                writer.write_bytes(name, data)


def _payload(marker: str) -> bytes:
    return pickle.dumps(RunsCommand(f"touch {marker}"), protocol=2)


def _json_entry(entries: Entries, name: str, change: Callable[[dict], None]) -> None:
    document = json.loads(entries[name])
    change(document)
    entries[name] = json.dumps(document).encode()


def pickled_weight(entries: Entries, marker: str) -> None:
    config = json.loads(entries["data/weights/model_weights_config.json"])
    fqn = sorted(config["config"])[0]
    config["config"][fqn]["use_pickle"] = True
    entries["data/weights/model_weights_config.json"] = json.dumps(config).encode()
    entries["data/weights/" + config["config"][fqn]["path_name"]] = _payload(marker)


def _pickled_constant(entries: Entries, marker: str, fqn: str, path_name: str) -> None:
    def add(config: dict) -> None:
        config["config"][fqn] = {"path_name": path_name, "is_param": False, "use_pickle": True, "tensor_meta": None}
    _json_entry(entries, "data/constants/model_constants_config.json", add)
    entries["data/constants/" + path_name] = _payload(marker)


def pickled_constant(entries: Entries, marker: str) -> None:
    _pickled_constant(entries, marker, "extra_constant", "tensor_0")


def opaque_constant(entries: Entries, marker: str) -> None:
    _pickled_constant(entries, marker, "extra_object", "opaque_obj_0")


def legacy_weights(entries: Entries, marker: str) -> None:
    entries["data/weights/model.pt"] = _payload(marker)


def sample_inputs(entries: Entries, marker: str) -> None:
    entries["data/sample_inputs/model.pt"] = _payload(marker)


def symbolic_size(entries: Entries, marker: str) -> None:
    """The first symbolic size evaluates to the same symbol, after running a command."""
    text = entries["models/model.json"].decode()
    symbol = "Symbol('s0', positive=True, integer=True)"
    assert symbol in text
    evil = f"__import__('os').system('touch {marker}') or {symbol}"
    entries["models/model.json"] = text.replace(json.dumps(symbol), json.dumps(evil), 1).encode()


def input_guard(entries: Entries, marker: str) -> None:
    def add(program: dict) -> None:
        program["guards_code"] = [f"__import__('os').system('touch {marker}') == 0"]
    _json_entry(entries, "models/model.json", add)


def native_code(entries: Entries, marker: str) -> None:
    entries["data/aotinductor/model/model.so"] = b"\x7fELF not really"


#: name -> (how to craft it, the entry a refusal names)
ATTACKS: dict[str, tuple[Callable[[Entries, str], None], str]] = {
    "pickled_weight": (pickled_weight, "data/weights/weight_"),
    "pickled_constant": (pickled_constant, "data/constants/tensor_0"),
    "opaque_constant": (opaque_constant, "data/constants/opaque_obj_0"),
    "legacy_weights": (legacy_weights, "data/weights/model.pt"),
    "sample_inputs": (sample_inputs, "data/sample_inputs/model.pt"),
    "symbolic_size": (symbolic_size, "models/model.json"),
    "input_guard": (input_guard, "models/model.json"),
    "native_code": (native_code, "data/aotinductor/model/model.so"),
}


def craft(source: str, attack: str, path: str, marker: str) -> str:
    """Write ``source`` with ``attack`` applied to ``path``; return ``path``."""
    entries = read_entries(source)
    ATTACKS[attack][0](entries, marker)
    write_entries(entries, path)
    return path
