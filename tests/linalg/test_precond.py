"""Preconditioners: Woodbury algebra, RPCholesky factors, and fewer CG iterations."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline.constants as C
from pipeline.kernels import RBF, Linear
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.matvec import MatrixFreeKernelOperator, StoredKernelOperator
from pipeline.linalg.precond import (
    FoldNystromBlock,
    IdentityPreconditioner,
    JacobiPreconditioner,
    NystromPreconditioner,
    build_nystrom,
    make_preconditioner,
)
from pipeline.storage import open_tiled_array


def _factor(op, rank, centres="rpcholesky", **kw):
    nf = build_nystrom(op, centres=centres, rank=rank, **kw)
    return nf.F, nf.centres


@pytest.fixture(scope="module")
def rbf_problem():
    """Ill-conditioned RBF ridge system: N=700, shift = N·1e-5 (cond ~ 1e5)."""
    rng = np.random.default_rng(0)
    n = 700
    X = rng.normal(size=(n, 3))
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=n)
    kernel = RBF(gamma=0.5)
    shift = n * 1e-5
    op = MatrixFreeKernelOperator(X, kernel, shift, block_size=256)
    A = kernel(X) + shift * np.eye(n)
    return X, y, kernel, op, A


def _iters(A, y, pre, **kw):
    res = conjugate_gradient(lambda V: A @ V, y, preconditioner=pre, max_iter=5000, **kw)
    assert res.converged
    return res.n_iter


def test_nystrom_cuts_iterations_on_ill_conditioned_rbf(rbf_problem):
    _, y, _, op, A = rbf_problem
    assert np.linalg.cond(A) > 1e4
    plain = _iters(A, y, None)
    for method in ("rpcholesky", "uniform"):
        pre = make_preconditioner("nystrom", op, rank=120, method=method)
        n_pre = _iters(A, y, pre)
        assert n_pre * 4 <= plain, (method, n_pre, plain)


def test_nystrom_with_the_matrix_free_operator_end_to_end(rbf_problem):
    _, y, _, op, A = rbf_problem
    pre = make_preconditioner("nystrom", op, rank=150)
    res = conjugate_gradient(op.matvec, y, preconditioner=pre, tol=1e-8)
    assert res.converged and res.n_iter < 60
    exact = np.linalg.solve(A, y)
    assert np.linalg.norm(res.x - exact) / np.linalg.norm(exact) <= 1e-5


def test_jacobi_cuts_iterations_when_the_diagonal_varies():
    """RBF x Linear on rows of very different norms: diag(K) spans 5 orders of magnitude."""
    rng = np.random.default_rng(0)
    n = 400
    X = rng.normal(size=(n, 3)) * np.exp(rng.uniform(-2, 2, size=n))[:, None]
    y = rng.normal(size=n)
    kernel = RBF(gamma=0.5) * Linear()
    op = MatrixFreeKernelOperator(X, kernel, 0.1)
    A = kernel(X) + 0.1 * np.eye(n)
    assert np.ptp(np.log10(np.diag(A))) > 3
    pre = make_preconditioner("jacobi", op)
    assert isinstance(pre, JacobiPreconditioner)
    assert _iters(A, y, pre) <= 0.7 * _iters(A, y, None)


def test_jacobi_is_a_scaled_identity_for_rbf(rbf_problem):
    _, y, _, op, _ = rbf_problem
    pre = JacobiPreconditioner.from_operator(op)
    np.testing.assert_allclose(pre.apply(y), y / (1 + op.shift))


def test_woodbury_apply_matches_the_dense_inverse():
    rng = np.random.default_rng(1)
    F = rng.normal(size=(50, 7))
    mu = 0.3
    pre = NystromPreconditioner(F, mu)
    R = rng.normal(size=(50, 3))
    dense = np.linalg.solve(F @ F.T + mu * np.eye(50), R)
    np.testing.assert_allclose(pre.apply(R), dense, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pre.apply(R[:, 0]), dense[:, 0], rtol=1e-10, atol=1e-12)
    assert IdentityPreconditioner().apply(R) is not R


def test_a_rank_zero_factor_applies_r_over_the_shift():
    """No pivot kept (a tiny or constant problem): the preconditioner is ``R / μ``, at
    every supported SciPy (before 1.14 ``cho_solve`` refused the empty factor)."""
    R = np.random.default_rng(2).normal(size=(6, 2))
    pre = NystromPreconditioner(np.zeros((6, 0)), 0.5)
    np.testing.assert_array_equal(pre.apply(R), R / 0.5)
    np.testing.assert_array_equal(pre.apply(R[:, 0]), R[:, 0] / 0.5)


def test_rpcholesky_interpolates_its_pivot_columns(rbf_problem):
    X, _, kernel, op, _ = rbf_problem
    K = kernel(X)
    F, piv = _factor(op, 60, random_state=3)
    assert F.shape == (700, 60) and len(np.unique(piv)) == 60
    # a Nyström approximation reproduces K exactly on its pivot columns
    np.testing.assert_allclose(F @ F[piv].T, K[:, piv], atol=1e-8)
    # the residual K - F Fᵀ is PSD-ish: its diagonal is non-negative and shrinks with the rank
    res60 = np.diag(K) - np.einsum("ij,ij->i", F, F)
    assert res60.min() > -1e-10
    F2, _ = _factor(op, 200, random_state=3)
    res200 = np.diag(K) - np.einsum("ij,ij->i", F2, F2)
    assert res200.sum() < 0.2 * res60.sum()
    # RPCholesky's trace error is no worse than uniform sampling's (same rank)
    Fu, _ = _factor(op, 60, "uniform", random_state=3)
    assert res60.sum() <= np.trace(K) - np.sum(Fu * Fu)


def _rejection_reference(H, d, u, lmax):
    """The accelerated RPCholesky's rejection step as NumPy writes it: the whole trailing
    block updated by each accepted candidate's outer product."""
    accepted = []
    for j in range(H.shape[0]):
        hjj = H[j, j]
        if not (hjj > 0) or u[j] * d[j] > hjj:
            continue
        accepted.append(j)
        col = H[j + 1 :, j] / np.sqrt(hjj)
        H[j + 1 :, j + 1 :] -= np.outer(col, col)
        if len(accepted) == lmax:
            break
    return accepted


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_rejection_step_has_numpys_bits(seed):
    """``_rejection_cholesky`` (compiled, lower triangle only) accepts the same candidates
    as the NumPy loop and leaves the same bits in the lower triangle, including repeated
    candidates (zero Schur diagonal), a non-positive diagonal and an ``lmax`` that stops
    it early."""
    from pipeline.linalg.precond import _rejection_cholesky

    rng = np.random.default_rng(seed)
    b = int(rng.integers(2, 300))
    X = rng.normal(size=(b, int(rng.integers(1, 6))))
    X[b // 2] = X[0]  # a repeated candidate
    K = RBF(gamma=float(rng.uniform(0.05, 2.0)))(X)
    if seed % 3 == 2:
        K[1, 1] = -1e-3  # a negative Schur diagonal is never accepted
    d = np.diag(K) * rng.uniform(0.5, 1.5, b)
    u = rng.random(b) if seed % 2 else np.zeros(b)
    for lmax in (b, max(1, b // 4)):
        want, got = K.copy(), K.copy()
        accepted = _rejection_reference(want, d, u, lmax)
        assert _rejection_cholesky(got, d, u, lmax) == accepted
        if lmax == b:  # (stopped early, the reference also updates after its last pivot)
            np.testing.assert_array_equal(np.tril(got), np.tril(want))
        assert 0 < len(accepted) <= lmax and accepted == sorted(set(accepted))


def test_rpcholesky_is_the_same_on_a_stored_gram(tmp_path, rbf_problem):
    X, _, kernel, op, _ = rbf_problem
    K = kernel(X)
    n = K.shape[0]
    g = open_tiled_array(str(tmp_path), "gram", (n, n), 256, K.dtype, "fp")
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    stored = StoredKernelOperator(g, op.shift)
    F1, p1 = _factor(op, 40, random_state=7)
    F2, p2 = _factor(stored, 40, random_state=7)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_allclose(F1, F2, atol=1e-10)


def test_full_rank_factor_is_exact():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 2))
    op = MatrixFreeKernelOperator(X, RBF(gamma=1.0), 1e-3)
    K = RBF(gamma=1.0)(X)
    F, _ = _factor(op, 40)
    assert np.abs(F @ F.T - K).max() < 1e-6


def test_fingerprints_differ():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    op = MatrixFreeKernelOperator(X, RBF(gamma=1.0), 1e-2)
    a = make_preconditioner("nystrom", op, rank=10, random_state=0)
    b = make_preconditioner("nystrom", op, rank=10, random_state=1)
    c = make_preconditioner("nystrom", op, rank=10, random_state=0)
    assert a.fingerprint == c.fingerprint != b.fingerprint
    assert (
        make_preconditioner("none", op).fingerprint != make_preconditioner("jacobi", op).fingerprint
    )


def test_bad_inputs():
    X = np.random.default_rng(4).normal(size=(30, 2))
    op = MatrixFreeKernelOperator(X, RBF(), 1e-2)
    with pytest.raises(ValueError, match="larger than the number of samples"):
        make_preconditioner("nystrom", op, rank=31)
    with pytest.raises(ValueError, match="rank must be"):
        make_preconditioner("nystrom", op, rank=0)
    with pytest.raises(ValueError, match="unknown preconditioner"):
        make_preconditioner("ilu", op)
    with pytest.raises(ValueError, match="Nyström method"):
        make_preconditioner("nystrom", op, rank=5, method="greedy")
    with pytest.raises(ValueError, match="shift"):
        NystromPreconditioner(np.ones((30, 2)), 0.0)
    with pytest.raises(ValueError, match="shift"):
        JacobiPreconditioner(np.ones(30), -1.0)


def test_a_small_float32_factor_applies_from_a_float64_copy_with_the_same_bits(monkeypatch):
    rng = np.random.default_rng(4)
    F = rng.standard_normal((700, 40)).astype(np.float32)
    R = rng.standard_normal((700, 3))
    trains = [np.arange(0, 500), np.arange(200, 700)]
    folds, shifts, mask = np.array([0, 1, 1]), np.array([1e-2, 1e-2, 1e-1]), np.ones((700, 3))
    small = NystromPreconditioner(F, 1e-2)
    block = FoldNystromBlock(F, trains)
    assert small._Fa.dtype == np.float64 and block._Fa.dtype == np.float64
    assert small.nbytes == F.nbytes  # (what the memory budget caps: F as built)
    monkeypatch.setattr(C, "PRECOND_F64_COPY_BYTES", F.size * 8 - 1)  # one byte short
    large = NystromPreconditioner(F, 1e-2)
    large_block = FoldNystromBlock(F, trains)
    assert large._Fa is F and large_block._Fa is F
    np.testing.assert_array_equal(small.apply(R), large.apply(R))
    np.testing.assert_array_equal(
        block.apply(R, folds, shifts, mask), large_block.apply(R, folds, shifts, mask)
    )
