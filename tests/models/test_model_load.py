"""One fitted model (issue #16, item 2): ``krr run``'s model loads with ``pipeline.load``
as a working KernelRidge; the version comes from the package metadata; no module
imports the package root, and loading an artifact does not import the estimators."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import numpy as np
import pytest
import zarr

import pipeline
from pipeline.models.artifact import META_KEY, ArtifactError, load_artifact

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_load_reads_the_model_krr_run_wrote(tmp_path, diabetes_config):
    from sklearn.datasets import load_diabetes

    from pipeline import cli

    cfg = diabetes_config("model.yaml", name="model")
    run_dir = tmp_path / "run"
    assert cli.main(["run", str(cfg), "--run-dir", str(run_dir)]) == 0
    from pipeline.stages.status import latest_model

    path = latest_model(run_dir)  # results/<configuration>/model/model
    est = pipeline.load(path)
    assert isinstance(est, pipeline.KernelRidge)
    assert est.get_params()["alpha"] == 0.5 and est.solver_ == "cholesky"
    X = load_diabetes().data[:30]  # raw rows: the stored scaler is applied
    np.testing.assert_allclose(est.predict(X), load_artifact(str(path)).predict(X), rtol=1e-12)
    assert est.score(X, load_diabetes().target[:30]) > 0.2


def test_a_newer_format_is_refused_naming_its_version(tmp_path):
    X = np.random.default_rng(0).normal(size=(40, 3))
    pipeline.KernelRidge(kernel="rbf", solver="dense").fit(X, X[:, 0]).save(tmp_path / "m")
    group = zarr.open_group(str(tmp_path / "m"), mode="r+")
    meta = dict(group.attrs[META_KEY])
    meta["format_version"], meta["package_version"] = 99, "9.0.0"
    group.attrs[META_KEY] = meta
    with pytest.raises(
        ArtifactError, match=r"format version 99 \(written by krr-pipeline 9\.0\.0\)"
    ):
        pipeline.load(tmp_path / "m")


def test_version_from_metadata_and_no_import_of_the_package_root(fresh_python):
    assert pipeline.__version__ == importlib.metadata.version("krr-pipeline")
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "pipeline").rglob("*.py")
        if p.name != "__init__.py" or p.parent.name != "pipeline"
        if re.search(r"^\s*from pipeline import|^\s*import pipeline\s*$", p.read_text(), re.M)
    ]
    assert offenders == []
    code = (
        "import sys, pipeline.models.artifact, pipeline.models.model_io; "
        "print(sorted(m for m in ('pipeline.models.estimator', 'pipeline.models.selection') "
        "if m in sys.modules))"
    )
    out = fresh_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
