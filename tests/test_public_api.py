"""workflows/ and the notebook use only the public API (issue #16, item 6).

The package root exposes what a user needs to drive a run from Python
(``pipeline.load_config``, ``pipeline.run``, ``pipeline.run_status``, ...), loaded
lazily so ``import pipeline`` stays cheap; scripts and the notebook import only
``pipeline`` and ``pipeline.cli``; a benchmark that imports internals says why.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "workflows"
BENCHMARKS = WORKFLOWS / "benchmarks"
#: ``import pipeline.X`` / ``from pipeline.X import`` anywhere in a text (``python -c '...'``)
_INTERNAL = re.compile(
    r"(?:^|[\s;'\"(])(?:import\s+pipeline\.(\w+)|from\s+pipeline\.(\w+)[\w.]*\s+import)",
    re.MULTILINE,
)


def _internal_imports(code: str) -> list[str]:
    """Submodules of ``pipeline`` other than ``cli`` that ``code`` imports."""
    found = [a or b for a, b in _INTERNAL.findall(code)]
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a shell script, or a cell with IPython magics: the regex above
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            found += [a.name.split(".")[1] for a in node.names if a.name.startswith("pipeline.")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("pipeline."):
                found.append(node.module.split(".")[1])
    return sorted({m for m in found if m != "cli"})


def _workflow_files() -> list[Path]:
    return [
        p
        for p in sorted(WORKFLOWS.rglob("*"))
        if p.is_file()
        and p.suffix in (".py", ".sh")
        and BENCHMARKS not in p.parents
        and p.name != "make_experiment_notebook.py"  # its code is the notebook's cells
    ]


def _notebook_code() -> list[str]:
    cells = json.loads((WORKFLOWS / "experiment.ipynb").read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _generator_code() -> list[str]:
    src = (WORKFLOWS / "make_experiment_notebook.py").read_text()
    tree = ast.parse(src)
    cells = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign | ast.Assign)
        and "CELLS" in ast.unparse(n.target if isinstance(n, ast.AnnAssign) else n.targets[0])
    )
    return [
        ast.literal_eval(t.elts[1]) for t in cells.elts if ast.literal_eval(t.elts[0]) == "code"
    ]


def test_the_scanner_finds_internal_imports():
    code = "import pipeline\nimport pipeline.cli\nfrom pipeline.stages import run_stages\n"
    assert _internal_imports(code) == ["stages"]
    assert _internal_imports("%matplotlib inline\nfrom pipeline.report.gather import gather") == [
        "report"
    ]
    assert _internal_imports("python -c 'import pipeline.stages.config'\n") == ["stages"]
    assert _internal_imports("import pipeline\nfrom pipeline.cli import main\n") == []


def test_workflows_use_only_the_public_api():
    files = _workflow_files()
    assert any(p.suffix == ".sh" for p in files)
    bad = {str(p.relative_to(ROOT)): m for p in files if (m := _internal_imports(p.read_text()))}
    assert not bad, f"workflows import internals (use pipeline / pipeline.cli): {bad}"


def test_the_notebook_uses_only_the_public_api():
    for where, cells in (("experiment.ipynb", _notebook_code()), ("generator", _generator_code())):
        assert cells and any("import pipeline" in c for c in cells), where
        bad = [m for c in cells for m in _internal_imports(c)]
        assert not bad, f"{where}: the notebook imports internals {bad}; use pipeline.*"


def test_each_benchmark_that_imports_internals_says_why():
    checked = 0
    for p in sorted(BENCHMARKS.glob("*.py")):
        src = p.read_text()
        if not _internal_imports(src):
            continue
        checked += 1
        doc = ast.get_docstring(ast.parse(src)) or ""
        flat = " ".join(doc.split())
        assert re.search(r"imports internals\b.{0,300}?\bbecause\b", flat), (
            f"{p.name} imports {_internal_imports(src)}: its docstring must say why, in a "
            "sentence 'It imports internals (...) because ...'"
        )
    assert checked >= 5


def test_the_package_root_exposes_the_run_api_lazily():
    for name in pipeline.__all__:
        assert getattr(pipeline, name) is not None, name
    from pipeline.stages import run_config

    assert pipeline.run is run_config
    assert callable(pipeline.load_config) and callable(pipeline.write_report)
    code = (
        "import sys, pipeline; assert 'numpy' not in sys.modules and 'dask' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'dask'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pipeline_run_runs_a_config_as_krr_run_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save("X.npy", rng.standard_normal((40, 3)))
    np.save("y.npy", rng.standard_normal(40))
    config = {
        "name": "api",
        "run_dir": str(tmp_path / "run"),
        "data": {"source": "npy", "path": "X.npy", "y_path": "y.npy"},
        "split": {"test_fraction": 0.25},
        "solver": {"method": "cholesky"},
        "evaluate": {"baseline": "none"},
        "block_size": 16,
    }
    events = []
    rep = pipeline.run(config, on_event=lambda s, e, i: events.append((s, e)))
    assert rep.ran == ["ingest", "gram", "solve", "model", "predict", "evaluate"]
    assert ("evaluate", "done") in events
    assert pipeline.latest_model(tmp_path / "run") == rep.outputs["model"]["path"]
    assert pipeline.run_status(tmp_path / "run")["stages"]
    again = pipeline.run(pipeline.load_config(config))  # the same config: all complete
    assert again.ran == [] and "solve" in again.skipped_done
    other = pipeline.run(config, overrides=["lambda=0.5"])  # overrides as on the command line
    assert "solve" in other.ran and "ingest" in other.skipped_done
    with pytest.raises(ValueError, match="overrides"):
        pipeline.run(pipeline.load_config(config), overrides=["lambda=0.5"])
    from pipeline.stages import LockHeldError, RunLock

    with RunLock(tmp_path / "run"), pytest.raises(LockHeldError):
        pipeline.run(config)
