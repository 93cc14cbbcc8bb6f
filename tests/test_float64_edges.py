"""Numbers at the edges of float64: targets and features of order 1e-200 or 1e200, and
lambda down to 1e-300, give the right numbers or a clear error, never a quiet wrong one.

History (issue #44, class 7): CG summed squares unscaled, so a y of order 1e-200 had
``‖y‖ = 0`` and CG stopped at iteration 0 with alpha = 0 and exit 0 (1e-160: alpha
0.75 % off; 1e200: ``‖y‖ = inf``, alpha = 0). The CG cost model divided by
``log((√κ+1)/(√κ-1))``, which rounds to 0 for lambda <= about 1e-30: a
ZeroDivisionError even for ``solver: cholesky``. Ingest took the standard deviation
of X of order 1e154 as inf, standardised every row to 0, and the Gram and the solve
ran on zeros before the model stage refused the scaler.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
import scipy.linalg

from pipeline.float_range import SAFE_EXPONENT, pow2_exponents
from pipeline.kernels import RBF
from pipeline.linalg.cg import CGConvergenceWarning, conjugate_gradient

LAMBDAS = [1e-300, 1e-31, 1e-12, 1.0, 1e300]


@pytest.fixture(scope="module")
def system():
    """An RBF system ``K + I`` (condition number about 36) and its target."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 3))
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=150)
    K = RBF(gamma=0.5)(X)
    return X, K, y


def _rel_err(x: np.ndarray, ref: np.ndarray, factor: float) -> float:
    """‖x - ref‖ / ‖ref‖ on x / factor (the norms of x itself would underflow)."""
    return float(np.linalg.norm(x / factor - ref / factor) / np.linalg.norm(ref / factor))


# ----------------------------------------------------------------------------- pow2_exponents


def test_pow2_exponents_leave_the_safe_range_alone_and_bring_the_rest_near_one():
    edge = 2.0**SAFE_EXPONENT
    amax = np.array([0.0, 1.0, 1e-30, 1e30, edge / 2, edge, 1e-200, 1e200, 5e-324, np.inf])
    k = pow2_exponents(amax)
    assert k.dtype == np.int64
    np.testing.assert_array_equal(k[:5], 0)
    assert k[-1] == 0  # not finite: not ours to scale (the callers refuse it)
    far = np.ldexp(amax[5:-1], k[5:-1])
    assert np.all((far >= 0.5) & (far < 1.0))
    assert pow2_exponents(2.0**-SAFE_EXPONENT) == 0
    assert pow2_exponents(2.0 ** -(SAFE_EXPONENT + 1)) == SAFE_EXPONENT


# ------------------------------------------------------------------------- conjugate_gradient


@pytest.mark.parametrize("factor", [1e-200, 1e-160, 1e200])
@pytest.mark.parametrize("tol", [1e-8, 1e-10])
def test_cg_alpha_matches_the_cholesky_for_tiny_and_huge_targets(system, factor, tol):
    """Old code: 1e-200 and 1e200 gave alpha = 0 (relative error 1), 1e-160 4e-3."""
    _, K, y = system
    A = K + np.eye(len(y))
    ref = scipy.linalg.cho_solve(scipy.linalg.cho_factor(A), y * factor)
    res = conjugate_gradient(lambda V: A @ V, y * factor, tol=tol)
    assert res.converged and res.n_iter > 0
    assert _rel_err(res.x, ref, factor) <= 10 * tol  # measured: at most 2.3 tol


@pytest.mark.parametrize("k", [-700, -120, 120, 700])
def test_cg_on_a_power_of_two_multiple_of_y_is_the_same_solve(system, k):
    """2**k y takes the same steps: the same iterations and alpha times 2**k, bit for bit;
    columns of other magnitudes solved together keep their own solves."""
    _, K, y = system
    A = K + 0.1 * np.eye(len(y))
    base = conjugate_gradient(lambda V: A @ V, y, tol=1e-10)
    far = conjugate_gradient(lambda V: A @ V, np.ldexp(y, k), tol=1e-10)
    assert far.n_iter == base.n_iter and far.converged
    np.testing.assert_array_equal(far.x, np.ldexp(base.x, k))
    np.testing.assert_array_equal(far.history, base.history)
    # (a product of two columns is another BLAS call than of one: compare like with like)
    two = conjugate_gradient(lambda V: A @ V, np.column_stack([np.ldexp(y, k), y]), tol=1e-10)
    twin = conjugate_gradient(lambda V: A @ V, np.column_stack([y, y]), tol=1e-10)
    np.testing.assert_array_equal(two.x[:, 0], np.ldexp(twin.x[:, 0], k))
    np.testing.assert_array_equal(two.x[:, 1], twin.x[:, 1])


