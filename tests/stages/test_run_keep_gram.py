"""``solver.keep_gram: false`` in ``krr run``: the factor replaces the gram stage's tiles.

α equals the keep_gram=true run's (to rounding: the in-place factor computes the
Gram's tiles on demand, with the tile engine's fused evaluation), and a rerun with a new lambda in the same run
directory still succeeds: the Gram tiles the first factor replaced are rebuilt
from the stored X_train, and the log says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

CONFIG = """
name: keep-gram
data: {{source: npy, path: {x}, y_path: {y}}}
split: {{test_fraction: 0.25, seed: 0}}
preprocess: {{standardize: true, standardize_y: true}}
kernel: {{name: rbf, params: {{gamma: 0.2}}}}
lambda: 0.01
solver: {{method: cholesky}}
block_size: 100
evaluate: {{baseline: none}}
cluster: {{n_workers: 1, processes: false, memory_limit: 2GiB}}
"""


def _alpha(run_dir: Path) -> np.ndarray:
    return np.load(_solve_dir(run_dir) / "alpha.npy")


def _solve_dir(run_dir: Path) -> Path:
    """The latest configuration's solve directory (``results/<key>/solve``)."""
    from pipeline.stages.manifest import Manifest

    return Manifest.load(run_dir).stage_dir("solve")


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    d = tmp_path_factory.mktemp("keepgram")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(360, 4))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=360)
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    path = d / "conf.yaml"
    path.write_text(CONFIG.format(x=d / "X.npy", y=d / "y.npy"))
    return path


@pytest.mark.slow
def test_keep_gram_false_matches_and_survives_a_new_lambda(conf, tmp_path, krr_main):
    kept, inplace = tmp_path / "kept", tmp_path / "inplace"
    krr_main.run(conf, kept, check=True)
    res = krr_main.run(conf, inplace, "solver.keep_gram=false", check=True)
    # in place, the gram stage stores no tile: the factor computes each from X, with
    # the tile engine's fused evaluation (so alpha agrees to rounding, not bit for bit)
    assert "the Gram is computed on demand" in res.stderr, res.stderr[-3000:]
    a_kept, a_in = _alpha(kept), _alpha(inplace)
    np.testing.assert_allclose(a_in, a_kept, rtol=1e-9, atol=1e-10)
    # the factor lives in the gram stage's array, no separate factor was written
    assert not (_solve_dir(inplace) / "factor.zarr").exists()
    assert (_solve_dir(kept) / "factor.zarr").exists()

    res = krr_main.run(conf, inplace, "solver.keep_gram=false", "lambda=0.05", check=True)
    assert "recomputing it from X" in res.stderr, res.stderr[-3000:]
    krr_main.run(conf, kept, "lambda=0.05", check=True)
    np.testing.assert_allclose(_alpha(inplace), _alpha(kept), rtol=1e-9, atol=1e-10)
    assert not np.allclose(_alpha(kept), a_kept)


@pytest.mark.slow
def test_float32_in_place_is_refined_to_the_float64_answer(conf, tmp_path, krr_main):
    """A float32 Gram factored in place (``dtype: float32``, ``factor_dtype: float32``,
    ``keep_gram: false``) has no Gram left to refine against: ``krr run`` refines alpha
    with matrix-free products from X_train. It used to return the factor's
    single-precision alpha with exit 0 and only a UserWarning."""
    exact, mixed = tmp_path / "f64", tmp_path / "f32"
    krr_main.run(conf, exact, check=True)
    res = krr_main.run(
        conf,
        mixed,
        "dtype=float32",
        "solver.factor_dtype=float32",
        "solver.keep_gram=false",
        check=True,
    )
    assert "single precision" not in res.stderr, res.stderr[-3000:]
    a64, a32 = _alpha(exact), _alpha(mixed)
    # refined to a relative residual <= 1e-11 of the float64 system: alpha agrees with
    # the float64 factor's far beyond float32 (~1e-4 here without the refinement)
    np.testing.assert_allclose(a32, a64, rtol=1e-7, atol=1e-9 * np.abs(a64).max())


@pytest.mark.slow
def test_float64_factor_of_a_float32_gram_is_refined_to_the_float64_answer(
    conf, tmp_path, krr_main
):
    """``dtype: float32`` with the default float64 factor, Gram kept: the factor is
    exact for the Gram's rounded values, not for the float64 kernel, so its alpha was
    off by about float32's rounding times the condition number (0.44 % of the
    predictions on 8,000 diamonds rows at lambda = 1e-4) with exit 0. ``krr run`` now
    refines it with float64 products from X_train."""
    exact, rounded = tmp_path / "f64", tmp_path / "f32"
    krr_main.run(conf, exact, "lambda=1e-4", check=True)
    res = krr_main.run(conf, rounded, "dtype=float32", "lambda=1e-4", check=True)
    assert "float32 Gram" not in res.stderr, res.stderr[-3000:]
    a64, a32 = _alpha(exact), _alpha(rounded)
    np.testing.assert_allclose(a32, a64, rtol=1e-7, atol=1e-9 * np.abs(a64).max())


@pytest.mark.slow
def test_cg_on_a_float32_gram_reaches_the_float64_answer(conf, tmp_path, krr_main):
    """CG with the stored matvec on a ``dtype: float32`` Gram converged to the rounded
    Gram's solution (predictions 4.2e-6 off scikit-learn's at tol 1e-10 on the demo)
    with exit 0. It now runs inside a float64 refinement with residuals from X_train."""
    cg = ("solver.method=cg", "solver.matvec=stored", "solver.tol=1e-10", "lambda=1e-3")
    exact, rounded = tmp_path / "f64", tmp_path / "f32"
    krr_main.run(conf, exact, *cg, check=True)
    krr_main.run(conf, rounded, "dtype=float32", *cg, check=True)
    a64, a32 = _alpha(exact), _alpha(rounded)
    np.testing.assert_allclose(a32, a64, rtol=1e-6, atol=1e-7 * np.abs(a64).max())


@pytest.mark.slow
def test_matrix_free_cg_with_dtype_float32_keeps_float64_products(conf, tmp_path, krr_main):
    """``dtype`` is the Gram's storage. It used to reach the CG plan as the kernel's
    dtype too, so matrix-free CG ran on float32 products and stalled above tol
    (exit 4 on the demo at the default tol 1e-6)."""
    cg = ("solver.method=cg", "solver.matvec=recompute", "solver.tol=1e-9")
    exact, single = tmp_path / "f64", tmp_path / "f32"
    krr_main.run(conf, exact, *cg, check=True)
    krr_main.run(conf, single, "dtype=float32", *cg, check=True)
    np.testing.assert_allclose(_alpha(single), _alpha(exact), rtol=1e-12, atol=0)
