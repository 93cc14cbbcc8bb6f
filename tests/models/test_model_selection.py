"""KernelRidgeCV: exactness against scikit-learn's GridSearchCV, reuse counters, LOO,
bad input, plots."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.model_selection import GridSearchCV, KFold, LeaveOneOut, TimeSeriesSplit

from pipeline import KernelRidge
from pipeline.kernels import RBF
from pipeline.models.selection import (
    KernelRidgeCV,
    inverse_diagonal,
    lgo_residuals,
    loo_residuals,
    plot_cv_results,
    save_search_report,
    search_from_config,
)
from pipeline.models.selection.cgpath import cg_fold_predictions
from pipeline.models.selection.route import DenseKernelOperator

ALPHAS = [1e-3, 1e-2, 1e-1, 1.0]
GAMMAS = [0.05, 0.3, 1.5]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    y = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.1 * rng.standard_normal(120)
    return X, y


@pytest.fixture(scope="module")
def sk_search(data):
    X, y = data
    return GridSearchCV(SkKernelRidge(kernel="rbf"), {"alpha": ALPHAS, "gamma": GAMMAS}, cv=5).fit(
        X, y
    )


@pytest.mark.parametrize(
    "solver,mode",
    [("band", "auto"), ("eigen", "lgo"), ("eigen", "fold"), ("dense", "auto"), ("cg", "auto")],
)
def test_in_memory_and_cg_match_sklearn_gridsearch(data, sk_search, solver, mode):
    X, y = data
    # screen_tol=None: CG solves every λ to tol (screened scores carry the 1e-3 solve's error)
    m = KernelRidgeCV(
        ALPHAS, kernel="rbf", param_grid={"gamma": GAMMAS}, cv=5, solver=solver, eigen_mode=mode,
        screen_tol=None,
    ).fit(X, y)  # fmt: skip
    tol = 1e-6 if solver == "cg" else 1e-9
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], sk_search.cv_results_["mean_test_score"], atol=tol
    )
    for f in range(5):
        np.testing.assert_allclose(
            m.cv_results_[f"split{f}_test_score"],
            sk_search.cv_results_[f"split{f}_test_score"],
            atol=tol,
        )
    assert m.best_params_ == {k: float(v) for k, v in sk_search.best_params_.items()}
    assert m.best_index_ == sk_search.best_index_
    np.testing.assert_array_equal(
        m.cv_results_["rank_test_score"], sk_search.cv_results_["rank_test_score"]
    )
    assert [dict(p) for p in m.cv_results_["params"]] == [
        {k: float(v) for k, v in p.items()} for p in sk_search.cv_results_["params"]
    ]
    assert isinstance(m.best_estimator_, KernelRidge)
    np.testing.assert_allclose(m.predict(X), sk_search.predict(X), atol=1e-8)
    s = m.search_stats_
    if solver == "eigen":
        # one eigendecomposition per kernel setting (lgo) or per (setting, fold)
        assert s["eigendecompositions"] == (3 if mode == "lgo" else 15)
        assert s["kernel_matrices"] == 3
    if solver == "dense":
        assert s["kernel_matrices"] == 3 and s["factorizations"] == 3 * 4 * 5
    if solver == "band":
        # one reduction per (setting, fold), shared by the 4 alphas; no factorisation
        assert s["kernel_matrices"] == 3 and s["band_reductions"] == 3 * 5
        assert s["factorizations"] == 0 and s["eigendecompositions"] == 0
    if solver == "cg":
        assert s["preconditioner_builds"] == 3 and s["cg_iterations"] > 0


def test_cholesky_path_matches_and_counts_reuse(data, sk_search, tmp_path):
    X, y = data
    m = KernelRidgeCV(
        ALPHAS,
        kernel="rbf",
        param_grid={"gamma": GAMMAS},
        cv=5,
        solver="cholesky",
        store=str(tmp_path / "store"),
        block_size=48,
    ).fit(X, y)
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], sk_search.cv_results_["mean_test_score"], atol=1e-9
    )
    assert m.best_params_ == {k: float(v) for k, v in sk_search.best_params_.items()}
    s = m.search_stats_
    # 120 rows in tiles of 48 -> 3 row blocks -> 6 lower tiles per Gram, one Gram per gamma;
    # the refit reuses the best setting's stored tiles
    assert s["gram_tiles_built"] == 3 * 6
    assert s["gram_tiles_reused"] == 6
    # one factorisation of the full Gram per (gamma, lambda), none per fold, +1 for the refit
    assert s["factorizations"] == 3 * 4 + 1
    np.testing.assert_allclose(m.predict(X), sk_search.predict(X), atol=1e-8)


def _brute_loo(K, y, lam):
    n = len(y)
    e = np.empty(n)
    for i in range(n):
        tr = np.delete(np.arange(n), i)
        a = np.linalg.solve(K[np.ix_(tr, tr)] + lam * np.eye(n - 1), y[tr])
        e[i] = y[i] - K[i, tr] @ a
    return e


def test_loo_from_tiled_factor_and_inverse_diagonal(tmp_path):
    from pipeline.linalg.cholesky import tile_cholesky
    from pipeline.linalg.gram import build_gram

    rng = np.random.default_rng(1)
    X = rng.standard_normal((50, 2))
    y = rng.standard_normal(50)
    k = RBF(gamma=0.7)
    K = k(X)
    gram = build_gram(X, k, str(tmp_path / "s"), 16, progress=False)
    fac = tile_cholesky(gram, 0.05, progress=False)
    Ainv = np.linalg.inv(K + 0.05 * np.eye(50))
    np.testing.assert_allclose(inverse_diagonal(fac), np.diag(Ainv), rtol=1e-10)
    # a panel budget of one tile column forces several passes
    np.testing.assert_allclose(inverse_diagonal(fac, panel_bytes=1), np.diag(Ainv), rtol=1e-10)
    e, alpha = loo_residuals(fac, y)
    np.testing.assert_allclose(e, _brute_loo(K, y, 0.05), atol=1e-9)
    te = np.array([3, 17, 18, 40])
    tr = np.setdiff1d(np.arange(50), te)
    a = np.linalg.solve(K[np.ix_(tr, tr)] + 0.05 * np.eye(46), y[tr])
    np.testing.assert_allclose(
        lgo_residuals(fac, alpha, te), y[te] - K[np.ix_(te, tr)] @ a, atol=1e-9
    )


@pytest.mark.parametrize("solver", ["eigen", "cholesky"])
def test_loo_search_matches_sklearn_leave_one_out(solver, tmp_path):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((30, 2))
    y = X[:, 0] ** 2 + 0.1 * rng.standard_normal(30)
    grid = {"alpha": [1e-2, 1e-1, 1.0], "gamma": [0.2, 1.0]}
    sk = GridSearchCV(
        SkKernelRidge(kernel="rbf"), grid, cv=LeaveOneOut(), scoring="neg_mean_squared_error"
    ).fit(X, y)
    m = KernelRidgeCV(
        grid["alpha"],
        param_grid={"gamma": grid["gamma"]},
        cv="loo",
        scoring="neg_mean_squared_error",
        solver=solver,
        store=str(tmp_path / "s"),
        block_size=8,
    ).fit(X, y)
    np.testing.assert_allclose(
        m.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], rtol=1e-8
    )
    assert m.best_params_ == sk.best_params_
    # eigen: one per kernel setting; cholesky: one per (setting, alpha) plus the refit
    key = "eigendecompositions" if solver == "eigen" else "factorizations"
    assert m.search_stats_[key] == (2 if solver == "eigen" else 2 * 3 + 1)


def test_n_samples_convention_non_complement_splits_and_multioutput():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((90, 3))
    Y = np.c_[np.sin(X[:, 0]), X[:, 1] * X[:, 2]] + 0.05 * rng.standard_normal((90, 2))
    grid = {"alpha": [1e-4, 1e-3, 1e-2], "gamma": [0.1, 0.5]}
    for cv in (KFold(4, shuffle=True, random_state=0), TimeSeriesSplit(3)):
        sk = GridSearchCV(
            KernelRidge(kernel="rbf", alpha_convention="n_samples"),
            grid,
            cv=cv,
            scoring="neg_mean_absolute_error",
        ).fit(X, Y)
        for solver in ("band", "eigen", "cg"):
            m = KernelRidgeCV(
                grid["alpha"],
                param_grid={"gamma": grid["gamma"]},
                cv=cv,
                scoring="neg_mean_absolute_error",
                lambda_convention="n_samples",
                solver=solver,
                tol=1e-10,
            ).fit(X, Y)
            np.testing.assert_allclose(
                m.cv_results_["mean_test_score"], sk.cv_results_["mean_test_score"], atol=1e-7
            )
            assert m.best_params_ == sk.best_params_
            assert m.predict(X).shape == Y.shape


def test_cg_warm_start_and_shared_preconditioner_save_iterations():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((200, 3))
    y = np.sin(X[:, :1]) + 0.1 * rng.standard_normal((200, 1))
    k = RBF(gamma=0.5)
    op = DenseKernelOperator(k(X), 1.0)
    idx = np.arange(200)
    tests = np.array_split(idx, 4)
    trains = [np.setdiff1d(idx, t) for t in tests]
    shifts = np.repeat(np.geomspace(1e-3, 1.0, 6)[:, None], 4, axis=1)
    warm, cold = {}, {}
    pw = cg_fold_predictions(op, y, trains, tests, shifts, rank=10, tol=1e-10, stats=warm)
    pc = cg_fold_predictions(
        op, y, trains, tests, shifts, rank=10, tol=1e-10, warm_start=False, stats=cold
    )
    assert warm["preconditioner_builds"] == 1 and warm["cg_solves"] == 6
    assert warm["cg_iterations"] < cold["cg_iterations"]
    K = k(X)
    for f in range(4):
        for li in range(6):
            a = np.linalg.solve(
                K[np.ix_(trains[f], trains[f])] + shifts[li, f] * np.eye(150), y[trains[f]]
            )
            ref = K[np.ix_(tests[f], trains[f])] @ a
            np.testing.assert_allclose(pw[f][li], ref, atol=1e-7)
            np.testing.assert_allclose(pc[f][li], ref, atol=1e-7)


@pytest.mark.parametrize("rank", [12, None])
@pytest.mark.parametrize("preconditioner", ["nystrom", "adaptive"])
def test_cg_path_builds_its_factor_with_the_one_nystrom_builder(monkeypatch, preconditioner, rank):
    # issue #43: the CV path had its own calls of the fixed-rank and adaptive builds;
    # it now asks pipeline.linalg.precond.build_nystrom, like every other Nystrom user
    import pipeline.models.selection.cgpath as cgpath
    from pipeline.linalg import precond

    calls = []

    def spy(op, **kw):
        calls.append(kw["centres"])
        ranks.append(kw.get("rank") if kw["centres"] == "rpcholesky" else kw.get("max_rank"))
        return precond.build_nystrom(op, **kw)

    ranks = []
    monkeypatch.setattr(cgpath, "build_nystrom", spy, raising=True)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((90, 3))
    y = np.cos(X[:, :1])
    idx = np.arange(90)
    tests = np.array_split(idx, 3)
    trains = [np.setdiff1d(idx, t) for t in tests]
    shifts = np.full((2, 3), 1e-2)
    cg_fold_predictions(DenseKernelOperator(RBF(gamma=0.5)(X), 0.0), y, trains, tests, shifts,
                        preconditioner=preconditioner, rank=rank, tol=1e-10)  # fmt: skip
    assert calls == [{"nystrom": "rpcholesky", "adaptive": "adaptive"}[preconditioner]]
    # the rank (or cap) the search's cost model prices, the one rule of both CV paths
    from pipeline.plan.cv_routing import cg_rank

    assert ranks == [cg_rank(90, 3, preconditioner, rank)]
    assert ranks[0] == (12 if rank else 90)  # at most N (an adaptive cap was None before)


@pytest.mark.parametrize("preconditioner", ["nystrom", "adaptive", "none"])
def test_cg_path_uses_the_one_fold_form_and_matches_dense_solves(monkeypatch, preconditioner):
    """Issue #43 item 4: the CV path preconditions every fold with the block CV's fold
    form (FoldNystromBlock on the stacked vectors padded to n rows) instead of a
    per-fold form of its own; its held-out predictions equal the dense solves of each
    fold to 1e-10 relative, whatever the operator's tiling."""
    from pipeline.linalg.matvec import MatrixFreeKernelOperator
    from pipeline.linalg.precond import FoldNystromBlock

    applied = []
    real_apply = FoldNystromBlock.apply

    def spy(self, R, folds, shifts, mask):
        applied.append(R.shape[1])
        return real_apply(self, R, folds, shifts, mask)

    monkeypatch.setattr(FoldNystromBlock, "apply", spy)
    rng = np.random.default_rng(6)
    n = 150
    X = rng.standard_normal((n, 3))
    y = np.column_stack([np.sin(X[:, 0]), X[:, 1] ** 2]) + 0.1 * rng.standard_normal((n, 2))
    kern = RBF(gamma=0.4)
    K = kern(X)
    idx = np.arange(n)
    tests = [np.sort(t) for t in np.array_split(rng.permutation(n), 4)]
    trains = [np.setdiff1d(idx, t) for t in tests]
    shifts = np.array([[a * len(tr) for tr in trains] for a in (1e-1, 1e-2, 1e-3)])
    want = [
        [
            K[np.ix_(te, tr)] @ np.linalg.solve(K[np.ix_(tr, tr)] + s * np.eye(len(tr)), y[tr])
            for te, tr, s in zip(tests, trains, row)
        ]
        for row in shifts
    ]
    # (the path removes each operator's own shift from its products); tilings of 6 row
    # blocks (the last of 5 rows), 4 (the last of 27) and one: blocks of 16 rows (10 of
    # them) took 1.5x as long, unpreconditioned, for no other kind of tile
    ops = [DenseKernelOperator(K, 0.0)] + [
        MatrixFreeKernelOperator(X, kern, 1.0, block_size=b) for b in (29, 41, 150)
    ]
    for op in ops:
        got = cg_fold_predictions(op, y, trains, tests, shifts, preconditioner=preconditioner,
                                  rank=25, tol=1e-13)  # fmt: skip
        for f in range(4):
            for li in range(3):
                err = np.linalg.norm(got[f][li] - want[li][f]) / np.linalg.norm(want[li][f])
                assert err < 1e-10, (type(op).__name__, f, li, err)
    # each apply: the 4 folds x the targets still running, padded to one column each
    if preconditioner == "none":
        assert not applied
    else:
        assert applied and set(applied) <= {4, 8}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"alphas": []}, "empty grid"),
        ({"alphas": [0.1, 0.0]}, "0.0"),
        ({"alphas": [1.0, -2.0]}, "-2.0"),
        ({"cv": 500}, "cv=500"),
        ({"kernel": "linear", "param_grid": {"gamma": [0.1, 1.0]}}, "gamma"),
        ({"param_grid": {"gamma": []}}, "empty"),
        ({"param_grid": []}, "empty grid"),
        ({"param_grid": {"alpha": [1.0]}}, "alphas"),
        ({"solver": "magic"}, "magic"),
        ({"solver": "cholesky"}, "store"),
        ({"solver": "band", "cv": "loo"}, "loo"),
    ],
)
def test_bad_input_raises_value_error_naming_the_value(data, kwargs, match):
    X, y = data
    with pytest.raises(ValueError, match=match):
        KernelRidgeCV(**{"alphas": [1.0], **kwargs}).fit(X, y)


