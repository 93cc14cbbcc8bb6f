"""The layout of ``tests/`` (issue #43, item 5): a newcomer finds a package's tests in the
directory of that package, and a file's name says what it tests.

``tests/<dir>/`` is a package of ``pipeline`` (``tests/fit/`` for ``pipeline/fit.py``) or one
of the cross-cutting directories: ``contracts`` (format and fingerprint pins), ``faults``
(injected kills, signals, crashes, a full disk, a stalled store, corrupted data), ``cli``
(exit codes and messages), ``docs``. The files used to be ``tests/faults/test_fault_<how the
bug was found>.py``, whatever they tested; the bug history now lives in docstrings.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "pipeline"
CROSS_CUTTING = {"contracts", "faults", "cli", "docs"}
#: what a helper directory holds instead of tests (loaded by subprocesses, or data)
NOT_TESTS = {"faultinject", "data", "__pycache__"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if not NOT_TESTS & set(p.parts))


def test_every_test_directory_is_a_package_or_cross_cutting():
    dirs = {p.parent.relative_to(TESTS).parts[0] for p in _test_files() if p.parent != TESTS}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    packages |= {p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")}
    assert sorted(dirs - packages - CROSS_CUTTING) == []


def test_test_file_names_are_unique_and_say_what_they_test():
    # no __init__.py: pytest imports a test module by its base name, so two equal names clash
    names = collections.Counter(p.name for p in _test_files())
    assert sorted(n for n, c in names.items() if c > 1) == []
    assert sorted(n for n in names if n.startswith("test_fault_")) == []


#: the repository's top level (the design card's, with docs/ for the reference material)
TOP_LEVEL = {
    ".ci",
    ".gitignore",
    "README.md",
    "conf",
    "docs",
    "pipeline",
    "pyproject.toml",
    "tests",
    "workflows",
}


def test_the_top_level_holds_only_the_design_cards_entries():
    # a benchmark's output committed where it was written (bench_kin40k_run.jsonl, session 36)
    # belongs under workflows/benchmarks/
    root = TESTS.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted({f.split("/")[0] for f in files} - TOP_LEVEL) == []
