"""The CG core against scipy.linalg.solve, and its stopping, warning and history rules."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg

from pipeline.kernels import RBF
from pipeline.linalg import cg as cg_module
from pipeline.linalg.cg import (
    CGConvergenceError,
    CGConvergenceWarning,
    conjugate_gradient,
)
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.linalg.precond import make_preconditioner
from pipeline.plan.fit_plan import matvec_choice, out_of_core_choice


@pytest.fixture(scope="module")
def krr():
    """A kernel ridge system (K + shift I) with a few hundred rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = np.sin(X @ np.array([1.0, -2.0, 0.5])) + 0.1 * rng.normal(size=300)
    kernel = RBF(gamma=0.5)
    shift = 1e-2
    A = kernel(X) + shift * np.eye(300)
    return X, y, kernel, shift, A


def _true_rel(A, x, b):
    return np.linalg.norm(b - A @ x, axis=0) / np.linalg.norm(b, axis=0)


def test_matches_scipy_solve_with_the_matrix_free_operator(krr):
    X, y, kernel, shift, A = krr
    op = MatrixFreeKernelOperator(X, kernel, shift, block_size=150)
    res = conjugate_gradient(op.matvec, y, tol=1e-9)
    exact = scipy.linalg.solve(A, y, assume_a="pos")
    assert res.converged
    assert np.linalg.norm(res.x - exact) / np.linalg.norm(exact) <= 1e-6
    assert _true_rel(A, res.x, y) <= 1e-9
    assert res.n_iter < 300


def test_default_tol_is_reached_on_the_true_residual(krr):
    _, y, _, _, A = krr
    res = conjugate_gradient(lambda V: A @ V, y)
    assert res.tol == 1e-6
    assert res.converged
    assert _true_rel(A, res.x, y) <= 1e-6
    assert res.rel_residual[0] == pytest.approx(_true_rel(A, res.x, y), rel=1e-6)
    # the history starts at ‖b‖/‖b‖ = 1 and has one row per iteration
    assert res.history.shape == (res.n_iter + 1, 1)
    assert res.history[0, 0] == pytest.approx(1.0)
    assert res.history[-1, 0] <= 1e-6 < res.history[-2, 0]
    assert res.start_iter == 0
    assert res.x.shape == y.shape


def test_multiple_right_hand_sides_share_products(krr):
    _, y, _, _, A = krr
    rng = np.random.default_rng(1)
    w, V = np.linalg.eigh(A)
    B = np.column_stack([y, rng.normal(size=300), np.zeros(300), V[:, -1]])
    calls = []

    def matvec(P):
        calls.append(P.shape[1])
        return A @ P

    res = conjugate_gradient(matvec, B, tol=1e-8)
    assert res.converged and res.x.shape == B.shape
    np.testing.assert_array_equal(res.x[:, 2], 0.0)  # zero right-hand side: zero solution
    exact = scipy.linalg.solve(A, B[:, [0, 1, 3]], assume_a="pos")
    err = np.linalg.norm(res.x[:, [0, 1, 3]] - exact, axis=0) / np.linalg.norm(exact, axis=0)
    assert np.all(err <= 1e-6)
    # the eigenvector column converges at once and leaves the product: later calls are narrower
    assert calls[0] == 3 and min(calls) < 3
    # a column solved alone gives the same answer as in the block
    single = conjugate_gradient(lambda P: A @ P, B[:, 1], tol=1e-8)
    # both meet tol 1e-8 in the residual; their difference is bounded by κ·tol relative to
    # the solution (3.7e-7 of an entry of the solution on AMD EPYC), not entrywise 1e-7
    diff = np.linalg.norm(single.x - res.x[:, 1]) / np.linalg.norm(res.x[:, 1])
    assert diff <= 1e-6, diff


def test_warm_start(krr):
    _, y, _, _, A = krr
    exact = scipy.linalg.solve(A, y, assume_a="pos")
    res = conjugate_gradient(lambda V: A @ V, y, x0=exact)
    assert res.converged and res.n_iter == 0
    cold = conjugate_gradient(lambda V: A @ V, y, tol=1e-8)
    warm = conjugate_gradient(lambda V: A @ V, y, x0=exact + 1e-4 * np.ones(300), tol=1e-8)
    assert warm.converged and warm.n_iter < cold.n_iter


