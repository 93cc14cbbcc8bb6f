"""Mixed-precision CG, the typed CG errors (stagnation, NaN, indefinite kernel) and the
CG cost model against measured iterations."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline import constants
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
    build_nystrom,
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
    pre = build_nystrom(op, centres="adaptive", shift=op.shift, factor=50).woodbury(op.shift)
    return op, y, pre


def _true_rel(op, x, y):
    return float(np.linalg.norm(y - op.matvec(x)) / np.linalg.norm(y))


def test_mixed_reaches_1e10_where_float32_only_cannot(hard):
    """Float32-only CG is given more float32 products (50) than the mixed solve uses in
    all (38 here): its true residual is at the float32 product's floor by then (4.78e-4
    after 25, 50, 100 and 300 iterations alike), so more iterations (this test ran 300,
    10 s) would not take it below 1e-8 either."""
    op, y, pre = hard
    lo = float32_twin(op)
    assert lo.kernel_dtype == "float32"
    m = mixed_precision_cg(op.matvec, lo.matvec, y, preconditioner=pre, tol=1e-10)
    assert m.converged and m.rel_residual <= 1e-10
    assert _true_rel(op, m.x, y) <= 1e-10
    assert m.n_matvec_high == m.n_outer <= 10
    assert m.history[0] == 1.0 and m.history[-1] == m.rel_residual
    budget = 50
    assert m.n_matvec_low < budget
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        r32 = conjugate_gradient(
            lo.matvec, y, preconditioner=pre, tol=1e-10, max_iter=budget, stagnation_window=None
        )
    assert r32.n_matvec >= budget  # it ran out of products, never reaching its tolerance
    assert _true_rel(op, r32.x, y) > 1e-8  # the float32 product's floor


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
    F = build_nystrom(op, centres="rpcholesky", rank=rank).F
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
    assert constants.rank_for_budget(40_000, 1 << 30) == 6710
    assert cg_cost.nystrom_memory_bytes(40_000, 2000) < 2e9
    # 1.15 float32 iterations per float64 one while N/μ <= 2e6, 1.7 beyond (the variants
    # grid, bench_policy_grid_variants.json); one float64 product per 3 digits of tol
    assert cg_cost.mixed_precision_products(10, 1e-10) == (12, 4)
    assert cg_cost.mixed_precision_products(10, 1e-10, n_over_shift=1e5) == (12, 4)
    assert cg_cost.mixed_precision_products(10, 1e-6, n_over_shift=1e7) == (17, 2)
    assert CalibratedCostModel(rank=2000).cg_seconds(40_000, 9, shift=1e-2, tol=1e-6, rho=1.0) > 0
    with pytest.raises(ValueError, match="tol"):
        cg_cost.chebyshev_iterations(1.0, 1.0, 2.0)


# -- the one refinement loop (issue #43) ----------------------------------------------


def test_refinement_loop_asks_what_the_target_needs_and_skips_frozen_columns():
    # a fake step that divides each residual by 2^10: the loop asks every live column
    # above its target for max(margin * target / rel, floor), capped at 0.5, and never
    # touches a frozen column or one already at its target
    from pipeline.linalg.cg_mixed import iterative_refinement

    rel = np.array([1.0, 2.0**-10, 2.0**-40, 1.0])
    target = np.full(4, 2.0**-30)
    live = np.array([True, True, True, False])
    asked = []

    def step(k, cols, inner):
        asked.append((k, cols.tolist(), inner.tolist()))
        rel[cols] /= 2.0**10
        return True

    n = iterative_refinement(rel, target, step, max_steps=10, inner_floor=1e-4,
                             margin=0.5, live=lambda: live)  # fmt: skip
    assert n == 3
    assert [a[1] for a in asked] == [[0, 1], [0, 1], [0]]
    np.testing.assert_allclose(asked[0][2], [1e-4, 1e-4])  # the floor
    assert asked[2][2] == [2.0**-11]  # what the target needs: 0.5 * 2^-30 / 2^-20
    assert rel[3] == 1.0 and rel[2] == 2.0**-40
    # a step returning False ends it; max_steps bounds it
    assert iterative_refinement(np.ones(2), np.zeros(2), lambda k, c, i: False,
                                max_steps=5, inner_floor=0.0) == 1  # fmt: skip
    assert iterative_refinement(np.ones(1), np.zeros(1), lambda k, c, i: True,
                                max_steps=4, inner_floor=0.0) == 4  # fmt: skip


def test_mixed_cg_and_the_block_cv_refine_with_the_one_loop(monkeypatch, hard):
    """Issue #43: the block CV (pipeline.models.selection.cvblock) had its own outer
    mixed-precision refinement loop beside mixed_precision_cg's; both now run
    pipeline.linalg.cg_mixed.iterative_refinement (bits unchanged), and both still
    reach the float64 target against dense solves."""
    import pipeline.linalg.cg_mixed as cg_mixed
    import pipeline.models.selection.cvblock as cvblock
    from pipeline.models.selection.cvblock import block_cv_predictions

    real = cg_mixed.iterative_refinement
    used = []

    def spy(*a, **k):
        used.append(k["inner_floor"])
        return real(*a, **k)

    monkeypatch.setattr(cg_mixed, "iterative_refinement", spy)
    monkeypatch.setattr(cvblock, "iterative_refinement", spy)
    op, y, pre = hard
    m = mixed_precision_cg(op.matvec, float32_twin(op).matvec, y, preconditioner=pre, tol=1e-10)
    assert m.converged and _true_rel(op, m.x, y) <= 1e-10
    assert used == [1e-3]  # mixed_precision_cg's inner_tol
    rng = np.random.default_rng(3)
    n = 240
    X = rng.standard_normal((n, 3))
    Y = np.column_stack([np.sin(X[:, 0]), X[:, 1]]) + 0.1 * rng.standard_normal((n, 2))
    op64 = MatrixFreeKernelOperator(X, RBF(gamma=0.5), 1.0, block_size=64)
    K = RBF(gamma=0.5)(X)
    tests = [np.sort(t) for t in np.array_split(rng.permutation(n), 3)]
    trains = [np.setdiff1d(np.arange(n), t) for t in tests]
    shifts = np.array([[a * len(tr) for tr in trains] for a in (1e-1, 1e-3)])
    preds = block_cv_predictions(op64, Y, trains, tests, shifts, op32=float32_twin(op64),
                                 tol=1e-11)  # fmt: skip
    assert used[1:] == [constants.CV_INNER_TOL]  # the block CV, float32 inner products
    for f, (tr, te) in enumerate(zip(trains, tests)):
        for li in range(2):
            a = np.linalg.solve(K[np.ix_(tr, tr)] + shifts[li, f] * np.eye(len(tr)), Y[tr])
            want = K[np.ix_(te, tr)] @ a
            assert np.linalg.norm(preds[f][li] - want) / np.linalg.norm(want) < 1e-9
