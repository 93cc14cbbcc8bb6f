"""Exact in-memory reference solvers: dual Cholesky, primal, auto choice, memory guard."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.kernel_ridge import KernelRidge as SKKernelRidge

import pipeline.constants as C
from pipeline.fit import fit_reference
from pipeline.kernels import RBF, Linear
from pipeline.linalg import dense_dual as dual_mod
from pipeline.linalg.dense_dual import (
    SingularKernelWarning,
    effective_alpha,
    predict_dual,
    solve_dual,
)
from pipeline.linalg.dense_memory import (
    InsufficientMemoryError,
    check_dense_memory,
    dense_dual_bytes,
)
from pipeline.linalg.dense_primal import primal_to_dual, solve_primal
from pipeline.models.artifact import Model
from pipeline.plan.fit_plan import in_memory_choice


def _data(n=120, d=5, t=None, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n)
    if t:
        y = np.column_stack([y * (i + 1) + i for i in range(t)])
    return X, y


def test_dual_equals_direct_solve():
    X, y = _data()
    K = RBF(gamma=0.3)(X)
    a = solve_dual(K, y, 0.7)
    np.testing.assert_allclose(a, np.linalg.solve(K + 0.7 * np.eye(len(y)), y), rtol=1e-10)
    # K is not modified without overwrite_k
    np.testing.assert_array_equal(K, RBF(gamma=0.3)(X))


def test_dual_multi_target_per_target_alpha_and_weights_match_sklearn():
    X, Y = _data(t=3)
    sw = np.random.default_rng(1).uniform(0.1, 2.0, len(Y))
    K = RBF(gamma=0.2)(X)
    alpha = np.array([0.1, 1.0, 0.1])
    ours = solve_dual(K, Y, alpha, sample_weight=sw)
    ref = SKKernelRidge(alpha=alpha, kernel="precomputed").fit(K, Y, sample_weight=sw).dual_coef_
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)


def test_overwrite_k_gives_same_solution():
    X, Y = _data(t=2)
    K = RBF(gamma=0.5)(X)
    ref = solve_dual(K, Y, [0.3, 2.0])
    Kw = K.copy()
    np.testing.assert_allclose(solve_dual(Kw, Y, [0.3, 2.0], overwrite_k=True), ref, rtol=1e-12)


def test_n_samples_convention():
    X, y = _data()
    n = len(y)
    K = RBF(gamma=0.5)(X)
    a = solve_dual(K, y, 0.01, alpha_convention="n_samples")
    np.testing.assert_allclose(a, np.linalg.solve(K + n * 0.01 * np.eye(n), y), rtol=1e-10)
    # with weights n is sum(w): integer weights act as repeated rows
    w = np.ones(n)
    w[:10] = 3.0
    Xr = np.vstack([X, X[:10], X[:10]])
    yr = np.concatenate([y, y[:10], y[:10]])
    m_w = fit_reference(X, y, RBF(gamma=0.5), 0.01, sample_weight=w, alpha_convention="n_samples")
    m_r = fit_reference(Xr, yr, RBF(gamma=0.5), 0.01, alpha_convention="n_samples")
    m_w, m_r = (Model.from_fit(m, Xm, RBF(gamma=0.5), 0.01) for m, Xm in ((m_w, X), (m_r, Xr)))
    Xt, _ = _data(n=30, seed=5)
    np.testing.assert_allclose(m_w.predict(Xt), m_r.predict(Xt), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(
        effective_alpha(0.01, n, sample_weight=w, alpha_convention="n_samples"), [0.01 * w.sum()]
    )
    with pytest.raises(ValueError, match="alpha_convention"):
        effective_alpha(1.0, n, alpha_convention="mean")


def test_blocked_cholesky_equals_lapack_and_keeps_upper_triangle():
    rng = np.random.default_rng(0)
    n = 700
    B = rng.standard_normal((n, n))
    A = np.asfortranarray(B @ B.T / n + np.eye(n))
    A1, A2 = A.copy(order="F"), A.copy(order="F")
    assert dual_mod._potrf_dense(A1) == 0
    assert dual_mod._potrf_blocked(A2, tile=128) == 0
    np.testing.assert_allclose(np.tril(A2), np.tril(A1), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.triu(A2, 1), np.triu(A, 1))
    # a failing pivot is reported at the same (1-based) position as LAPACK
    C = A.copy(order="F")
    C[400, 400] = -1.0
    assert dual_mod._potrf_blocked(C.copy(order="F"), tile=128) == 401
    assert dual_mod._potrf_dense(C.copy(order="F")) == 401


def test_large_potrf_runs_on_one_blas_thread():
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    with dual_mod.potrf_threads(C.ONE_BLAS_THREAD_FROM):
        assert blas_threads() and all(t == 1 for t in blas_threads())
    assert C.ONE_BLAS_THREAD_FROM < 15_000  # below the measured segfault order


@pytest.mark.parametrize("order", ["C", "F"])
def test_cho_factor_in_place_and_as_scipy(order, monkeypatch):
    """The one in-memory dense Cholesky: scipy's factor and solve, in ``a``'s memory
    when allowed (for a C-ordered ``a`` its transpose, so ``a``'s strict lower triangle
    keeps ``a``), a copy otherwise, LinAlgError on an indefinite matrix; from the order
    where OpenBLAS' 2-thread potrf crashes it is blocked (no potrf of the whole matrix),
    and a lone potrf there (the benchmark's) gets one BLAS thread."""
    from scipy import linalg

    rng = np.random.default_rng(3)
    n = 90
    B = rng.standard_normal((n, n))
    A = np.array(B @ B.T / n + np.eye(n), order=order)
    b = rng.standard_normal((n, 2))
    want = linalg.solve(A, b, assume_a="pos")
    keep = A.copy()
    c = dual_mod.cho_factor(A)  # a copy: A unchanged
    np.testing.assert_array_equal(A, keep)
    np.testing.assert_allclose(linalg.cho_solve(c, b), want, rtol=1e-10)
    c = dual_mod.cho_factor(A, overwrite_a=True)
    assert c[1] is True and np.shares_memory(c[0], A) and c[0].flags.f_contiguous
    np.testing.assert_allclose(linalg.cho_solve(c, b), want, rtol=1e-10)
    untouched = np.tril(keep, -1) if order == "C" else np.triu(keep, 1)
    np.testing.assert_array_equal(np.tril(A, -1) if order == "C" else np.triu(A, 1), untouched)
    bad = keep.copy()
    bad[40, 40] = -1.0
    with pytest.raises(linalg.LinAlgError, match="41-th leading minor"):
        dual_mod.cho_factor(bad)
    seen = []
    monkeypatch.setattr(C, "ONE_BLAS_THREAD_FROM", n)
    real = dual_mod.lapack.dpotrf

    def spy(*args, **kwargs):
        from threadpoolctl import threadpool_info

        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        return real(*args, **kwargs)

    monkeypatch.setattr(dual_mod.lapack, "dpotrf", spy)
    c = dual_mod.cho_factor(keep)
    assert not seen  # blocked: its tiles' potrf are the engine's calls
    np.testing.assert_allclose(linalg.cho_solve(c, b), want, rtol=1e-10)
    assert dual_mod._potrf_dense(np.asfortranarray(keep)) == 0
    assert seen and set(seen) == {1}


def test_solve_dual_blocked_path(monkeypatch):
    X, Y = _data(n=300, t=2)
    K = RBF(gamma=0.5)(X)
    ref = solve_dual(K, Y, [0.1, 0.5])
    monkeypatch.setattr(C, "ONE_BLAS_THREAD_FROM", 100)
    monkeypatch.setattr(C, "DENSE_POTRF_TILE", 64)
    # entrywise relative error is meaningless for the tiny entries (3.4e-6 next to 0.5:
    # 2e-10 relative, 7e-16 absolute on AMD EPYC), so relative to the largest entry
    got = solve_dual(K, Y, [0.1, 0.5])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10 * np.abs(ref).max())