def test_plots_and_report_from_config_section(data, tmp_path):
    import json

    X, y = data
    section = {
        "alphas": {"logspace": [-3, 0, 4]},
        "param_grid": {"gamma": GAMMAS},
        "folds": 3,
        "shuffle": True,
        "scoring": "neg_mean_squared_error",
    }
    m = search_from_config(section, kernel="rbf", lam_convention="n").fit(X, y)
    np.testing.assert_allclose(sorted({p["alpha"] for p in m.cv_results_["params"]}), ALPHAS)
    paths = plot_cv_results(m, tmp_path / "run")
    assert [p.name for p in paths] == ["cv_score_vs_alpha.png", "cv_heatmap.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000
    out = save_search_report(m, tmp_path / "run2")
    summary = json.loads(out["summary"].read_text())
    assert summary["best_params"] == m.best_params_
    assert (
        summary["search_stats"]["eigendecompositions"]
        + summary["search_stats"]["band_reductions"]
        + summary["search_stats"]["factorizations"]
        > 0
    )
    assert out["table"].read_text().count("\n") == len(m.cv_results_["params"]) + 1
    with pytest.raises(ValueError, match="folds_typo"):
        search_from_config({"alphas": [1.0], "folds_typo": 3})


def test_auto_leaves_memory_when_the_kernel_does_not_fit(monkeypatch):
    import pipeline.linalg.dense_memory as memory
    from pipeline import KernelRidgeCV

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=120)
    monkeypatch.setattr(memory, "available_memory", lambda: 50_000)
    search = KernelRidgeCV(alphas=[0.1, 1.0], kernel="rbf", cv=3).fit(X, y)
    assert search.solver_ == "cg"
    with pytest.raises(MemoryError, match="solver='eigen'"):
        KernelRidgeCV(alphas=[0.1], kernel="rbf", cv=3, solver="eigen").fit(X, y)