def test_cg_warm_start_and_callback_state_of_a_scaled_solve(system):
    """x0 is scaled with y; the callback's state is that of ``2**k y`` and says k."""
    _, K, y = system
    A = K + 0.1 * np.eye(len(y))
    b = y * 1e-200
    ref = scipy.linalg.cho_solve(scipy.linalg.cho_factor(A), b)
    seen = []

    def keep(st):
        seen.append((st.rhs_exponent.copy(), np.ldexp(st.x[:, 0], -st.rhs_exponent[0])))

    res = conjugate_gradient(lambda V: A @ V, b, x0=ref * (1 + 1e-6), tol=1e-10, callback=keep)
    assert res.converged and _rel_err(res.x, ref, 1e-200) <= 1e-9
    assert seen and seen[0][0][0] == pow2_exponents(np.max(np.abs(b))) != 0
    assert _rel_err(seen[-1][1], ref, 1e-200) <= 1e-9  # the state's x, scaled back
    plain = []
    conjugate_gradient(lambda V: A @ V, y, tol=1e-6, callback=lambda st: plain.append(st))
    assert plain[0].rhs_exponent is None  # an ordinary y is not scaled


def test_cg_checkpoint_resume_of_a_tiny_target_is_the_uninterrupted_solve(system, tmp_path):
    from pipeline.linalg.cg_checkpoint import resumable_cg

    _, K, y = system
    A = K + 0.1 * np.eye(len(y))
    b = y * 1e-200
    whole = conjugate_gradient(lambda V: A @ V, b, tol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        cut = resumable_cg(
            lambda V: A @ V, b, str(tmp_path), fingerprint="edge", every=5, tol=1e-10,
            callback=lambda st: st.iteration >= 12,
        )  # fmt: skip
    assert not cut.converged and cut.n_iter == 12
    resumed = resumable_cg(lambda V: A @ V, b, str(tmp_path), fingerprint="edge", every=5,
                           tol=1e-10)  # fmt: skip
    assert resumed.start_iter == 10 and resumed.n_iter == whole.n_iter
    np.testing.assert_array_equal(resumed.x, whole.x)


def test_cg_resumes_a_state_saved_unscaled(system):
    """A state of ``A x = b`` itself (as the code before the scaling saved one, for b
    just outside the safe range) is scaled on resume: the same alpha, bit for bit."""
    _, K, y = system
    A = K + 0.1 * np.eye(len(y))
    k = SAFE_EXPONENT + 20
    b = np.ldexp(y, -k)  # max |b| below 2**-SAFE_EXPONENT: solved as 2**k b
    whole = conjugate_gradient(lambda V: A @ V, b, tol=1e-10)
    states = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        conjugate_gradient(lambda V: A @ V, y, tol=1e-10, max_iter=7,
                           callback=lambda st: states.append(st.copy()))  # fmt: skip
    old = states[-1]
    for name in ("x", "r", "p", "z"):  # the unscaled system's state
        setattr(old, name, np.ldexp(getattr(old, name), -k))
    old.rz, old.b_norm = np.ldexp(old.rz, -2 * k), np.linalg.norm(b.reshape(-1, 1), axis=0)
    resumed = conjugate_gradient(lambda V: A @ V, b, tol=1e-10, state=old)
    assert resumed.start_iter == 7 and resumed.n_iter == whole.n_iter
    np.testing.assert_array_equal(resumed.x, whole.x)


# ------------------------------------------------------------------------- mixed precision CG


@pytest.mark.parametrize("factor", [1e-200, 1e200])
def test_mixed_precision_cg_matches_the_cholesky_for_tiny_and_huge_targets(system, factor):
    """Old code: 1e-200 returned alpha = 0 as converged; 1e200 diverged (inf norm)."""
    from pipeline.linalg.cg_mixed_fit import mixed_cg_fit
    from pipeline.linalg.matvec import MatrixFreeKernelOperator

    X, K, y = system
    op = MatrixFreeKernelOperator(X, RBF(gamma=0.5), 1.0, block_size=64)
    ref = scipy.linalg.cho_solve(scipy.linalg.cho_factor(K + np.eye(len(y))), y * factor)
    res = mixed_cg_fit(op, y * factor, tol=1e-10, max_iter=500)
    assert res.converged and res.n_iter > 0
    assert _rel_err(res.x, ref, factor) <= 1e-9


def test_mixed_precision_cg_checkpoints_the_unscaled_iterate(system, tmp_path):
    """The outer iterate it checkpoints (and resumes as x0) is alpha's, not 2**k alpha's."""
    from pipeline.linalg.cg_mixed import float32_twin, mixed_precision_cg
    from pipeline.linalg.matvec import MatrixFreeKernelOperator

    X, K, y = system
    op = MatrixFreeKernelOperator(X, RBF(gamma=0.5), 1.0, block_size=64)
    b = y * 1e-200
    ref = scipy.linalg.cho_solve(scipy.linalg.cho_factor(K + np.eye(len(y))), b)
    outer = []
    m = mixed_precision_cg(op.matvec, float32_twin(op).matvec, b, tol=1e-10,
                           on_outer=lambda k, x, rel: outer.append(x.copy()))  # fmt: skip
    assert m.converged and _rel_err(outer[-1], ref, 1e-200) <= 1e-9
    again = mixed_precision_cg(op.matvec, float32_twin(op).matvec, b, tol=1e-10, x0=outer[0])
    assert again.converged and _rel_err(again.x, ref, 1e-200) <= 1e-9


# ------------------------------------------------------------------ CV: block PCG and CG path


def _folds(n, nf=3):
    idx = np.arange(n)
    tests = np.array_split(idx, nf)
    return [np.setdiff1d(idx, t) for t in tests], tests


def _dense_preds(K, y, trains, tests, shifts):
    out = []
    for f, (tr, te) in enumerate(zip(trains, tests)):
        row = []
        for s in shifts[:, f]:
            a = scipy.linalg.solve(K[np.ix_(tr, tr)] + s * np.eye(len(tr)), y[tr], assume_a="pos")
            row.append(K[np.ix_(te, tr)] @ a)
        out.append(row)
    return out


@pytest.mark.parametrize("factor", [1e-200, 1e200])
@pytest.mark.parametrize("path", ["block", "cgpath"])
def test_cv_predictions_match_the_dense_ones_for_tiny_and_huge_targets(system, factor, path):
    """Old code: the block CV's columns had ‖b‖ = 0 (never solved: predictions 0) or inf."""
    from pipeline.linalg.dense_operator import DenseKernelOperator
    from pipeline.models.selection.cgpath import cg_fold_predictions
    from pipeline.models.selection.cvblock import block_cv_predictions

    _, K, y = system
    Y = np.column_stack([y, y[::-1]]) * factor
    trains, tests = _folds(len(y))
    shifts = np.repeat(np.array([[1.0], [0.3]]), 3, axis=1)
    fn = block_cv_predictions if path == "block" else cg_fold_predictions
    got = fn(DenseKernelOperator(K, 1.0), Y, trains, tests, shifts, preconditioner="none",
             tol=1e-10)  # fmt: skip
    ref = _dense_preds(K, Y, trains, tests, shifts)
    for f in range(3):
        for li in range(2):
            assert _rel_err(got[f][li], ref[f][li], factor) <= 1e-8


def test_block_pcg_on_a_power_of_two_multiple_is_the_same_solve(system):
    from pipeline.models.selection.blockcg import FoldNystromBlock, block_pcg

    _, K, y = system
    n = len(y)
    masks = np.ones((1, n), dtype=bool)
    B = np.column_stack([y, np.ldexp(y, -700), np.ldexp(y, 700)])

    def solve(B):
        return block_pcg(
            lambda V: K @ V,
            B,
            np.full(B.shape[1], 0.1),
            np.zeros(B.shape[1], int),
            masks,
            FoldNystromBlock(None, [np.arange(n)]),
            tol=1e-10,
            max_iter=500,
        )

    res = solve(B)
    assert all(r is None for r in res.reason)
    np.testing.assert_array_equal(res.x[:, 1], np.ldexp(res.x[:, 0], -700))
    np.testing.assert_array_equal(res.x[:, 2], np.ldexp(res.x[:, 0], 700))
    # the ordinary column's solve is that of three ordinary columns (same BLAS calls)
    np.testing.assert_array_equal(res.x[:, 0], solve(np.column_stack([y, y, y])).x[:, 0])


# ---------------------------------------------------------------------------- the cost models


@pytest.mark.parametrize("lam", LAMBDAS)
def test_cg_cost_functions_are_finite_for_any_positive_lambda(lam):
    """Old code: ZeroDivisionError at lambda 1e-31 and 1e-300."""
    from pipeline.plan import cg_cost
    from pipeline.plan.calibrated import CalibratedCostModel

    n, d = 50_000, 8
    its = cg_cost.chebyshev_iterations(1e3, lam, 1e-8)
    assert 1 <= its <= cg_cost.MAX_PREDICTED_ITERATIONS
    assert 1 <= cg_cost.predicted_iterations(1e3, lam, 1e-8) <= its
    for dtype in ("float64", "float32", "mixed"):
        cm = CalibratedCostModel(rank=100, kernel_dtype=dtype)
        t = cm.cg_seconds(n, d, shift=lam, tol=1e-8, rho=1e3)
        assert math.isfinite(t) and t > 0
    cm = CalibratedCostModel()
    for kw in ({}, {"matvec": "stored"}, {"precision": "mixed"}, {"rho": 10.0}):
        t = cm.cg_seconds(n, d, shift=lam, tol=1e-8, **kw)
        assert math.isfinite(t) and t > 0
    pred = cm.predict(n, d, shift=lam, tol=1e-8)
    assert all(math.isfinite(pred[k]) for k in ("cholesky_seconds", "cg_seconds", "rho"))


def test_cg_iterations_fall_as_lambda_grows_and_keep_their_old_values():
    from pipeline.plan import cg_cost

    its = [cg_cost.chebyshev_iterations(1e3, lam, 1e-8) for lam in LAMBDAS]
    assert its == sorted(its, reverse=True) and its[-1] == 1
    assert its[0] == cg_cost.MAX_PREDICTED_ITERATIONS > its[1]
    assert cg_cost.chebyshev_iterations(1e300, 1e-300, 1e-8) == cg_cost.MAX_PREDICTED_ITERATIONS
    for kappa in np.geomspace(1.001, 1e8 - 1, 57):  # the old formula, bit for bit
        s = math.sqrt(kappa)
        old = max(1, math.ceil(math.log(2.0 / 1e-6) / math.log((s + 1.0) / (s - 1.0))))
        assert cg_cost.chebyshev_bound(kappa, 1e-6) == old
    # past sqrt(kappa) = 1e4 the bound is log(2/tol) sqrt(kappa) / 2 to first order
    assert cg_cost.chebyshev_bound(1e20, 1e-6) == pytest.approx(math.log(2e6) * 1e10 / 2, 1e-9)


@pytest.mark.parametrize("lam", LAMBDAS)
def test_cv_routing_is_finite_for_any_positive_lambda(lam):
    from pipeline.plan.cv_routing import route_choice

    solver, its, cg_s, band_s = route_choice(
        10.0, 0.01, [[lam] * 3], [100] * 3, gemm_rate_one_thread=1e10, n_workers=2, tol=1e-8
    )
    assert solver in ("cg", "band") and its >= 1 and math.isfinite(cg_s)


@pytest.fixture(scope="module")
def plan_probes():
    """The probes of 3000 x 4 rows under RBF(gamma=0.5), their Nyström residual measured
    once for the module (a seeded subsample: the same figure for every lambda and solver
    below; measured anew it cost about 1.5 s in each of 8 plans)."""
    from pipeline.engine.placement import Probes
    from pipeline.fit import row_probes

    X = np.random.default_rng(0).normal(size=(3000, 4))
    p = row_probes(X, RBF(gamma=0.5))
    return Probes(p.x_in_memory, functools.cache(p.residual), p.float32_risk)


@pytest.mark.parametrize("lam", LAMBDAS)
@pytest.mark.parametrize("solver", ["auto", "cholesky", "cg"])
def test_plan_fit_prices_any_positive_lambda(plan_probes, lam, solver):
    """Old code: ``plan_fit`` raised ZeroDivisionError for lambda 1e-300 whatever the solver."""
    from pipeline.engine.placement import Resources
    from pipeline.plan.fit_plan import plan_fit

    res = Resources(memory_bytes=1e12, disk_bytes=1e13, in_memory=False)
    k = RBF(gamma=0.5)
    plan, why = plan_fit(3000, 4, k, res, {"solver": solver, "alpha": lam}, probes=plan_probes)
    assert plan.solver in ("cholesky", "cg") and why
    if solver != "auto":
        assert plan.solver == solver


# -------------------------------------------------------------------------- ingest's moments


def _ingest(tmp_path, name, X, y, standardize_y=False):
    from pipeline.stages import ingest, typed_params
    from pipeline.stages.ingest import open_rows

    d = tmp_path / name
    d.mkdir()
    np.save(d / "X.npy", X)
    np.save(d / "y.npy", y)
    params = dict(
        data={"source": "npy", "path": str(d / "X.npy"), "y_path": str(d / "y.npy")},
        split={"test_fraction": 0.25, "seed": 1},
        preprocess={"standardize": True, "standardize_y": standardize_y},
        block_size=64,
    )
    out = ingest.run(d / "ing", {}, **typed_params("ingest", params))

    def rows(key):
        return np.asarray(open_rows(out, key).compute(scheduler="sync"))

    return out.to_json(), rows("X_train"), rows("y_train")


@pytest.fixture(scope="module")
def features():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 3)) * [1.0, 5.0, 0.2] + [0.0, 3.0, -1.0]
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=300)


