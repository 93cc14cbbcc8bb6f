"""Mixed precision that pays: the float32 factor's refinement uses the fast product.

- ``cholesky_solve(X=, kernel=)`` refines a float32 factor to 1e-11 with matrix-free
  products (never rereading the stored Gram), and the complete fit does so when X
  is in memory (``fit_info_``/``FitResult.info`` names the operator);
- the sweeps' memory-bound BLAS runs on one thread whatever the caller's setting,
  and is restored afterwards.
"""

from __future__ import annotations

import numpy as np

from pipeline.kernels.basic import RBF
from pipeline.linalg import blas
from pipeline.linalg import triangular as tri
from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.triangular import cholesky_solve
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
