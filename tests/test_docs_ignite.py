"""docs/ignite.md: every python block runs, in order, in one namespace."""

from __future__ import annotations

import re

from conftest import ROOT

DOC = ROOT / "docs" / "ignite.md"


def test_every_code_block_of_docs_ignite_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)  # the blocks write checkpoints and a CSV in the working directory
    namespace: dict = {"__name__": "docs_ignite"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC}:block{i}", "exec"), namespace)
    assert (tmp_path / "profile.csv").exists() and (tmp_path / "hat_ckpts").is_dir()