def test_non_convergence_warns_with_the_residual(krr):
    _, y, _, _, A = krr
    with pytest.warns(CGConvergenceWarning, match=r"relative residual \d\.\d+e[-+]\d+ > tol"):
        res = conjugate_gradient(lambda V: A @ V, y, max_iter=3)
    assert not res.converged and res.n_iter == 3
    assert res.rel_residual[0] > 1e-6
    with pytest.raises(CGConvergenceError, match="max_iter=3"):
        conjugate_gradient(lambda V: A @ V, y, max_iter=3, strict=True)


def test_converged_solve_does_not_warn(krr):
    _, y, _, _, A = krr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = conjugate_gradient(lambda V: A @ V, y, strict=True)
    assert res.converged


def test_true_residual_recomputation_counts_products(krr):
    _, y, _, _, A = krr
    res = conjugate_gradient(lambda V: A @ V, y, tol=1e-9, true_residual_every=7)
    assert res.converged
    # every 7th iteration costs one extra product
    assert res.n_matvec >= res.n_iter + res.n_iter // 7
    assert _true_rel(A, res.x, y) <= 1e-9


def test_the_confirmation_rides_along_in_the_last_step_product(krr):
    """A column likely to stop after a step joins that step's product (A x_k beside
    A p_k), so its true residual ``b - A x_k - alpha A p_k`` costs no product of its own:
    with a preconditioner (the residual falls steadily) one product per iteration, the
    last with two columns (the step before may ride too, when the extrapolation was
    hopeful), against one product more without the ride; the answer meets the tolerance on
    the true residual."""
    X, y, kernel, shift, A = krr
    pre = make_preconditioner("adaptive", MatrixFreeKernelOperator(X, kernel, shift))
    widths: list[int] = []

    def counted(V):
        widths.append(V.shape[1])
        return A @ V

    res = conjugate_gradient(counted, y, preconditioner=pre, tol=1e-9, true_residual_every=0)
    assert res.converged and _true_rel(A, res.x, y) <= 1e-9
    assert res.n_iter > 5 and res.n_matvec == res.n_iter == len(widths)
    assert widths[-1] == 2 and widths.count(2) <= 2  # p and x in the last product
    with pytest.MonkeyPatch.context() as mp:  # margin 0: no column is ever likely enough
        mp.setattr(cg_module, "RIDE_MARGIN", 0.0)
        plain = conjugate_gradient(lambda V: A @ V, y, preconditioner=pre, tol=1e-9)
    assert plain.n_iter == res.n_iter and plain.n_matvec == plain.n_iter + 1
    np.testing.assert_allclose(res.x, plain.x, rtol=0, atol=1e-9 * np.abs(plain.x).max())


def test_convergence_is_judged_on_the_true_residual(krr):
    """With a noisy product the recurrence residual keeps falling below the noise floor
    while the true one stalls; the solver must not report the recurrence's value. The
    noise of each column is proportional to that column's norm, as a product's rounding
    is (a column that rides along in a product, for its confirmation, adds none to the
    others)."""
    _, y, _, _, A = krr
    rng = np.random.default_rng(5)

    def noisy(V):
        return A @ V + 1e-7 * np.linalg.norm(V, axis=0) * rng.normal(size=V.shape)

    with pytest.warns(CGConvergenceWarning):
        res = conjugate_gradient(noisy, y, tol=1e-11, max_iter=600, true_residual_every=0)
    assert not res.converged
    # what is reported is (close to) the residual of x, not the recurrence's tiny value
    assert res.rel_residual[0] > 1e-9
    assert _true_rel(A, res.x, y) > 1e-9


def test_callback_sees_the_state_and_can_stop(krr):
    _, y, _, _, A = krr
    seen = []

    def cb(state):
        seen.append((state.iteration, state.x.copy(), state.rel_residual.copy()))
        return state.iteration >= 5

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stopped by the callback: no convergence warning
        res = conjugate_gradient(lambda V: A @ V, y, callback=cb)
    assert [s[0] for s in seen] == [1, 2, 3, 4, 5]
    assert res.n_iter == 5 and not res.converged
    np.testing.assert_array_equal(seen[-1][1][:, 0], res.x)


