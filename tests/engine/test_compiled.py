"""The loops compiled by numba (``pipeline.engine.compiled``): every one is registered for
:func:`~pipeline.engine.compiled.warm_up`, which the test suite's controller calls before
its workers start (``tests/conftest.py``), and is reached from ``import pipeline.fit``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pipeline

PACKAGE = Path(pipeline.__file__).resolve().parent


def _names(node: ast.AST) -> set[str]:
    """The last component of every name or attribute under ``node``."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def test_every_module_that_compiles_a_loop_registers_its_warm_up():
    """A module that calls ``njit`` or decorates with ``lazy`` has a function decorated
    with ``warms_up``: the call that compiles each signature it uses."""
    compiling, registered = set(), set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "engine/compiled.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and "njit" in _names(node.func):
                compiling.add(rel)
            if isinstance(node, ast.FunctionDef):
                decorators = set().union(*(_names(d) for d in node.decorator_list))
                if "lazy" in decorators:
                    compiling.add(rel)
                if "warms_up" in decorators:
                    registered.add(rel)
    assert {"engine/vexp.py", "linalg/precond.py"} <= compiling
    assert compiling <= registered, f"no warm-up registered in {sorted(compiling - registered)}"


def test_warm_up_compiles_every_loop_reached_from_the_fit(fresh_python):
    """In a new interpreter: ``import pipeline.fit`` (what the suite's controller imports)
    registers every warm-up that importing the whole package does, and after
    :func:`warm_up` every ``lazy`` loop is compiled and ``exp`` has both widths."""
    code = """
import importlib, json, pkgutil, sys
import pipeline, pipeline.fit
from pipeline.engine import compiled, vexp
names = compiled.warm_up()
for m in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except ImportError:  # an optional extra that is not installed
        pass
lazies = [v for name, mod in list(sys.modules.items()) if name.startswith("pipeline")
          for v in vars(mod).values() if isinstance(v, compiled.lazy)]
print(json.dumps({
    "names": names,
    "all": sorted(compiled._WARM_UPS),
    "lazy": [f.fn.__qualname__ for f in lazies if f.compiled is None],
    "lazy_signatures": [len(f.compiled.signatures) for f in lazies if f.compiled],
    "exp": {str(k): len(v.signatures) for k, v in vexp._compiled.items()},
}))
"""
    proc = fresh_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(out["names"]) == out["all"], "a warm-up is not reached from pipeline.fit"
    assert len(out["names"]) >= 2
    assert out["lazy"] == [], f"lazy loops not compiled by warm_up: {out['lazy']}"
    assert out["lazy_signatures"] and min(out["lazy_signatures"]) >= 1
    assert out["exp"] == {"float64": 1, "float32": 1}
