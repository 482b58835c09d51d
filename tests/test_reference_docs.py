"""docs/reference/*.md are generated from the docstrings and current (scripts/gen_reference.py)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys

from conftest import ROOT, time_limit

import hat_ignite.callbacks as callbacks


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_pages_are_what_the_script_writes():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=time_limit(120))
    assert proc.returncode == 0, proc.stderr  # "not current: ...; run .venv/bin/python scripts/gen_reference.py"


def test_every_callback_and_lr_updater_argument_is_on_the_page_with_its_text():
    page = (ROOT / "docs" / "reference" / "callbacks.md").read_text()
    gen = _generator()
    for name in callbacks.__all__:
        obj = getattr(callbacks, name)
        assert f"\n## {name}\n" in page, name
        if not inspect.isclass(obj) or obj.__init__ is object.__init__:
            continue
        for arg in inspect.signature(obj).parameters:
            assert f"| `{arg}` |" in page or f"| `**{arg}` |" in page or f"| `*{arg}` |" in page, (name, arg)
    assert "(not documented)" not in page  # every argument of every callback has its text
    # an argument documented by "see LrUpdaterBase" gets the base class's words
    section = page.split("\n## StepDecayLrUpdater\n")[1].split("\n## ")[0]
    base_text = gen.parse_args_section(callbacks.LrUpdaterBase.__doc__)["warmup_len"]
    assert f"| `warmup_len` | `0` | {gen._inline(base_text)} (from `LrUpdaterBase`) |" in section


def test_a_changed_docstring_makes_the_check_fail(tmp_path, monkeypatch):
    gen = _generator()
    monkeypatch.setattr(gen, "OUT_DIR", str(tmp_path))
    assert gen.main([]) == 0  # writes the pages into tmp_path
    assert gen.main(["--check"]) == 0
    page = tmp_path / "callbacks.md"
    page.write_text(page.read_text().replace("lr_decay_factor", "lr_decay_factr"))
    assert gen.main(["--check"]) == 1