def test_breakdown_on_an_indefinite_operator_is_reported():
    A = np.diag([1.0, -1.0, 2.0])
    with pytest.warns(CGConvergenceWarning, match="positive definite"):
        conjugate_gradient(lambda V: A @ V, np.array([1.0, 1.0, 0.0]))


def test_preconditioner_protocol(krr):
    _, y, _, _, A = krr

    class Exact:
        def apply(self, R):
            return scipy.linalg.solve(A, R, assume_a="pos")

    res = conjugate_gradient(lambda V: A @ V, y, preconditioner=Exact())
    assert res.converged and res.n_iter == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tol": 0.0}, "tol"),
        ({"tol": -1e-6}, "tol"),
        ({"tol": np.nan}, "tol"),
        ({"tol": 1.0}, "tol"),  # x = 0 "converged": an all-zero model (session 26)
        ({"tol": np.inf}, "tol"),
        ({"max_iter": 0}, "max_iter"),
        ({"max_iter": 2.5}, "max_iter"),
        ({"x0": np.ones(7)}, "x0"),
        ({"true_residual_every": -1}, "true_residual_every"),
    ],
)
def test_bad_arguments(krr, kwargs, match):
    _, y, _, _, A = krr
    with pytest.raises(ValueError, match=match):
        conjugate_gradient(lambda V: A @ V, y, **kwargs)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_right_hand_side(krr, bad):
    _, y, _, _, A = krr
    yb = y.copy()
    yb[5] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        conjugate_gradient(lambda V: A @ V, yb)


# ---------------------------------------------------------------------------
# solver="auto"
# ---------------------------------------------------------------------------
GB = 1e9


def test_choose_solver():
    # without a shift CG's iterations cannot be predicted: the λ-blind "simple" model
    def choose(*args, **kw):
        return out_of_core_choice(*args, **kw, cost_model="simple")

    name, reason, seconds = choose(5_000, 10, disk_free=100 * GB, mem_free=16 * GB)
    assert name == "cholesky" and "N=5000" in reason
    assert seconds["cholesky"] < seconds["cg"] and f"{seconds['cholesky']:.3g} s" in reason
    # too large for the exact method's cost
    assert choose(50_000, 10, 1000 * GB, 16 * GB)[0] == "cg"
    # the Gram and factor (8 N² bytes, 80 GB at N=100k) do not fit
    name, reason, seconds = choose(20_000, 10, disk_free=2 * GB, mem_free=16 * GB)
    assert name == "cg" and "disk" in reason and seconds == {}  # a rule on space decided
    # CG's memory does not fit but the store does
    name, reason, seconds = choose(20_000, 10, disk_free=100 * GB, mem_free=0.1 * GB)
    assert name == "cholesky" and "memory" in reason and seconds == {}
    with pytest.raises(ValueError, match="n_features"):
        choose(0, 10, GB, GB)


def test_choose_matvec_mode():
    assert matvec_choice(100_000, 8, 1000 * GB)[0] == "recompute"
    assert matvec_choice(20_000, 200, 1000 * GB)[0] == "stored"
    name, reason = matvec_choice(1_000_000, 200, 100 * GB)
    assert name == "recompute" and "does not fit" in reason


def test_confirm_false_stops_on_the_recursive_residual_one_product_sooner(krr, monkeypatch):
    """Without the ride (margin 0), the confirming product is confirm's only cost."""
    monkeypatch.setattr(cg_module, "RIDE_MARGIN", 0.0)
    _, y, _, _, A = krr
    calls = []

    def mv(V):
        calls.append(1)
        return A @ V

    on = conjugate_gradient(mv, y, tol=1e-8, true_residual_every=0)
    n_on = len(calls)
    calls.clear()
    off = conjugate_gradient(mv, y, tol=1e-8, true_residual_every=0, confirm=False)
    assert on.converged and off.converged and on.n_iter == off.n_iter
    # the confirming product is the only one saved: same iterates, one call less
    assert n_on == on.n_iter + 1 and len(calls) == off.n_iter == off.n_matvec
    np.testing.assert_array_equal(on.x, off.x)
    assert _true_rel(A, off.x, y) <= 1e-7  # unconfirmed: its caller checks the true residual


