"""pytest's ``--file-progress``: one line per test file as the run goes, instead of a line of dots.

``scripts/test.sh`` (and so ``.ci/run``) runs the suite with it, so a long run shows where it is:

    [ 12%   0:38] tests/test_registry.py: 26 passed (14.1 s)

(the share of the collected tests done, the time since the tests began, the file, its results and
its own time). A failing test still prints its ``F`` or ``E`` at once, and the usual summary
follows the run. Without ``-q`` pytest's own per-file lines are used and the option does nothing.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import pytest



def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileProgress:
    """Prints a line each time the tests of a file are done (see the module docstring)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self.file: str | None = None
        self.file_started = self.started
        self.outcomes: Counter[str] = Counter()
        self.order: list[str] = []  # the files in the order they run

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.order = list(dict.fromkeys(_file_of(item.nodeid) for item in session.items))
        self.started = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            return "passed", "", ""  # counted in the summary, no dot: the file's line says it
        return None

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        name = _file_of(nodeid)
        if name != self.file:
            self._file_done()
            self.file, self.file_started = name, time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes["xfailed" if hasattr(report, "wasxfail") else report.outcome] += 1
            self.done += 1
        elif report.when == "teardown" and report.failed:
            self.outcomes["error"] += 1

    def pytest_sessionfinish(self) -> None:
        self._file_done()

    def _file_done(self) -> None:
        if self.file is None:
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            elapsed = int(time.monotonic() - self.started)
            share = 100 * self.done // self.total if self.total else 100
            results = ", ".join(f"{n} {outcome}" for outcome, n in self.outcomes.items()) or "no tests"
            reporter.write_line(
                f"[{share:3d}% {elapsed // 60:3d}:{elapsed % 60:02d}] {self.file}: {results} "
                f"({time.monotonic() - self.file_started:.1f} s)"
            )
        self.file = None
        self.outcomes = Counter()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--file-progress", action="store_true",
                     help="with -q: a line per test file (share done, time so far, results) instead of dots")


def pytest_configure(config: pytest.Config) -> None:
    # int8 graphs run as converted in the tests (and the CLI runs they start): compiling each with
    # inductor costs seconds to tens of seconds. The tests of the inductor path turn it on
    # themselves (tests/test_int8_inductor.py); HAT_IGNITE_INT8_INDUCTOR=1 runs the suite with it.
    os.environ.setdefault("HAT_IGNITE_INT8_INDUCTOR", "0")
    if config.getoption("file_progress") and config.get_verbosity() < 0:
        config.pluginmanager.register(FileProgress(config), "file-progress")
