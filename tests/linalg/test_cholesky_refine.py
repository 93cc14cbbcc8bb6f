"""Mixed precision that pays: the float32 factor's refinement uses the fast product.

- ``cholesky_solve(X=, kernel=)`` refines a float32 factor to 1e-11 with matrix-free
  products (never rereading the stored Gram), and the complete fit does so when X
  is in memory (``fit_info_``/``FitResult.info`` names the operator);
- the sweeps' memory-bound BLAS runs on one thread whatever the caller's setting,
  and is restored afterwards.

Refinement of a float32 factor with the fastest product (pipeline.linalg.triangular, #15).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine import blas
from pipeline.kernels.basic import RBF
from pipeline.linalg import triangular as tri
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.gram import build_gram
from pipeline.linalg.matvec import MatrixFreeKernelOperator, StoredKernelOperator
from pipeline.linalg.triangular import cholesky_solve, refinement_operator, solve_refined
from pipeline.storage import fingerprint_obj, open_tiled_array

N, B, LAM = 600, 150, 1e-3  # κ ≈ 1.5e5: 1e-11 is within float64 reach (1e-4: 1.4e-11 on AMD EPYC)


def _problem(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, 5))
    kernel = RBF(gamma=0.2)
    K = kernel(X, X)
    g = open_tiled_array(
        str(tmp_path / "g"), "gram", (N, N), B, np.float64, fingerprint_obj(["mf"])
    )
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    y = rng.standard_normal((N, 2))
    return X, kernel, K, g, y


def test_cholesky_solve_refines_matrix_free_without_reading_the_gram(tmp_path, monkeypatch):
    X, kernel, K, gram, y = _problem(tmp_path)
    f = tile_cholesky(gram, LAM, progress=False, dtype=np.float32, name="c32")
    reads = []
    real = type(gram).read_tile

    def spy(self, i, j, *a, **k):
        if self.name == "gram":
            reads.append((i, j))
        return real(self, i, j, *a, **k)

    monkeypatch.setattr(type(gram), "read_tile", spy)
    stats: dict = {}
    alpha = cholesky_solve(f, y, X=X, kernel=kernel, stats=stats)
    assert stats["refine_operator"] == "MatrixFreeKernelOperator"
    assert stats["refine_iterations"] >= 1
    assert not reads, f"the refinement reread Gram tiles {reads[:3]}"
    assert stats["rel_residual"] <= 1e-11
    # checked independently (dense K, another summation order: rounding of its own)
    r = y - (K + LAM * np.eye(N)) @ alpha
    assert np.max(np.linalg.norm(r, axis=0) / np.linalg.norm(y, axis=0)) <= 1e-10
    # with only the Gram, the stored product is used, to the same tolerance
    stats2: dict = {}
    alpha2 = cholesky_solve(f, y[:, 0], gram=gram, stats=stats2)
    assert stats2["refine_operator"] == "StoredKernelOperator"
    np.testing.assert_allclose(alpha2, alpha[:, 0], rtol=1e-8, atol=1e-8)


def test_complete_fit_refines_a_float32_factor_matrix_free(tmp_path):
    from pipeline import KernelRidge

    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(300)
    m = KernelRidge(
        alpha=1e-4,
        kernel="rbf",
        gamma=0.3,
        solver="cholesky",
        block_size=64,
        store=tmp_path / "s",
        factor_dtype="float32",
    ).fit(X, y)
    info = m.fit_info_
    text = repr(info)
    assert "MatrixFreeKernelOperator" in text, text[:500]
    K = RBF(gamma=0.3)(X, X)
    r = y - (K + 1e-4 * np.eye(300)) @ m.dual_coef_
    assert np.linalg.norm(r) / np.linalg.norm(y) <= 1e-10


def test_sweeps_use_one_blas_thread_and_restore(tmp_path, monkeypatch):
    X, kernel, K, gram, y = _problem(tmp_path)
    f = tile_cholesky(gram, LAM, progress=False, name="c64")
    seen = []
    real = tri._trsm_lower

    def spy(*a, **k):
        seen.append([c.get() for c in blas._blas_controllers()])
        return real(*a, **k)

    monkeypatch.setattr(tri, "_trsm_lower", spy)
    before = [c.get() for c in blas._blas_controllers()]
    with blas.process_threads(2):
        alpha = cholesky_solve(f, y)
        inside = [c.get() for c in blas._blas_controllers()]
    assert seen and all(n == [1] * len(n) for n in seen)
    assert inside == [2] * len(inside)  # restored to the caller's setting
    assert [c.get() for c in blas._blas_controllers()] == before
    np.testing.assert_allclose((K + LAM * np.eye(N)) @ alpha, y, atol=1e-8)


#: the refinement problem's size, tile and lambda
N_REF, B_REF, LAM_REF = 500, 128, 1e-3


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N_REF, 5))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N_REF)
    kernel = RBF(gamma=0.2)
    store = str(tmp_path_factory.mktemp("refine"))
    gram = build_gram(X, kernel, store, B_REF, progress=False)
    K = kernel(X, X) + LAM_REF * np.eye(N_REF)
    return X, y, kernel, gram, K


def _rel(K, a, y):
    return np.linalg.norm(K @ a - y) / np.linalg.norm(y)


@pytest.mark.parametrize("source", ["matrix_free", "stored"])
def test_float32_factor_refined_to_double(problem, source):
    X, y, kernel, gram, K = problem
    f = tile_cholesky(gram, LAM_REF, progress=False, dtype=np.float32, name=f"c32{source}")
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
        refinement_operator(LAM_REF, X=X, kernel=kernel, gram=gram), MatrixFreeKernelOperator
    )
    assert isinstance(refinement_operator(LAM_REF, gram=gram), StoredKernelOperator)
    with pytest.raises(ValueError, match="X= and kernel="):
        refinement_operator(LAM_REF)


def test_float32_gram_in_place_refined_matrix_free(problem, tmp_path):
    """A float32 Gram factored in place in float32, refined from X: double precision
    from a quarter of the float64 disk."""
    X, y, kernel, _, K = problem
    g32 = build_gram(X, kernel, str(tmp_path), B_REF, dtype="float32", progress=False)
    f = tile_cholesky(g32, LAM_REF, progress=False, dtype=np.float32, keep_gram=False)
    assert f.L.name == g32.name and np.dtype(f.L.dtype) == np.float32
    stats: dict = {}
    alpha = solve_refined(f, y, X=X, kernel=kernel, stats=stats)
    assert _rel(K, alpha, y) <= 1e-11


def test_in_place_new_lambda_with_the_gram_recomputer(problem, tmp_path):
    """keep_gram=False, then another lambda: the Gram tiles are recomputed from X by
    GramTileRecomputer (what the Gram build computes) and the factor is right."""
    from pipeline.linalg.cholesky_inplace import GramTileRecomputer

    X, y, kernel, _, _ = problem
    g = build_gram(X, kernel, str(tmp_path), B_REF, progress=False)
    tile_cholesky(g, LAM_REF, progress=False, keep_gram=False)
    rec = GramTileRecomputer(X, kernel, B_REF, g.dtype)
    f = tile_cholesky(g, 1e-2, progress=False, keep_gram=False, recompute_tile=rec)
    alpha = solve_refined(f, y, X=X, kernel=kernel)
    assert _rel(kernel(X, X) + 1e-2 * np.eye(N_REF), alpha, y) <= 1e-11