def test_singular_kernel_lstsq_fallback_matches_sklearn():
    # duplicated rows: K = X X^T has an exactly zero pivot, alpha = 0
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    y = np.array([1.0, 2.0, 3.0, 4.0])
    K = X @ X.T
    with pytest.warns(UserWarning, match="Singular matrix"):
        ours = solve_dual(K, y, 0.0)
    with pytest.warns(UserWarning, match="Singular matrix"):
        ref = SKKernelRidge(alpha=0.0, kernel="precomputed").fit(K, y).dual_coef_
    np.testing.assert_allclose(K @ ours, K @ ref, rtol=1e-10, atol=1e-12)


def test_jitter_policies():
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    K = X @ X.T
    y = np.array([1.0, 1.0, 2.0])
    with pytest.warns(SingularKernelWarning, match="jitter"):
        a, info = solve_dual(K, y, 0.0, jitter="auto", return_info=True)
    j = info["solves"][0]["jitter"]
    assert info["solves"][0]["method"] == "cholesky" and j > 0
    np.testing.assert_allclose((K + j * np.eye(3)) @ a, y, rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = solve_dual(K, y, 0.0, jitter=1e-3)
    np.testing.assert_allclose(b, np.linalg.solve(K + 1e-3 * np.eye(3), y), rtol=1e-10)
    with pytest.raises(ValueError, match="jitter"):
        solve_dual(K, y, 1.0, jitter=-1.0)


def test_primal_equals_dual_for_linear_kernel():
    X, Y = _data(n=80, d=6, t=2)
    sw = np.random.default_rng(3).uniform(0.5, 2.0, len(Y))
    for conv in ("sklearn", "n_samples"):
        coef = solve_primal(X, Y, [0.5, 2.0], sample_weight=sw, alpha_convention=conv)
        dual = solve_dual(X @ X.T, Y, [0.5, 2.0], sample_weight=sw, alpha_convention=conv)
        np.testing.assert_allclose(X.T @ dual, coef, rtol=1e-9, atol=1e-12)
        lam = effective_alpha(
            [0.5, 2.0], len(Y), n_targets=2, sample_weight=sw, alpha_convention=conv
        )
        np.testing.assert_allclose(primal_to_dual(X, Y, coef, lam, sw), dual, rtol=1e-8, atol=1e-11)
    # sparse features give the same weights
    Xs = sp.csr_matrix(np.where(np.abs(X) > 0.5, X, 0.0))
    np.testing.assert_allclose(
        solve_primal(Xs, Y[:, 0], 0.3), solve_primal(Xs.toarray(), Y[:, 0], 0.3), rtol=1e-12
    )


def test_cost_model_choice():
    assert in_memory_choice(10_000, 10, has_primal=True) == "primal"
    assert in_memory_choice(50, 5_000, has_primal=True) == "dense"
    assert in_memory_choice(10_000, 10, has_primal=False) == "dense"
    assert in_memory_choice(10_000, 10, has_primal=True, alpha=0.0) == "dense"
    X, y = _data(n=200, d=4)
    assert fit_reference(X, y, "linear", 1.0).solver == "primal"
    assert fit_reference(X, y, "rbf", 1.0).solver == "dense"
    p1, p2 = (
        Model.from_fit(fit_reference(X, y, Linear(), 1.0, solver=s), X, Linear(), 1.0).predict(X)
        for s in ("primal", "dense")
    )
    np.testing.assert_allclose(p1, p2, rtol=1e-10)


def test_predict_dual_blocks():
    X, y = _data(n=90)
    k = RBF(gamma=0.4)
    a = solve_dual(k(X), y, 0.1)
    Xt, _ = _data(n=57, seed=9)
    full = k(Xt, X) @ a
    np.testing.assert_allclose(
        predict_dual(lambda B: k(B, X), Xt, a, block_rows=10), full, rtol=1e-13
    )


def test_memory_guard_points_to_out_of_core():
    need = dense_dual_bytes(300_000, 10)
    assert need > 8 * 300_000**2
    # the blocked factor's tiles count from the order it is blocked at, not below
    tile = 8 * C.DENSE_POTRF_TILE**2 * (C.DENSE_POTRF_TILES_HELD + 1)
    below, at = C.ONE_BLAS_THREAD_FROM - 1, C.ONE_BLAS_THREAD_FROM
    assert dense_dual_bytes(below, 10) == 8 * (below**2 + 10 * below + 3 * below)
    assert dense_dual_bytes(at, 10) == 8 * (at**2 + 10 * at + 3 * at) + tile
    with pytest.raises(InsufficientMemoryError, match="solver='cholesky'.*solver='cg'"):
        check_dense_memory(need, what="the dense dual solve", available=16 * 1024**3)
    check_dense_memory(dense_dual_bytes(1000, 10), what="x", available=16 * 1024**3)
    assert issubclass(InsufficientMemoryError, MemoryError)
    X, y = _data(n=50)
    with pytest.raises(InsufficientMemoryError):
        fit_reference(X, y, "rbf", available_memory=1000)


@pytest.mark.slow
def test_fit_16000_does_not_crash_in_subprocess():
    """scikit-learn's KernelRidge segfaults here (OpenBLAS 2-thread potrf, n >= ~15.5k).

    The dense solve is named: at this λ the plan of ``solver="auto"`` prices CG more than
    IN_MEMORY_CG_MARGIN times cheaper and takes it."""
    code = textwrap.dedent(
        """
        import numpy as np
        from pipeline import KernelRidge
        rng = np.random.default_rng(0)
        X = rng.standard_normal((16_000, 3))
        y = np.sin(X[:, 0]) + 0.05 * rng.standard_normal(16_000)
        m = KernelRidge(kernel="rbf", gamma=0.5, alpha=1e-2, solver="dense").fit(X, y)
        r = m.predict(X[:200]) - y[:200]
        assert m.solver_ == "dense" and np.isfinite(m.dual_coef_).all()
        print("rmse", float(np.sqrt(np.mean(r ** 2))))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert float(proc.stdout.split()[-1]) < 0.2


def test_cholesky_is_scipys_clean_factor():
    """:func:`dense_dual.cholesky`: scipy's clean lower or upper factor, ``a`` untouched."""
    from scipy import linalg

    rng = np.random.default_rng(4)
    B = rng.standard_normal((50, 50))
    A = B @ B.T / 50 + np.eye(50)
    keep = A.copy()
    for lower in (True, False):
        np.testing.assert_allclose(
            dual_mod.cholesky(A, lower=lower), linalg.cholesky(A, lower=lower), rtol=1e-12
        )
    np.testing.assert_array_equal(A, keep)
    tmp = A.copy()  # a temporary: its memory may hold the factorisation, same factor
    np.testing.assert_array_equal(
        dual_mod.cholesky(tmp, lower=False, overwrite_a=True), dual_mod.cholesky(A, lower=False)
    )
