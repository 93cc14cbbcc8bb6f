"""Refinement of a float32 factor with the fastest product (pipeline.linalg.triangular, #15)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram
from pipeline.linalg.matvec import MatrixFreeKernelOperator, StoredKernelOperator
from pipeline.linalg.triangular import refinement_operator, solve_refined

N, B, LAM = 500, 128, 1e-3


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, 5))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
    kernel = RBF(gamma=0.2)
    store = str(tmp_path_factory.mktemp("refine"))
    gram = build_gram(X, kernel, store, B, progress=False)
    K = kernel(X, X) + LAM * np.eye(N)
    return X, y, kernel, gram, K


def _rel(K, a, y):
    return np.linalg.norm(K @ a - y) / np.linalg.norm(y)


@pytest.mark.parametrize("source", ["matrix_free", "stored"])
def test_float32_factor_refined_to_double(problem, source):
    X, y, kernel, gram, K = problem
    f = tile_cholesky(gram, LAM, progress=False, dtype=np.float32, name=f"c32{source}")
    stats: dict = {}
    kw = {"X": X, "kernel": kernel} if source == "matrix_free" else {"gram": gram}
    alpha = solve_refined(f, y, stats=stats, tol=1e-11, **kw)
    assert stats["refine_operator"] == (
        "MatrixFreeKernelOperator" if source == "matrix_free" else "StoredKernelOperator"
    )
    assert 1 <= stats["refine_iterations"] <= 20
    assert _rel(K, alpha, y) <= 1e-11
    np.testing.assert_allclose(alpha, np.linalg.solve(K, y), rtol=1e-7, atol=1e-9)


def test_operator_choice(problem):
    X, _, kernel, gram, _ = problem
    assert isinstance(
        refinement_operator(LAM, X=X, kernel=kernel, gram=gram), MatrixFreeKernelOperator
    )
    assert isinstance(refinement_operator(LAM, gram=gram), StoredKernelOperator)
    with pytest.raises(ValueError, match="X= and kernel="):
        refinement_operator(LAM)


def test_float32_gram_in_place_refined_matrix_free(problem, tmp_path):
    """A float32 Gram factored in place in float32, refined from X: double precision
    from a quarter of the float64 disk."""
    X, y, kernel, _, K = problem
    g32 = build_gram(X, kernel, str(tmp_path), B, dtype="float32", progress=False)
    f = tile_cholesky(g32, LAM, progress=False, dtype=np.float32, keep_gram=False)
    assert f.L.name == g32.name and np.dtype(f.L.dtype) == np.float32
    stats: dict = {}
    alpha = solve_refined(f, y, X=X, kernel=kernel, stats=stats)
    assert _rel(K, alpha, y) <= 1e-11


def test_in_place_new_lambda_with_the_gram_recomputer(problem, tmp_path):
    """keep_gram=False, then another lambda: the Gram tiles are recomputed from X by
    GramTileRecomputer (what the Gram build computes) and the factor is right."""
    from pipeline.linalg.cholesky_inplace import GramTileRecomputer

    X, y, kernel, _, _ = problem
    g = build_gram(X, kernel, str(tmp_path), B, progress=False)
    tile_cholesky(g, LAM, progress=False, keep_gram=False)
    rec = GramTileRecomputer(X, kernel, B, g.dtype)
    f = tile_cholesky(g, 1e-2, progress=False, keep_gram=False, recompute_tile=rec)
    alpha = solve_refined(f, y, X=X, kernel=kernel)
    assert _rel(kernel(X, X) + 1e-2 * np.eye(N), alpha, y) <= 1e-11
