"""The notebook workflow runs end to end with nbclient and draws its plots."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "workflows" / "experiment.ipynb"


class _ThisPython(KernelSpecManager):
    """Kernel "python3" run by this interpreter (the venv's), whatever kernelspecs are installed."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3",
            language="python",
            resource_dir=str(Path(__file__).parent),
        )


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.slow
def test_notebook_executes_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's work directory (stores, model)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    km = KernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())
    client = nbclient.NotebookClient(
        nb,
        km=km,
        kernel_name="python3",
        timeout=300,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    pngs = [
        base64.b64decode(o.data["image/png"]) for o in outputs if "image/png" in o.get("data", {})
    ]
    # CV curve, CV heatmap, CG convergence, residuals
    assert len(pngs) >= 4
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" and len(p) > 5000 for p in pngs)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "predictions identical: True" in text
    assert "CG:" in text and "converged=True" in text