@pytest.mark.parametrize("k", [600, 511, -600, -1000])
def test_ingest_standardises_power_of_two_multiples_of_x_bit_for_bit(tmp_path, features, k):
    """X times 2**600 (about 4e180: its squares overflow) or 2**-1000 (subnormal squares)
    standardise to the same stored rows as X; the scaler is X's times 2**k exactly.
    Old code: scale inf, every stored training row 0."""
    X, y = features
    base, X0, _ = _ingest(tmp_path, "base", X, y)
    far, Xk, _ = _ingest(tmp_path, "far", np.ldexp(X, k), y)
    for key in ("mean", "scale"):
        np.testing.assert_array_equal(
            far["scaler"][key], np.ldexp(np.asarray(base["scaler"][key]), k)
        )
    np.testing.assert_array_equal(Xk, X0)


def test_ingest_standardises_x_and_y_of_order_1e154(tmp_path, features):
    X, y = features
    base, X0, y0 = _ingest(tmp_path, "base", X, y, standardize_y=True)
    big, Xb, yb = _ingest(tmp_path, "big", X * 1e154, y * 1e154, standardize_y=True)
    assert np.all(np.isfinite(big["scaler"]["scale"])) and np.all(np.isfinite(Xb))
    np.testing.assert_allclose(np.asarray(big["scaler"]["scale"]) / 1e154,
                               base["scaler"]["scale"], rtol=1e-13)  # fmt: skip
    np.testing.assert_allclose(np.asarray(big["y_scaler"]["mean"]) / 1e154,
                               base["y_scaler"]["mean"], rtol=1e-13)  # fmt: skip
    np.testing.assert_allclose(Xb, X0, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(yb, y0, rtol=1e-12, atol=1e-12)


def test_krr_run_on_x_of_order_1e154_predicts_as_on_x(tmp_path, features):
    """Old code: the model stage failed on an infinite ``x_scale`` after the Gram and
    the solve had run on rows standardised to 0 (exit 4)."""
    from pipeline import cli

    X, y = features
    preds = {}
    for name, factor in (("plain", 1.0), ("big", 1e154)):
        d = tmp_path / name
        d.mkdir()
        np.save(d / "X.npy", X[:200] * factor)
        np.save(d / "y.npy", y[:200])
        (d / "c.yaml").write_text(
            f"name: edge\n"
            f"data: {{source: npy, path: {d / 'X.npy'}, y_path: {d / 'y.npy'}}}\n"
            "split: {test_fraction: 0.25, seed: 0}\n"
            "preprocess: {standardize: true, standardize_y: false}\n"
            "kernel: {name: rbf, params: {gamma: 0.2}}\n"
            "lambda: 0.5\n"
            "solver: {method: cholesky}\n"
            "block_size: 64\n"
            "cluster: {n_workers: 1, processes: false, memory_limit: 1GiB, dashboard: false}\n"
        )
        assert cli.main(["run", str(d / "c.yaml"), "--run-dir", str(d / "r")]) == cli.EXIT_OK
        (found,) = (d / "r" / "results").glob("*/evaluate/y_pred.npy")
        preds[name] = np.load(found)
    np.testing.assert_allclose(preds["big"], preds["plain"], rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------- held-out metrics


@pytest.mark.parametrize("k", [-700, 700])
def test_regression_metrics_of_power_of_two_multiples_are_scaled_exactly(k):
    """Old code: rmse 0 and r2 1.0 at 2**-700 (whatever the predictions), inf/NaN at 2**700."""
    from pipeline.stages.evaluate import regression_metrics

    rng = np.random.default_rng(2)
    y = rng.normal(size=(40, 2))
    pred = y + 0.3 * rng.normal(size=(40, 2))
    names = ["rmse", "mae", "r2"]
    base = regression_metrics(y, pred, names)
    far = regression_metrics(np.ldexp(y, k), np.ldexp(pred, k), names)
    assert far["rmse"] == np.ldexp(base["rmse"], k) and far["mae"] == np.ldexp(base["mae"], k)
    assert far["r2"] == base["r2"] < 0.99


@pytest.mark.parametrize("factor", [1e-200, 1e200])
def test_regression_metrics_of_tiny_and_huge_targets(factor):
    from pipeline.stages.evaluate import regression_metrics

    rng = np.random.default_rng(3)
    y = rng.normal(size=50)
    pred = y + 0.3 * rng.normal(size=50)
    base = regression_metrics(y, pred, ["rmse", "r2"])
    got = regression_metrics(y * factor, pred * factor, ["rmse", "r2"])
    assert got["rmse"] / factor == pytest.approx(base["rmse"], rel=1e-12)
    assert got["r2"] == pytest.approx(base["r2"], rel=1e-12)


# ----------------------------------------------------------------------- KernelRidgeCV scores

# History (issue #44, class 7): KernelRidgeCV scored the held-out predictions with
# scikit-learn's scorers on y itself, whose squares underflow or overflow: on a y of
# order 1e-200 every mean test score was 1.0 (R²) and best_params_ the first candidate,
# on 1e200 every score NaN. The search now runs on 2**k y (exact) and converts back.

CV_SOLVERS = ["dense", "cg", "band", "auto"]


@pytest.fixture(scope="module")
def cv_data():
    """Noisy data whose best (λ, γ) is neither the first candidate nor the last."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(96, 3))
    y = np.sin(X.sum(1)) + 0.3 * rng.normal(size=96)
    return X, y / (2 * np.abs(y).max())  # max |y| = 0.5: 2**j y is y's search, exactly


def _cv(solver: str, scoring=None):
    from pipeline.models.selection import KernelRidgeCV

    if solver == "band":
        from pipeline.linalg.band import band_available

        if not band_available():
            pytest.skip("LAPACK band reduction not available")
    return KernelRidgeCV(
        alphas=(1e-3, 1e-2, 0.1, 1.0),
        param_grid={"gamma": [0.3, 1.0, 3.0]},
        cv=4,
        solver=solver,
        scoring=scoring,
        tol=1e-12,
        screen_tol=None,  # CG: every score to tol (screened ones carry the 1e-3 solve's error)
        random_state=0,
    )


@pytest.fixture(scope="module")
def cv_ref():
    """The search on ``cv_data``'s y itself, fitted once per (solver, scoring) for the
    module: every factor and exponent compares against the same reference (only read)."""
    fitted = {}

    def ref(solver, scoring, X, y):
        search = _cv(solver, scoring)  # skips first where the solver is unavailable
        if (solver, scoring) not in fitted:
            fitted[solver, scoring] = search.fit(X, y)
        return fitted[solver, scoring]

    return ref


def _score_keys(res: dict) -> list[str]:
    return [k for k in res if k.endswith("_test_score") and not k.startswith("rank")]


@pytest.mark.parametrize("solver", CV_SOLVERS)
@pytest.mark.parametrize("factor", [1e-200, 1e200])
@pytest.mark.parametrize(
    ("scoring", "degree"), [(None, 0), ("explained_variance", 0), ("neg_mean_absolute_error", 1)]
)
def test_cv_scores_of_tiny_and_huge_targets_match_the_search_on_y(
    cv_data, cv_ref, solver, factor, scoring, degree
):
    """Same best_params_, and every score in y's units (old code: R² 1.0 or NaN).

    y * factor is not a power-of-two multiple of y: the exact solvers agree to 1e-12,
    CG to its tolerance (two CG runs on y's that differ by rounding)."""
    X, y = cv_data
    ref = cv_ref(solver, scoring, X, y)
    assert 0 < ref.best_index_ < len(ref.cv_results_["params"]) - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CGConvergenceWarning)
        got = _cv(solver, scoring).fit(X, y * factor)
    assert got.best_params_ == ref.best_params_
    np.testing.assert_array_equal(
        got.cv_results_["rank_test_score"], ref.cv_results_["rank_test_score"]
    )
    rtol = 1e-9 if got.solver_ == "cg" else 1e-12
    # R² and explained variance (degree 0) are 1 - a ratio of sums of squares, and it is
    # that ratio the solvers agree on to rtol: a score near 0 would amplify the rounding
    # (0.0707 against 0.0707 differed by 1.05e-12 relative, 8e-14 in the ratio)
    shift = 1.0 if degree == 0 else 0.0
    for key in _score_keys(ref.cv_results_):
        want = ref.cv_results_[key] * factor**degree
        np.testing.assert_allclose(
            shift - got.cv_results_[key], shift - want, rtol=rtol, atol=0, err_msg=key
        )
    assert shift - got.best_score_ == pytest.approx(
        shift - ref.best_score_ * factor**degree, rel=rtol
    )
    if got.solver_ == "cg":
        v = got.search_stats_["verified_score"]
        assert v == pytest.approx(ref.search_stats_["verified_score"] * factor**degree, rel=1e-9)
    np.testing.assert_allclose(
        got.predict(X[:5]) / factor, ref.predict(X[:5]), rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("solver", CV_SOLVERS)
@pytest.mark.parametrize("j", [-665, 665])  # about 1e-200 and 1e200
@pytest.mark.parametrize(
    "scoring",
    ["r2", "neg_mean_squared_error", "neg_root_mean_squared_error", "neg_median_absolute_error"],
)
def test_cv_scores_of_power_of_two_multiples_of_y_are_scaled_exactly(
    cv_data, cv_ref, solver, j, scoring
):
    """The search on 2**j y is the search on y: same ranks, scores times 2**(degree j)
    bit for bit (the mean squared error underflows to -0.0 or overflows to -inf in y's
    units, but the ranks are taken before the conversion)."""
    from pipeline.models.selection.scoring import SCORE_DEGREE

    X, y = cv_data
    ref = cv_ref(solver, scoring, X, y)
    got = _cv(solver, scoring).fit(X, np.ldexp(y, j))
    assert got.best_params_ == ref.best_params_ and got.best_index_ == ref.best_index_ > 0
    np.testing.assert_array_equal(
        got.cv_results_["rank_test_score"], ref.cv_results_["rank_test_score"]
    )
    for key in _score_keys(ref.cv_results_):
        want = np.ldexp(ref.cv_results_[key], SCORE_DEGREE[scoring] * j)
        np.testing.assert_array_equal(got.cv_results_[key], want, err_msg=key)


@pytest.mark.parametrize(("solver", "cv"), [("eigen", 4), ("eigen", "loo"), ("cholesky", "loo")])
def test_cv_eigen_and_loo_scores_of_a_power_of_two_multiple_are_scaled_exactly(
    cv_data, tmp_path, solver, cv
):
    X, y = cv_data
    search = _cv(solver, "neg_mean_squared_error").set_params(cv=cv)
    if solver == "cholesky":
        search.set_params(store=str(tmp_path / "store"))
    ref = search.fit(X, y).cv_results_
    got = search.fit(X, np.ldexp(y, -665))
    assert got.best_index_ == int(np.argmin(ref["rank_test_score"])) > 0
    np.testing.assert_array_equal(got.cv_results_["mean_test_score"],
                                  np.ldexp(ref["mean_test_score"], -1330))  # fmt: skip


def test_cv_checkpoint_of_a_tiny_target_resumes_to_the_same_search(cv_data, cv_ref, tmp_path):
    """The checkpoint holds the predictions on 2**k y, fingerprinted with 2**k y."""
    X, y = cv_data
    ref = cv_ref("cg", None, X, y)
    search = _cv("cg").set_params(checkpoint=str(tmp_path / "ckpt"))
    first = search.fit(X, y * 1e-200).cv_results_["mean_test_score"]
    again = search.fit(X, y * 1e-200)
    assert again.search_stats_["settings_resumed"] == 3
    np.testing.assert_array_equal(again.cv_results_["mean_test_score"], first)
    assert again.best_params_ == ref.best_params_


@pytest.mark.parametrize("factor", [1e-200, 1e200])
@pytest.mark.parametrize("scoring", ["neg_mean_squared_log_error", "callable"])
def test_cv_refuses_a_scorer_it_cannot_convert_on_a_far_y(cv_data, factor, scoring):
    from sklearn.metrics import get_scorer

    X, y = cv_data
    if scoring == "callable":
        scoring = get_scorer("neg_mean_absolute_error")
    with pytest.raises(ValueError, match=r"largest magnitude is .*rescale y"):
        _cv("dense", scoring).fit(X, y * factor)
    _cv("dense", scoring).fit(X, np.abs(y))  # ordinary y: any scorer, as before


def test_cv_target_exponent_is_zero_for_ordinary_y():
    """k = 0 keeps every bit of today's search (and its checkpoint fingerprints)."""
    from pipeline.models.selection.scoring import target_exponent

    edge = 2.0**SAFE_EXPONENT
    for amax in [1e-30, 1.0, 1e30, edge / 2]:
        assert target_exponent(np.array([0.0, -amax]), lambda *a: 0.0) == (0, 0)
    k = -SAFE_EXPONENT - 1
    assert target_exponent(np.array([edge]), "neg_mean_squared_error") == (k, -2 * k)


@pytest.mark.parametrize("scales", [(1e-200, 1.0), (1.0, 1e200), (1e-160, 1.0), (1e-120, 1e120)])
@pytest.mark.parametrize("scoring", [None, "r2", "explained_variance"])
def test_cv_r2_of_multi_output_y_with_columns_far_apart_is_sklearns(cv_data, scales, scoring):
    """R² of a multi-output y is scikit-learn's ``multioutput="uniform_average"``: the mean
    of the columns' R², each unchanged when its column is scaled. One power of two for
    all columns (that of the largest) left a column many orders of magnitude smaller
    with squares that underflow: columns at 1e-200 and 1 scored 0.685 where
    ``r2_score`` gives 0.658 (every candidate; the best λ could change with it). Now
    each column gets its own exponent and the scores equal those of the columns at 1."""
    from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
    from sklearn.metrics import explained_variance_score, r2_score
    from sklearn.model_selection import KFold

    X, y = cv_data
    Y1 = np.c_[y, np.cos(X[:, 1]) / 2]  # both columns of order 1
    search = _cv("dense", scoring).set_params(param_grid=None, gamma=1.0, cv=KFold(4))
    got = search.fit(X, Y1 * np.array(scales)).cv_results_["mean_test_score"]
    metric = explained_variance_score if scoring == "explained_variance" else r2_score
    want = []
    for a in search.alphas:
        folds = []
        for tr, te in KFold(4).split(X):
            sk = SkKernelRidge(alpha=a, kernel="rbf", gamma=1.0).fit(X[tr], Y1[tr])
            folds.append(metric(Y1[te], sk.predict(X[te]), multioutput="uniform_average"))
        want.append(np.mean(folds))
    np.testing.assert_allclose(got, want, rtol=1e-9)
    ref = search.fit(X, Y1).cv_results_["mean_test_score"]  # the columns at 1: R² unchanged
    np.testing.assert_allclose(got, ref, rtol=1e-12)


@pytest.fixture(scope="module")
def select_plain():
    """The select stage's result on y itself, per (standardize_y, scoring), for the module."""
    return {}


@pytest.mark.parametrize("standardize_y", [True, False])
@pytest.mark.parametrize("factor", [1e-200, 1e200])
@pytest.mark.parametrize(("scoring", "degree"), [("r2", 0), ("neg_root_mean_squared_error", 1)])
def test_select_stage_on_tiny_and_huge_targets_matches_the_stage_on_y(
    tmp_path, features, select_plain, standardize_y, factor, scoring, degree, monkeypatch
):
    """The select stage of ``krr run``: same choice, best score in the data's units.
    With ``standardize_y`` its scorer maps the standardised rows back to the data's
    units (:class:`pipeline.stages.select.OriginalUnits`): old code scored R² 1.0 (at
    1e-200) or NaN (1e200) there, for every candidate.

    The stage's report is written without its PNG plots (about 0.7 s of matplotlib a
    stage; what is checked here is the choice and score it returns, which the plots,
    drawn after the search, never change: ``tests/models`` test the plots)."""
    from pipeline.models.selection import report
    from pipeline.stages import select, typed_params

    monkeypatch.setattr(report, "plot_cv_results", lambda search, directory: [])

    X, y = features
    cv = {
        "alphas": [1e-3, 1e-2, 0.1, 1.0],
        "param_grid": {"gamma": [0.1, 1.0, 10.0]},
        "folds": 3,
        "scoring": scoring,
    }
    params = typed_params(
        "select",
        {"cv": cv, "kernel": {"name": "rbf", "params": {"gamma": 0.5}},
         "lam_convention": "sklearn", "block_size": 64},
    )  # fmt: skip

    def run(where, name, f):
        out, _, _ = _ingest(where, name, X[:200], y[:200] * f, standardize_y=standardize_y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return select.run(where / f"{name}_select", {"ingest": out}, **params)

    key = (standardize_y, scoring)  # the stage on y itself does not depend on the factor
    if key not in select_plain:
        select_plain[key] = run(tmp_path, "plain", 1.0)
    plain, far = select_plain[key], run(tmp_path, "far", factor)
    assert far["best_params"] == plain["best_params"] != {"alpha": 1e-3, "gamma": 0.1}
    assert far["best_score"] == pytest.approx(plain["best_score"] * factor**degree, rel=1e-12)


# -------------------------------------------------------------- float32 factor's refinement

# History (issue #44, class 7): refinement of a float32 factor's solution divided by ‖y‖,
# which underflowed to 0 at y ~ 1e-200 and was replaced by 1, so it stopped at once; the
# float32 first solve of such a y was itself 0 (y cast to float32): dual_coef_ = 0, exit 0.
# At 1e200 that first solve overflowed to inf and the refinement failed with a
# zero-size-array ValueError.


def _float32_factor_fit(X, y, tmp_path, name):
    from pipeline import KernelRidge

    return KernelRidge(
        alpha=1e-3,
        kernel="rbf",
        gamma=0.5,
        solver="cholesky",
        factor_dtype="float32",
        store=str(tmp_path / name),
        block_size=64,
    ).fit(X, y)


@pytest.mark.parametrize("factor", [1e-200, 1e200])
def test_float32_factor_refinement_of_tiny_and_huge_targets(system, tmp_path, factor):
    X, K, y = system
    ref = scipy.linalg.solve(K + 1e-3 * np.eye(len(y)), y, assume_a="pos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the float32 first solve of 1e200
        m = _float32_factor_fit(X, y * factor, tmp_path, "far")
    assert _rel_err(np.asarray(m.dual_coef_), ref * factor, factor) < 1e-9


@pytest.mark.parametrize("j", [-665, 665])
def test_float32_factor_refinement_of_a_power_of_two_multiple_is_the_same_solve(
    system, tmp_path, j
):
    X, _, y = system
    base = _float32_factor_fit(X, y, tmp_path, "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        far = _float32_factor_fit(X, np.ldexp(y, j), tmp_path, "far")
    np.testing.assert_array_equal(np.asarray(far.dual_coef_), np.ldexp(base.dual_coef_, j))
