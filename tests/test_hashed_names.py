"""``get_hash_file_if_hashed_and_local(check_hash=True)`` checks the hash in every form of checkpoint name.

A name's hash is either the file's SHA-256 (HAT's ``generate_sha256_file`` names every file so:
``float-checkpoint-best-1d3765fc.pth.tar``) or, for a checkpoint hat-ignite wrote, its verified
content hash (what hat-ignite names its periodic files after). Whatever the form of the name
(``best``, ``last``, periodic, with or without a prefix), a right hash resolves and a wrong one
is refused with both hashes named. Each file here is real: a checkpoint written by a training run
of hat-ignite's ``Checkpoint``, and a plain ``state_dict`` file as HAT saves one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

import pytest
import torch

from hat_ignite.callbacks.checkpoint import Checkpoint
from hat_ignite.callbacks.checkpoint_io import HASH_KEY, load_checkpoint
from hat_ignite.engine import BasicBatchProcessor, Trainer
from hat_ignite.hat_utils import get_hash_file_if_hashed_and_local

#: the stems of the names: hat-ignite's best and last, a prefixed best / last / periodic name, HAT's epoch name
FORMS = ["checkpoint-best", "checkpoint-last", "float-checkpoint-best", "float-checkpoint-last",
         "float-checkpoint-step-3", "float-checkpoint-epoch-0026"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, bytes]:
    """The bytes of a checkpoint hat-ignite's ``Checkpoint`` wrote during training, and of a plain
    ``state_dict`` file as HAT saves one (no content hash inside)."""
    tmp = tmp_path_factory.mktemp("written")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    data = [(torch.randn(4, 2),)] * 2
    Trainer(model=model, data_loader=data, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), device=None,
            batch_processor=BasicBatchProcessor(need_grad_update=True, loss_collector=lambda out: [out.sum()]),
            num_epochs=1, callbacks=[Checkpoint(str(tmp), interval_by="step")]).fit()
    (periodic,) = [p for p in tmp.iterdir() if p.name.startswith("checkpoint-step-1-")]
    torch.save({"state_dict": model.state_dict(), "epoch": 26}, tmp / "hat.pth.tar")
    return {"hat_ignite": periodic.read_bytes(), "hat": (tmp / "hat.pth.tar").read_bytes()}


def hashes(path) -> tuple[str, str | None]:
    """The file's SHA-256 and, for a hat-ignite checkpoint, its verified content hash."""
    recorded = load_checkpoint(path).get(HASH_KEY)
    return hashlib.sha256(path.read_bytes()).hexdigest(), recorded


def wrong_hash(*right: str | None) -> str:
    """Eight hex digits that start none of ``right``."""
    return next(h for h in ("00000000", "11111111", "22222222") if not any(r and r.startswith(h) for r in right))


@pytest.mark.parametrize("given", ["name without hash", "hashed name"])
@pytest.mark.parametrize("form", FORMS)
def test_a_hat_ignite_checkpoint_resolves_under_its_content_hash_or_file_hash_and_is_refused_under_another(
        saved, tmp_path, form, given):
    probe = tmp_path / "probe.pth.tar"
    probe.write_bytes(saved["hat_ignite"])
    sha, content = hashes(probe)
    assert not sha.startswith(content[:8])  # the two hashes differ: each is a right one

    def resolve(named: str) -> str:
        for stale in tmp_path.glob(f"{form}-*"):
            stale.unlink()
        path = tmp_path / f"{form}-{named}.pth.tar"
        path.write_bytes(saved["hat_ignite"])
        asked = tmp_path / (f"{form}.pth.tar" if given == "name without hash" else path.name)
        assert get_hash_file_if_hashed_and_local(str(asked)) == str(path)
        return str(path)

    resolve(content[:8])  # hat-ignite's name for it
    resolve(sha[:8])  # HAT's generate_sha256_file's name for it
    wrong = wrong_hash(sha, content)
    with pytest.raises(ValueError) as refused:
        resolve(wrong)
    message = str(refused.value)
    assert f"{tmp_path / form}-{wrong}.pth.tar does not match the hash in its name" in message
    assert f"the name carries {wrong!r}, its SHA-256 starts with {sha[:8]!r}" in message
    assert f"content hash (what hat-ignite names checkpoints after) with {content[:8]!r}" in message
    # check_hash=False takes the file as it is, as HAT's does
    named = tmp_path / f"{form}-{wrong}.pth.tar"
    assert get_hash_file_if_hashed_and_local(str(named), check_hash=False) == str(named)


@pytest.mark.parametrize("form", FORMS)
def test_a_hat_checkpoint_resolves_under_its_file_hash_and_is_refused_under_another(saved, tmp_path, form):
    sha = hashlib.sha256(saved["hat"]).hexdigest()
    good = tmp_path / f"{form}-{sha[:8]}.pth.tar"
    good.write_bytes(saved["hat"])
    assert get_hash_file_if_hashed_and_local(str(tmp_path / f"{form}.pth.tar")) == str(good)
    assert get_hash_file_if_hashed_and_local(str(good)) == str(good)
    good.unlink()
    wrong = wrong_hash(sha)
    bad = tmp_path / f"{form}-{wrong}.pth.tar"
    bad.write_bytes(saved["hat"])
    for asked in (tmp_path / f"{form}.pth.tar", bad):
        with pytest.raises(ValueError, match=re.escape(
                f"{bad} does not match the hash in its name: the name carries {wrong!r}, its SHA-256 starts "
                f"with {sha[:8]!r}. The file is damaged")):
            get_hash_file_if_hashed_and_local(str(asked))


def test_a_damaged_hat_ignite_checkpoint_is_refused_under_its_content_hash(saved, tmp_path):
    """The content hash in the name is only taken once the content verifies against it."""
    probe = tmp_path / "probe.pth.tar"
    probe.write_bytes(saved["hat_ignite"])
    _, content = hashes(probe)
    data = bytearray(saved["hat_ignite"])
    data[len(data) // 2] ^= 0xFF
    damaged = tmp_path / f"float-checkpoint-best-{content[:8]}.pth.tar"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"the name carries {content[:8]!r}, its SHA-256 starts with '[0-9a-f]{{8}}'\\. "):
        get_hash_file_if_hashed_and_local(str(tmp_path / "float-checkpoint-best.pth.tar"))


def test_a_name_resolves_only_to_files_that_start_with_it(saved, tmp_path, caplog):
    """``checkpoint-best.pth.tar`` is not another stage's ``float-checkpoint-best-<hash>.pth.tar``, and
    the 8-digit counter of a periodic name without a hash is not taken for a hash."""
    sha = hashlib.sha256(saved["hat"]).hexdigest()
    (tmp_path / f"float-checkpoint-best-{sha[:8]}.pth.tar").write_bytes(saved["hat"])
    with pytest.raises(ValueError, match="checkpoint-best.pth.tar does not exist, nor a hashed file"):
        get_hash_file_if_hashed_and_local(str(tmp_path / "checkpoint-best.pth.tar"))
    counter = tmp_path / "checkpoint-step-12345678.pth.tar"
    counter.write_bytes(saved["hat"])
    with caplog.at_level(logging.WARNING, logger="hat_ignite.hat_utils"):
        assert get_hash_file_if_hashed_and_local(str(counter)) == str(counter)
    assert f"{counter} has no hash in its name" in caplog.text
    assert os.path.exists(counter)
