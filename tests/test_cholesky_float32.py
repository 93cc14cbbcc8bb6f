"""A float32 factor (float64 diagonal tiles) refined to double precision against the Gram."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from test_cholesky import rbf_matrix, rel, write_gram

from pipeline.solvers import cholesky_solve, tile_cholesky


@pytest.mark.parametrize("n, block_size", [(203, 64), (150, 150), (301, 37)])
def test_float32_factor_then_refined_alpha_matches_float64(tmp_path, n, block_size):
    K = rbf_matrix(n, seed=2)
    gram = write_gram(tmp_path, K, block_size)
    lam = 1e-3
    f = tile_cholesky(gram, lam, dtype=np.float32, progress=False)
    assert np.dtype(f.L.dtype) == np.float32
    ref_L = scipy.linalg.cholesky(K + lam * np.eye(n), lower=True)
    err_l = rel(f.L.zarr("r")[:].astype(np.float64), ref_L)
    assert 1e-9 < err_l < 1e-3  # single precision: clearly not a float64 factor
    y = np.random.default_rng(0).standard_normal((n, 2))
    want = scipy.linalg.solve(K + lam * np.eye(n), y, assume_a="pos")
    stats: dict = {}
    got = cholesky_solve(f, y, gram=gram, stats=stats)
    assert rel(got, want) < 1e-10
    assert stats["rel_residual"] <= 1e-11 and stats["refine_iterations"] >= 1
    with pytest.warns(UserWarning, match="single precision"):
        rough = cholesky_solve(f, y)
    assert 1e-12 < rel(rough, want) < 1e-2


def test_ill_conditioned_system_is_refined_by_preconditioned_cg(tmp_path):
    """Condition 2e7 (lambda=1e-5): plain refinement would shrink the residual only
    about 2x per step; CG preconditioned by the float32 factor gets there quickly."""
    n = 240
    K = rbf_matrix(n, d=2, gamma=0.05, seed=4)
    gram = write_gram(tmp_path, K, 64)
    lam = 1e-5
    f = tile_cholesky(gram, lam, dtype=np.float32, progress=False)
    y = np.random.default_rng(1).standard_normal(n)
    stats: dict = {}
    got = cholesky_solve(f, y, gram=gram, refine_tol=1e-9, stats=stats)
    A = K + lam * np.eye(n)
    assert np.linalg.norm(y - A @ got) / np.linalg.norm(y) <= 1e-9
    assert stats["refine_iterations"] <= 20
    want = scipy.linalg.solve(A, y, assume_a="pos")
    assert rel(got, want) < 1e-6  # condition 2e7 times the residual


def test_float32_factor_has_its_own_fingerprint(tmp_path):
    K = rbf_matrix(120)
    gram = write_gram(tmp_path, K, 50)
    a = tile_cholesky(gram, 1e-3, name="c64", progress=False)
    b = tile_cholesky(gram, 1e-3, name="c32", dtype="float32", progress=False)
    assert a.L.fingerprint != b.L.fingerprint
    with pytest.raises(ValueError, match="float64 or float32"):
        tile_cholesky(gram, 1e-3, name="c16", dtype="float16", progress=False)


def test_estimator_float32_factor_matches_sklearn(tmp_path):
    from sklearn.kernel_ridge import KernelRidge as SkKR

    from pipeline import KernelRidge

    rng = np.random.default_rng(5)
    X = rng.standard_normal((230, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(230)
    kw = dict(alpha=1e-3, kernel="rbf", gamma=0.3)
    ours = KernelRidge(
        **kw, solver="cholesky", block_size=64, store=tmp_path / "s", factor_dtype="float32"
    ).fit(X, y)
    ref = SkKR(**kw).fit(X, y)
    Xt = rng.standard_normal((40, 4))
    np.testing.assert_allclose(ours.predict(Xt), ref.predict(Xt), rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="factor_dtype"):
        KernelRidge(**kw, solver="cholesky", factor_dtype="half").fit(X, y)


def test_refinement_that_stops_short_raises_instead_of_returning_alpha(tmp_path):
    """No exit 0 with a wrong number: a float32 factor's refinement that cannot reach
    its tolerance within max_iter is an error, not a warning and a quiet alpha."""
    from pipeline.solvers.cg import CGConvergenceError
    from pipeline.solvers.triangular import refine_solution

    n = 240
    K = rbf_matrix(n, d=2, gamma=0.05, seed=4)
    gram = write_gram(tmp_path, K, 64)
    f = tile_cholesky(gram, 1e-5, dtype=np.float32, progress=False)
    y = np.random.default_rng(1).standard_normal(n)
    alpha0 = np.zeros(n)
    with pytest.raises(CGConvergenceError, match="did not converge"):
        refine_solution(f, gram, 1e-5, y, alpha0, tol=1e-15, max_iter=1)
