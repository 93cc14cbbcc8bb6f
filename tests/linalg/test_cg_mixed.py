"""Mixed-precision CG, the typed CG errors (stagnation, NaN, indefinite kernel) and the
CG cost model against measured iterations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline.kernels import RBF, Sigmoid
from pipeline.linalg.cg import (
    CGConvergenceWarning,
    CGDivergenceError,
    CGIndefiniteKernelError,
    CGStagnationError,
    conjugate_gradient,
)
from pipeline.linalg.cg_mixed import float32_twin, mixed_precision_cg
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.linalg.precond import (
    NystromPreconditioner,
    adaptive_nystrom_preconditioner,
    rpcholesky,
)
from pipeline.plan import cg_cost
from pipeline.plan.calibrated import CalibratedCostModel


@pytest.fixture(scope="module")
def hard():
    """N = 2,000, RBF γ = 0.1 in 5-D, shift 1e-3: cond(K + μI) ~ 1e6."""
    rng = np.random.default_rng(0)
    n = 2000
    X = rng.normal(size=(n, 5))
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=n)
    op = MatrixFreeKernelOperator(X, RBF(gamma=0.1), 1e-3, block_size=512)
    pre = adaptive_nystrom_preconditioner(op, factor=50)
    return op, y, pre


def _true_rel(op, x, y):
    return float(np.linalg.norm(y - op.matvec(x)) / np.linalg.norm(y))


def test_mixed_reaches_1e10_where_float32_only_cannot(hard):
    op, y, pre = hard
    lo = float32_twin(op)
    assert lo.kernel_dtype == "float32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        r32 = conjugate_gradient(
            lo.matvec, y, preconditioner=pre, tol=1e-10, max_iter=300, stagnation_window=None
        )
    assert _true_rel(op, r32.x, y) > 1e-8  # the float32 product's floor
    m = mixed_precision_cg(op.matvec, lo.matvec, y, preconditioner=pre, tol=1e-10)
    assert m.converged and m.rel_residual <= 1e-10
    assert _true_rel(op, m.x, y) <= 1e-10
    assert m.n_matvec_high == m.n_outer <= 10
    assert m.history[0] == 1.0 and m.history[-1] == m.rel_residual


def test_mixed_needs_a_matrix_free_operator():
    with pytest.raises(ValueError, match="matrix-free"):
        float32_twin(object())


def test_stagnation_raises_typed_error_with_advice():
    # a nonsymmetric "operator" on which CG cannot make progress
    rng = np.random.default_rng(1)
    n = 60
    A = np.eye(n) + 0.9 * np.tril(rng.normal(size=(n, n)), -1) * 3
    b = rng.normal(size=n)
    with pytest.raises(
        CGStagnationError, match="cholesky.*larger lambda.*higher preconditioner rank"
    ):
        conjugate_gradient(lambda V: A @ V, b, tol=1e-12, max_iter=10_000, stagnation_window=15)


def test_nan_in_the_product_raises_at_once():
    calls = []

    def bad(V):
        calls.append(1)
        out = 2.0 * V
        if len(calls) == 3:
            out[0] = np.nan
        return out

    b = np.random.default_rng(0).normal(size=30)
    with pytest.raises(CGDivergenceError, match="NaN or inf"):
        # a diagonal with spread so that CG needs more than 3 products
        conjugate_gradient(lambda V: bad(V) * np.linspace(1, 50, 30)[:, None], b, tol=1e-12)
    assert len(calls) == 3


def test_nan_from_the_preconditioner_raises():
    class Bad:
        def apply(self, R):
            return np.full_like(R, np.inf)

    with pytest.raises(CGDivergenceError, match="preconditioner"):
        conjugate_gradient(lambda V: 2 * V, np.ones(5), preconditioner=Bad())


def test_indefinite_kernel_is_refused_before_any_product():
    X = np.random.default_rng(0).normal(size=(50, 3))
    op = MatrixFreeKernelOperator(X, Sigmoid(), 1e-2, block_size=32)
    with pytest.raises(CGIndefiniteKernelError, match="positive semi-definite"):
        conjugate_gradient(op.matvec, np.ones(50))
    with pytest.raises(CGIndefiniteKernelError):
        conjugate_gradient(op, np.ones(50))


@pytest.mark.parametrize(
    ("gamma", "shift", "rank"), [(0.1, 1e-2, 40), (0.1, 1e-3, 80), (0.5, 1e-2, 150)]
)
def test_cg_cost_iterations_against_measured(gamma, shift, rank):
    rng = np.random.default_rng(2)
    n = 1200
    X = rng.normal(size=(n, 4))
    K = RBF(gamma=gamma)(X)
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    from pipeline.models.selection.route import DenseKernelOperator

    op = DenseKernelOperator(K, shift)
    F, _ = rpcholesky(op, rank)
    rho = float(np.linalg.eigvalsh(K - F @ F.T)[-1])
    pre = NystromPreconditioner(F, shift)
    res = conjugate_gradient(op.matvec, y, preconditioner=pre, tol=1e-6, max_iter=5000)
    assert res.converged
    bound = cg_cost.chebyshev_iterations(rho, shift, 1e-6)
    pred = cg_cost.predicted_iterations(rho, shift, 1e-6)
    assert res.n_iter <= bound  # a bound
    assert pred / 3 <= res.n_iter <= pred * 3, (pred, res.n_iter)  # stated factor: 3


def test_cg_cost_product_and_memory_figures():
    t64 = cg_cost.product_seconds(40_000, 14, "float64")
    t32 = cg_cost.product_seconds(40_000, 14, "float32")
    # measured 0.95 s per product at 40k with D = 9 (bench_hard_auto.py), so about
    # 1.1 s at D = 14 (before the fused engine: 1.5-3 s)
    assert 0.8 < t64 < 3 and t32 < t64
    assert cg_cost.product_seconds(40_000, 100) > t64
    assert cg_cost.rank_for_budget(40_000, 1 << 30) == 6710
    assert cg_cost.nystrom_memory_bytes(40_000, 2000) < 2e9
    # 1.15 float32 iterations per float64 one while N/μ <= 2e6, 1.7 beyond (the variants
    # grid, bench_policy_grid_variants.json); one float64 product per 3 digits of tol
    assert cg_cost.mixed_precision_products(10, 1e-10) == (12, 4)
    assert cg_cost.mixed_precision_products(10, 1e-10, n_over_shift=1e5) == (12, 4)
    assert cg_cost.mixed_precision_products(10, 1e-6, n_over_shift=1e7) == (17, 2)
    assert CalibratedCostModel(rank=2000).cg_seconds(40_000, 9, shift=1e-2, tol=1e-6, rho=1.0) > 0
    with pytest.raises(ValueError, match="tol"):
        cg_cost.chebyshev_iterations(1.0, 1.0, 2.0)