def test_without_the_band_lapack_routine_auto_falls_back(data, monkeypatch):
    """A SciPy whose LAPACK lacks dsytrd_sy2sb (e.g. another BLAS vendor): auto uses the
    eigen or dense path, and an explicit solver='band' says why it cannot run."""
    import pipeline.models.selection.search as search

    X, y = data
    monkeypatch.setattr(search, "band_available", lambda: False)
    m = KernelRidgeCV(np.logspace(-3, 1, 8), cv=5).fit(X, y)
    assert m.solver_ in ("eigen", "dense") and m.search_stats_["band_reductions"] == 0
    with pytest.raises(RuntimeError, match="dsytrd_sy2sb"):
        KernelRidgeCV([0.1, 1.0], cv=3, solver="band").fit(X, y)


@pytest.mark.parametrize("mode", ["loo", "kfold"])
def test_eigen_not_positive_definite_shift_is_the_one_type(mode):
    """The eigendecomposition's check raised a plain ValueError before issue #43; it is
    the project's NotPositiveDefiniteError now (still a ValueError), its message unchanged."""
    from sklearn.model_selection import LeaveOneOut

    from pipeline.errors import NotPositiveDefiniteError
    from pipeline.models.selection.eigen import eigendecompose

    K = -np.eye(4)
    with pytest.raises(NotPositiveDefiniteError) as e:
        eigendecompose(K, np.ones((4, 1))).dual_coef(0.5)
    assert isinstance(e.value, ValueError) and e.value.shift == 0.5 and e.value.tile is None
    assert str(e.value) == (
        "K + 0.5 I is not positive definite (smallest eigenvalue of K is -1); use a larger "
        "alpha or a positive definite kernel"
    )
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 2))
    cv = LeaveOneOut() if mode == "loo" else 2
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        KernelRidgeCV([1e-6], kernel="sigmoid", cv=cv, solver="eigen").fit(X, X[:, 0])
