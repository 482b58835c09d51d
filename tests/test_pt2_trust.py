"""``.pt2`` files we load never run code and are verified: crafted archives, bit flips, foreign files.

The int8 file is real: the digits MLP's network calibrated on two batches, converted with
``QAT2Quantize`` and saved with ``save_quantized_model``. Crafted files change one place of it
(see :mod:`pt2_attacks`); a control shows that ``torch.export.load`` alone runs each payload.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import pathlib
import textwrap
import zipfile
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from hat_ignite.callbacks.checkpoint_state import LoadCheckpoint
from hat_ignite.data import DigitsDataset
from hat_ignite.errors import CheckpointError
from hat_ignite.models import MLPClassifier
from hat_ignite.pt2 import load_program
from hat_ignite.pt2.archive import RECORD_ENTRY, inspect_archive
from hat_ignite.quantization import Float2Calibration, QAT2Quantize, load_quantized_model, observing, save_quantized_model
from hat_ignite.quantization.io import file_sha256
from hat_ignite.registry import build_from_cfg

from conftest import run_tool
from pt2_attacks import ATTACKS, craft, read_entries, write_entries


@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    """A real int8 ``.pt2``, a batch and the loaded program's output on it."""
    torch.manual_seed(0)
    loader = DataLoader(DigitsDataset(split="train"), batch_size=64, shuffle=True)
    model = Float2Calibration(example_data_loader=loader, modules=["net"])(MLPClassifier(hidden_features=16)).eval()
    with torch.no_grad(), observing(model):
        for _, batch in zip(range(2), loader):
            model(batch)
    batch = {"img": next(iter(DataLoader(DigitsDataset(split="val"), batch_size=64)))["img"]}  # what the program takes
    path = save_quantized_model(QAT2Quantize()(model), tmp_path_factory.mktemp("int8") / "int8.pt2", batch)
    with torch.no_grad():
        reference = load_program(path).module()(batch)
    return pathlib.Path(path), batch, reference