def _refine_dense(monkeypatch, A, y, matvec, tol):
    """refine_with_operator on a dense system, the factor a float32-rounded Cholesky."""
    from pipeline.linalg import triangular as R

    L = np.linalg.cholesky(A).astype(np.float32).astype(np.float64)

    class Op:
        def matvec(self, V):
            return matvec(V)

    def pre_apply(self, V):
        return scipy.linalg.cho_solve((L, True), V)

    monkeypatch.setattr(R.NativeFactorPreconditioner, "__init__", lambda self, f: None)
    monkeypatch.setattr(R.NativeFactorPreconditioner, "apply", pre_apply)
    stats: dict = {}
    x = R.refine_with_operator(L, Op(), y, pre_apply(None, y), tol=tol, stats=stats)
    return x, stats


def test_refinement_accepts_a_stall_at_float64_rounding_floor(krr, monkeypatch):
    X, y, kernel, _, _ = krr
    A = kernel(X) + 1e-7 * np.eye(len(y))  # |alpha| ~ 1e5 |y|: 1e-13 is out of float64's reach
    direct = scipy.linalg.cho_solve(scipy.linalg.cho_factor(A, lower=True), y)
    assert _true_rel(A, direct, y) > 1e-13  # float64's own solve misses it too
    x, stats = _refine_dense(monkeypatch, A, y, lambda V: A @ V, tol=1e-13)
    floor = stats["refine_rounding_floor"]
    assert 1e-13 < stats["rel_residual"] <= floor
    assert _true_rel(A, x, y) <= max(floor, 2 * _true_rel(A, direct, y))


def test_refinement_stalled_above_the_rounding_floor_is_an_error(krr, monkeypatch):
    from pipeline.linalg.cg import CGConvergenceError

    X, y, kernel, _, _ = krr
    A = kernel(X) + 1e-3 * np.eye(len(y))
    noise = np.random.default_rng(1)

    def noisy(V):  # a product good to 1e-9 only: far above float64's floor
        out = A @ V
        return out * (1 + 1e-9 * noise.standard_normal(out.shape))

    with pytest.raises(CGConvergenceError, match="did not converge"):
        _refine_dense(monkeypatch, A, y, noisy, tol=1e-13)


def test_refinement_spends_one_product_per_cg_iteration_plus_its_true_residuals(krr, monkeypatch):
    _, y, _, _, A = krr
    calls = []

    def counted(V):
        calls.append(1)
        return A @ V

    x, stats = _refine_dense(monkeypatch, A, y, counted, tol=1e-12)
    assert _true_rel(A, x, y) <= 1e-12
    assert stats["refine_iterations"] >= 1
    # each step: one true residual, then one product per CG iteration; one final residual
    assert len(calls) == stats["refine_iterations"] + stats["refine_steps"] + 1


def test_a_solve_resumed_at_any_iteration_rides_as_the_uninterrupted_one(krr):
    """Whether a column rides along is decided from the saved residual history alone: a
    solve stopped after any iteration and resumed from its state takes the same steps,
    rides included, and ends with the same bits."""
    X, y, kernel, shift, A = krr
    pre = make_preconditioner("adaptive", MatrixFreeKernelOperator(X, kernel, shift))
    Y = np.column_stack([y, np.cos(X[:, 0])])
    widths: list[int] = []

    def mv(V):
        widths.append(V.shape[1])
        return A @ V

    whole = conjugate_gradient(mv, Y, preconditioner=pre, tol=1e-9, true_residual_every=0)
    assert whole.converged and max(widths) > 2  # some product carried a riding column
    for stop_at in range(1, whole.n_iter):
        saved = []

        def stop(state, k=stop_at, saved=saved):
            saved.append(state.copy())
            return state.iteration >= k

        conjugate_gradient(
            lambda V: A @ V, Y, preconditioner=pre, tol=1e-9, true_residual_every=0,
            callback=stop,
        )  # fmt: skip
        resumed = conjugate_gradient(
            lambda V: A @ V, Y, preconditioner=pre, tol=1e-9, true_residual_every=0,
            state=saved[-1],
        )  # fmt: skip
        assert resumed.n_iter == whole.n_iter and resumed.n_matvec == whole.n_matvec
        np.testing.assert_array_equal(resumed.x, whole.x)
