"""pytest's ``--file-progress``: one line per test file as the run goes, instead of a line of dots.

``scripts/test.sh`` (and so ``.ci/run``) runs the suite with it, so a long run shows where it is:

    [ 12%   0:38] tests/test_registry.py: 26 passed (14.1 s)

(the share of the collected tests done, the time since the tests began, the file, its results and
its own time: from its first test's start to its last test's end). A file's line is printed once
all its tests are done, so it works alike when pytest-xdist runs the files in several worker
processes (``-n``): their results come back interleaved, and each file is printed when it is
complete. A failing test still prints its ``F`` or ``E`` at once, and the usual summary follows
the run. Without ``-q`` pytest's own per-file lines are used and the option does nothing.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections import Counter
from typing import Any

import pytest


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class _File:
    """One test file's progress: tests expected and done, their results, when it started."""

    __slots__ = ("expected", "done", "outcomes", "started")

    def __init__(self) -> None:
        self.expected = 0
        self.done = 0
        self.outcomes: Counter[str] = Counter()
        self.started: float | None = None


class FileProgress:
    """Prints a line each time the tests of a file are done (see the module docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self.files: dict[str, _File] = {}  # in collection order

    def _collected(self, nodeids: list[str]) -> None:
        self.total = len(nodeids)
        self.files = {}
        for nodeid in nodeids:
            self.files.setdefault(_file_of(nodeid), _File()).expected += 1
        self.started = time.monotonic()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items:  # under pytest-xdist the workers collect: see the hook below
            self._collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.files:  # every worker collects the same tests
            self._collected(list(ids))

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            return "passed", "", ""  # counted in the summary, no dot: the file's line says it
        return None

    def _file(self, nodeid: str) -> _File:
        return self.files.setdefault(_file_of(nodeid), _File())

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        file = self._file(nodeid)
        if file.started is None:
            file.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        file = self._file(report.nodeid)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            file.outcomes["xfailed" if hasattr(report, "wasxfail") else report.outcome] += 1
            self.done += 1
        elif report.when == "teardown":
            if report.failed:
                file.outcomes["error"] += 1
            file.done += 1  # a test is done once its teardown is
            if file.done == file.expected:
                self._print(_file_of(report.nodeid), file)

    def pytest_sessionfinish(self) -> None:
        for name, file in self.files.items():  # files a stop (-x, Ctrl-C) left unfinished
            if file.started is not None and file.done < file.expected:
                self._print(name, file)

    def _print(self, name: str, file: _File) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        now = time.monotonic()
        elapsed = int(now - self.started)
        share = 100 * self.done // self.total if self.total else 100
        results = ", ".join(f"{n} {outcome}" for outcome, n in file.outcomes.items()) or "no tests"
        own = now - (file.started if file.started is not None else now)
        reporter.write_line(f"[{share:3d}% {elapsed // 60:3d}:{elapsed % 60:02d}] {name}: {results} ({own:.1f} s)")


#: The test files that take longest (each over 14 s in the parallel run, longest first). They are
#: collected first, and scripts/test.sh hands the files to its workers in collection order
#: (``--no-loadscope-reorder``), so no worker is left with a long file after the other is done.
LONGEST_FILES = (
    "tests/test_perception_int8.py", "tests/test_dist_signals.py", "tests/test_distributed.py",
    "tests/test_run_safety.py", "tests/test_resume.py", "tests/test_bench.py", "tests/test_data_wait.py",
    "tests/test_hat_project.py", "tests/test_disk_full.py", "tests/test_resume_settings.py",
    "tests/test_module_calls.py", "tests/test_calibration_processes.py", "tests/test_work_dir_safety.py",
    "tests/test_resume_quant.py", "tests/test_cli_stages.py", "tests/test_resume_history.py", "tests/test_cli.py",
    "tests/test_digits_resnet.py", "tests/test_signals.py", "tests/test_own_modules.py", "tests/test_host_reads.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (:data:`LONGEST_FILES`), every other in the order collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(_file_of(item.nodeid), len(rank)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--file-progress", action="store_true",
                     help="with -q: a line per test file (share done, time so far, results) instead of dots")


def _share_the_cores(workers: int) -> None:
    """In each of ``workers`` pytest-xdist worker processes: give torch (and every process the tests
    start, which inherit the environment) its share of the cores, so that the workers' thread
    pools do not take turns on the same cores. A setting of ``OMP_NUM_THREADS`` is kept."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")  # not imported yet, normally: then torch reads the variable
    if torch is not None:
        torch.set_num_threads(threads)


def _collects_here(config: pytest.Config) -> bool:
    """Whether this process collects the tests: a pytest-xdist worker, or a run without workers."""
    return hasattr(config, "workerinput") or not config.getoption("numprocesses", default=None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The collector on again (see pytest_configure), with what the collection imported frozen."""
    if _collects_here(session.config):
        gc.freeze()
        gc.enable()


def pytest_configure(config: pytest.Config) -> None:
    # Collecting imports torch, torchao and every test module: a million objects that stay. With the
    # garbage collector off meanwhile (and those objects frozen afterwards) the collection takes
    # half the CPU time, and the tests' own collections skip them; hat-train does the same
    # (hat_ignite/cli/collector.py).
    if _collects_here(config):
        gc.disable()
    # int8 graphs run as converted in the tests (and the CLI runs they start): compiling each with
    # inductor costs seconds to tens of seconds. The tests of the inductor path turn it on
    # themselves (tests/test_int8_inductor.py); HAT_IGNITE_INT8_INDUCTOR=1 runs the suite with it.
    os.environ.setdefault("HAT_IGNITE_INT8_INDUCTOR", "0")
    worker = hasattr(config, "workerinput")  # a pytest-xdist worker: its results are printed by the main process
    if worker:
        _share_the_cores(int(config.workerinput["workercount"]))
    if config.getoption("file_progress") and config.get_verbosity() < 0 and not worker:
        config.pluginmanager.register(FileProgress(config), "file-progress")
