"""The ranks of a job are forked from a server with torch imported, and start as spawned ranks would.

Each job here is 2 gloo processes launched from the test's own process by ``launch_distributed``;
each rank runs :func:`rank_start_probe.probe_main`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib

import pytest

from hat_ignite.engine.launcher import launch_distributed
from hat_ignite.engine.rank_start import rank_start_method
from rank_start_probe import probe_main

pytestmark = pytest.mark.skipif(rank_start_method() != "forkserver", reason="this platform spawns its ranks")


def _launch(out: pathlib.Path, value: str, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    out.mkdir()
    monkeypatch.setenv("PROBE_VALUE", value)
    launch_distributed(probe_main, num_processes=2, timeout=60, args=(str(out),))
    return [json.loads((out / f"probe{rank}.json").read_text()) for rank in (0, 1)]


def test_ranks_are_forked_from_one_server_that_has_torch_imported(tmp_path, monkeypatch):
    ranks = _launch(tmp_path / "job", "1", monkeypatch)
    parents = {rank["ppid"] for rank in ranks}
    assert len(parents) == 1 and os.getpid() not in parents  # forked by the server, not this process
    server = pathlib.Path(f"/proc/{parents.pop()}/cmdline").read_bytes().decode(errors="replace")
    assert "multiprocessing.forkserver" in server and "'hat_ignite.engine.rank_start.server_imports'" in server
    assert all(rank["dynamo_imported"] for rank in ranks)  # preloaded, not imported again by the rank
    # the server imported with the collector paused and froze what it imported before forking: a
    # rank starts with those objects frozen (its collections skip them) and its collector on
    assert all(rank["collector_on"] and rank["frozen"] > 100_000 for rank in ranks), ranks


def test_a_rank_starts_with_the_launch_environment_and_sigterm_default_starts_workers_as_this_process_and_runs_atexit(
        tmp_path, monkeypatch):
    first = _launch(tmp_path / "first", "first", monkeypatch)
    # a second job of this process reuses the server, started with the first job's environment
    second = _launch(tmp_path / "second", "second", monkeypatch)
    assert [rank["value"] for rank in first + second] == ["first"] * 2 + ["second"] * 2
    assert {rank["ppid"] for rank in first} == {rank["ppid"] for rank in second}
    for rank in first + second:
        # the server ignores (and blocks) SIGTERM; a rank has the default action, as a spawned one
        assert rank["sigterm_default"] and not rank["sigterm_blocked"], rank
        # its DataLoader workers start as this process's would (fork on Linux), not from a new server
        assert rank["start_method"] == (multiprocessing.get_start_method(allow_none=True)
                                        or multiprocessing.get_all_start_methods()[0])
    for job in ("first", "second"):
        assert [(tmp_path / job / f"atexit{r}.txt").read_text() for r in (0, 1)] == ["ran", "ran"]