LOADERS = {
    "load_quantized_model": load_quantized_model,
    "load_program": load_program,
    "config": lambda path: build_from_cfg(dict(type="load_quantized_model", path=path)),
    "LoadCheckpoint": lambda path: LoadCheckpoint(path)(nn.Linear(2, 2)),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_crafted_pt2_is_refused_by_every_loader_before_anything_in_it_runs(int8_file, tmp_path, attack):
    source, batch, _ = int8_file
    marker = tmp_path / "marker"
    path = craft(str(source), attack, str(tmp_path / "crafted.pt2"), str(marker))
    for name, load in LOADERS.items():
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert path in message, (name, message)
        if name == "LoadCheckpoint":  # a program is no checkpoint of weights: it names what to use instead
            assert "torch.export program" in message and 'dict(type="load_quantized_model"' in message, message
        else:
            assert f"its entry {ATTACKS[attack][1]}" in message and "save_quantized_model" in message, message
            assert "never load this one with torch.export.load" in message, message
        assert not marker.exists(), name
    if attack == "native_code":  # nothing to run in the control: the library is not a real one
        return
    with contextlib.suppress(Exception):  # the control: torch alone runs the payload
        torch.export.load(path).module()(batch)
    assert marker.exists()


def test_hat_predict_refuses_a_crafted_int8_model_in_its_config(int8_file, tmp_path):
    source, _, _ = int8_file
    marker = tmp_path / "marker"
    path = craft(str(source), "pickled_weight", str(tmp_path / "crafted.pt2"), str(marker))
    config = tmp_path / "cfg.py"
    config.write_text(textwrap.dedent(f"""
        float_predictor = dict(
            type="Predictor", model=dict(type="load_quantized_model", path={path!r}),
            data_loader=dict(type="torch.utils.data.DataLoader", dataset=dict(type="DigitsDataset", split="val"),
                             batch_size=120),
            batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False), device=None,
        )
    """))
    out = run_tool("hat-predict", config, "--stage", "float", "--work-dir", tmp_path / "work", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"Refusing to load {path}: its entry data/weights/weight_" in out.stderr, out.stderr[-3000:]
    assert "is pickled (use_pickle: true" in out.stderr
    assert not marker.exists()


def _data_start(data: bytes, entry: str) -> int:
    """Offset in the file of the first byte of ``entry``'s content (stored, uncompressed)."""
    archive = zipfile.ZipFile(io.BytesIO(data))
    info = next(i for i in archive.infolist() if i.filename.endswith("/" + entry))
    header = data[info.header_offset:info.header_offset + 30]
    name_length, extra_length = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    return info.header_offset + 30 + name_length + extra_length


def test_bit_flips_anywhere_in_an_int8_file_are_refused_or_change_nothing(int8_file, tmp_path):
    source, batch, reference = int8_file
    data = source.read_bytes()
    original = inspect_archive(data, str(source)).content_sha256
    path = tmp_path / "flipped.pt2"
    offsets = list(range(3, len(data), max(1, len(data) // 240)))  # every entry, header and the zip directory
    outcome: Counter = Counter()
    for i, offset in enumerate(offsets):
        flipped = bytearray(data)
        flipped[offset] ^= 1 << (i % 8)
        path.write_bytes(flipped)
        try:
            program = load_program(path)
        except CheckpointError as exc:
            assert str(path) in str(exc)
            outcome["refused"] += 1
            continue
        # accepted: the bytes torch read are the original's, so the program is the same
        assert inspect_archive(bytes(flipped), str(path)).content_sha256 == original, offset
        with torch.no_grad():
            assert torch.equal(program.module()(batch), reference), offset
        outcome["unchanged"] += 1
    assert sum(outcome.values()) == len(offsets) >= 200
    assert outcome["refused"] > outcome["unchanged"] > 0, outcome  # some flips land in unused zip fields

    # the record is what catches a flip in the int8 weights: torch alone loads other weights silently
    config = json.loads(read_entries(str(source))["data/weights/model_weights_config.json"])["config"]
    int8 = [meta["path_name"] for meta in config.values() if meta["tensor_meta"]["dtype"] == 2]  # ScalarType.CHAR
    weights = "data/weights/" + int8[0]
    flipped = bytearray(data)
    flipped[_data_start(data, weights) + 5] ^= 0x40
    path.write_bytes(flipped)
    plain = torch.export.load(io.BytesIO(bytes(flipped)))
    assert any(not torch.equal(plain.state_dict[k], v) for k, v in load_program(source).state_dict.items())
    with pytest.raises(CheckpointError, match=rf"{path} is corrupt: its content hashes to .* was recorded when it "
                                              r"was written.*write it again \(hat-predict CONFIG --stage int_infer"):
        load_program(path)


def test_a_pt2_without_a_recorded_hash_is_checked_and_loads_with_a_warning(int8_file, tmp_path, caplog):
    source, batch, reference = int8_file
    foreign = tmp_path / "foreign.pt2"
    entries = read_entries(str(source))
    del entries[RECORD_ENTRY]
    write_entries(entries, str(foreign))
    with caplog.at_level(logging.WARNING, logger="hat_ignite.pt2"):
        program = load_program(foreign)
    assert f"{foreign} records no content hash" in caplog.text and "holds no pickled objects or code" in caplog.text
    with torch.no_grad():
        assert torch.equal(program.module()(batch), reference)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hat_ignite.pt2"):
        load_program(foreign, sha256=file_sha256(foreign))  # the hash its source publishes
    assert caplog.text == ""
    with pytest.raises(CheckpointError, match=rf"{foreign} is not the file expected: its SHA-256 is"):
        load_program(foreign, sha256="0" * 64)
    marker = tmp_path / "marker"  # without a record, the checks still refuse what would run code
    craft(str(foreign), "symbolic_size", str(tmp_path / "crafted.pt2"), str(marker))
    with pytest.raises(CheckpointError, match="sympy.sympify"):
        load_program(tmp_path / "crafted.pt2")
    assert not marker.exists()


def test_the_int8_file_records_the_content_hash_of_every_other_entry(int8_file):
    source, _, _ = int8_file
    inspected = inspect_archive(source.read_bytes(), str(source))
    assert inspected.record is not None and inspected.record["format"] == 1
    assert inspected.record["content_sha256"] == inspected.content_sha256
