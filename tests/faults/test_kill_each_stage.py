"""Fault tests: SIGKILL ``krr run`` inside each stage, rerun, compare bitwise.

The kill is injected by ``tests/faultinject/sitecustomize.py`` just before the
K-th completion marker of a chosen array is written: the tile's data is on disk
but not recorded as done. The rerun must finish, and the final α and the
predictions must be bitwise identical to an uninterrupted run.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import zarr

from pipeline.models.artifact import load_artifact

pytestmark = pytest.mark.slow


CONFIG = """
name: faults
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.25, seed: 0}}
preprocess: {{standardize: true, standardize_y: true}}
kernel: {{name: rbf, params: {{gamma: 0.2}}}}
lambda: {lam}
lam_convention: {conv}
solver: {solver}
block_size: 100
predict: {{input: {xn}}}
evaluate: {{baseline: none}}
cluster: {{n_workers: 1, processes: false, memory_limit: 2GiB}}
"""

CHOLESKY = "{method: cholesky}"
CG = "{method: cg, matvec: stored, preconditioner: nystrom, rank: 20, tol: 1.0e-10, checkpoint_every: 2}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("faultdata")
    rng = np.random.default_rng(0)
    # 450 training rows in tiles of 100: 5 row blocks, 15 Gram and factor tiles; 500 new
    # rows: 5 prediction blocks. Each kill point below lies inside its stage.
    X = rng.normal(size=(600, 5))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=600)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    np.save(d / "Xn.npy", rng.normal(size=(500, 5)))
    return d


def _config(data: Path, dest: Path, solver: str) -> Path:
    lam, conv = ("0.01", "sklearn") if solver == CHOLESKY else ("1.0e-4", "n")
    text = CONFIG.format(
        x=data / "X.npy", y=data / "y.npy", xn=data / "Xn.npy", lam=lam, conv=conv, solver=solver
    )
    p = dest / "conf.yaml"
    p.write_text(text)
    return p


def _results(run_dir: Path) -> dict[str, np.ndarray]:
    from pipeline.stages.manifest import Manifest

    m = Manifest.load(run_dir)  # the latest configuration's results/<key>/{model,predict}
    art = load_artifact(m.stage_dir("model") / "model")
    out = {"alpha": np.asarray(art.dual_coef)}
    for store in sorted(m.stage_dir("predict").glob("*.zarr")):
        group = zarr.open_group(str(store), mode="r")
        for name, arr in group.arrays():
            out[f"{store.name}/{name}"] = arr[...]
    return out


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory, krr_main):
    refs = {}
    for solver in (CHOLESKY, CG):
        d = tmp_path_factory.mktemp("ref")
        r = krr_main.run(_config(data, d, solver), d / "run")
        assert r.returncode == 0, r.stderr[-3000:]
        refs[solver] = _results(d / "run")
    return refs


@pytest.mark.parametrize(
    ("solver", "match", "at"),
    [
        (CHOLESKY, "X_train/", 4),  # mid-ingest
        (CHOLESKY, "gram/", 12),  # mid-gram
        (CHOLESKY, "chol/", 12),  # mid-factor
        (CG, "cg", 2),  # mid-CG (the 2nd checkpoint)
        (CHOLESKY, "predictions/", 4),  # mid-predict
    ],
    ids=["ingest", "gram", "factor", "cg", "predict"],
)
def test_sigkill_then_rerun_is_bitwise_identical(
    data, reference, tmp_path, solver, match, at, krr_run, krr_main
):
    conf = _config(data, tmp_path, solver)
    run_dir = tmp_path / "run"
    killed = krr_run.run(conf, run_dir, kill=(match, at), timeout=600)
    # the injected kill really happened, inside the stage we aimed at
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    status = krr_main("status", run_dir)
    assert "partial" in status.stdout, status.stdout
    resumed = krr_main.run(conf, run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = _results(run_dir), reference[solver]
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
