"""The scripts under ``workflows/`` as modules, for the tests that check a benchmark's
recorded figures or a generator's output without running it as a script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

WORKFLOWS = Path(__file__).resolve().parents[1] / "workflows"
BENCH = WORKFLOWS / "benchmarks"


def load_workflow(relpath: str) -> ModuleType:
    """``workflows/<relpath>`` imported once, under its file's stem (registered in
    ``sys.modules``: a dataclass looks its module up there)."""
    path = WORKFLOWS / relpath
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
