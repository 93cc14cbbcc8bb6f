"""λ for the full N (#45 item 3): ``KernelRidgeCV(subsample=, refine=)`` and ``cv.subsample``
/ ``cv.refine`` in a run config (pipeline.models.selection.refine)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge, KernelRidgeCV
from pipeline.models.selection import refine as R


def _data(n: int, seed: int = 0, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 2))
    y = np.sin(4 * X[:, 0]) * np.cos(3 * X[:, 1]) + noise * rng.standard_normal(n)
    return X, y


def test_the_grid_search_runs_on_a_seeded_subsample_and_the_refit_on_all_rows():
    X, y = _data(300)
    kw = dict(alphas=[1e-3, 1e-2, 1e-1], param_grid={"gamma": [1.0, 3.0]}, refine=False)
    a = KernelRidgeCV(subsample=120, random_state=3, **kw).fit(X, y)
    idx = a.subsample_indices_
    assert idx.shape == (120,) and np.unique(idx).size == 120 and np.all(np.diff(idx) > 0)
    # seeded: the same rows again, other rows with another seed
    b = KernelRidgeCV(subsample=120, random_state=3, **kw).fit(X, y)
    np.testing.assert_array_equal(b.subsample_indices_, idx)
    c = KernelRidgeCV(subsample=120, random_state=4, **kw).fit(X, y)
    assert not np.array_equal(c.subsample_indices_, idx)
    # the search's scores are those of the same search on those rows
    ref = KernelRidgeCV(random_state=3, **kw).fit(X[idx], y[idx])
    np.testing.assert_allclose(
        a.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], rtol=1e-10
    )
    assert a.best_params_ == ref.best_params_ and a.refine_results_ is None
    assert a.best_estimator_.X_fit_.shape[0] == 300  # the refit: all rows
    # at least n rows: no subsample, the search of all rows
    d = KernelRidgeCV(subsample=300, **kw).fit(X, y)
    assert d.subsample_indices_ is None and d.refine_results_ is None


def test_refinement_lowers_a_subsample_lambda_that_is_too_big():
    """The grid's smallest λ is the subsample's choice (too big for all rows, under the
    n_samples convention the best λ falls with N): the refinement moves it down, to a λ
    that scores better on all rows and predicts fresh rows better."""
    X, y = _data(600, seed=0)
    search = KernelRidgeCV(
        alphas=[1e-3, 1e-2, 1e-1], gamma=2.0, subsample=60, lambda_convention="n_samples"
    ).fit(X, y)
    r = search.refine_results_
    assert r["method"] == "loo-eigen" and r["n_train"] == 600
    assert r["subsample_alpha"] == 1e-3 and r["alpha"] < 1e-3
    assert r["alphas"] == sorted(1e-3 * f for f in R.REFINE_FACTORS)
    scores = dict(zip(r["alphas"], r["scores"]))
    assert scores[r["alpha"]] > scores[1e-3]
    # the refit uses the refined λ
    assert search.best_alpha_ == search.best_params_["alpha"] == r["alpha"]
    assert search.best_estimator_.alpha == r["alpha"]
    assert r["seconds"] > 0 and r["cost_ratio"] == pytest.approx(
        r["seconds"] / r["refit_seconds"], rel=1e-2
    )
    assert search.search_stats_["seconds"]["refine"] == r["seconds"]
    # better on fresh rows than the subsample's λ
    Xt, yt = _data(2000, seed=9)
    sub = KernelRidge(alpha=1e-3, kernel="rbf", gamma=2.0, alpha_convention="n_samples")
    mse_sub = np.mean((sub.fit(X, y).predict(Xt) - yt) ** 2)
    mse_ref = np.mean((search.predict(Xt) - yt) ** 2)
    assert mse_ref < mse_sub


def test_refine_off_when_asked_and_by_default_without_a_subsample():
    X, y = _data(300)
    kw = dict(alphas=[1e-3, 1e-2], gamma=2.0, refit=False)
    off = KernelRidgeCV(subsample=60, refine=False, **kw).fit(X, y)
    assert off.refine_results_ is None and "refine" not in off.search_stats_["seconds"]
    assert off.best_alpha_ == off.cv_results_["params"][off.best_index_]["alpha"]
    assert KernelRidgeCV(**kw).fit(X, y).refine_results_ is None
    # asked for without a subsample: refined on all rows
    on = KernelRidgeCV(refine=True, **kw).fit(X, y)
    assert on.refine_results_["n_train"] == 300 and "cost_ratio" not in on.refine_results_


@pytest.mark.parametrize("convention", ["sklearn", "n_samples"])
def test_the_refinement_loo_scores_are_brute_force_loo(convention):
    X, y = _data(30, seed=5)
    search = KernelRidgeCV(
        alphas=[1e-2],
        gamma=1.5,
        refine=True,
        refit=False,
        lambda_convention=convention,
        scoring="neg_mean_squared_error",
    ).fit(X, y)
    r = search.refine_results_
    for lam, score in zip(r["alphas"], r["scores"]):
        pred = np.empty_like(y)
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            m = KernelRidge(alpha=lam, kernel="rbf", gamma=1.5, alpha_convention=convention)
            pred[i] = m.fit(X[keep], y[keep]).predict(X[i : i + 1])[0]
        assert score == pytest.approx(-np.mean((pred - y) ** 2), rel=1e-8, abs=1e-12)


def _held_out_refinement() -> tuple[dict, np.ndarray]:
    """A subsampled search refined on all 240 rows by one held-out split (the patches of
    the caller choose how), and the exact (eigen) scores of the same λ on the same split.
    The search's Nyström screen (20 centres, fewer than the rows) is not the
    refinement's: its block CG scores every λ exactly."""
    X, y = _data(240, seed=2)
    search = KernelRidgeCV(
        alphas=[1e-3, 1e-2],
        gamma=2.0,
        cv=4,
        subsample=60,
        refit=False,
        random_state=7,
        screen_centers=20,
    ).fit(X, y)
    r = search.refine_results_
    exact = KernelRidgeCV(
        alphas=r["alphas"], gamma=2.0, cv=0.25, solver="eigen", refit=False, random_state=7
    ).fit(X, y)
    return r, exact.cv_results_["mean_test_score"]


@pytest.mark.parametrize("where", ["dense", "cg"])
def test_above_the_eigen_size_the_refinement_is_one_held_out_split(monkeypatch, where):
    """Above the eigen size: one seeded held-out split of all rows (1/folds of them), a
    Cholesky per λ in memory, else the search's block CG; its scores equal an exact
    (eigen) search of the same λ and split."""
    monkeypatch.setattr(R, "REFINE_EIGEN_MAX_N", 100)
    monkeypatch.setattr(R, "_PRODUCT_BLOCK", 50)  # several blocks of the products by K
    if where == "cg":
        monkeypatch.setattr(R, "REFINE_IN_MEMORY_MAX_N", 100)
    r, exact = _held_out_refinement()
    assert r["method"] == f"holdout-{where}"
    if where == "dense":  # one factor, the smaller λ by CG preconditioned with it
        assert 0 < r["pcg_iterations"] < 60 and r["redone_direct"] == 0
    np.testing.assert_allclose(r["scores"], exact, rtol=0, atol=1e-8 if where == "dense" else 1e-6)


def test_a_held_out_column_that_misses_its_tolerance_is_solved_by_its_own_cholesky(monkeypatch):
    """The in-memory held-out refinement never scores a rough solve: with one PCG
    iteration allowed, the columns that miss 1e-10 are redone by a Cholesky each, and the
    scores still equal an exact search's."""
    monkeypatch.setattr(R, "REFINE_EIGEN_MAX_N", 100)
    monkeypatch.setattr(R, "_PCG_MAX_ITER", 1)
    r, exact = _held_out_refinement()
    assert r["method"] == "holdout-dense" and r["pcg_iterations"] == 1
    assert r["redone_direct"] > 0
    np.testing.assert_allclose(r["scores"], exact, atol=1e-8)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (
            {"subsample": 5},
            r"^subsample=5 is not valid: .*an integer >= 10 \(two per fold of cv=5\)",
        ),
        ({"subsample": 0}, r"^subsample=0 is not valid"),
        ({"subsample": 50.5}, r"^subsample=50.5 is not valid"),
        ({"subsample": 19, "cv": 10}, r"^subsample=19 is not valid: .*>= 20"),
        ({"refine": "yes"}, r"^refine must be True or False, got 'yes'"),
        (
            {"subsample": 20, "cv": [(np.arange(10), np.arange(10, 20))]},
            r"^subsample=20 needs splits that can be cut on the subsample",
        ),
    ],
)
def test_bad_knobs_are_refused_before_any_work(params, match, monkeypatch):
    import pipeline.models.selection.search as search

    monkeypatch.setattr(search, "run_search", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(ValueError, match=match):
        KernelRidgeCV(alphas=[0.1], **params).fit(*_data(40))


def test_the_config_keys_are_checked_and_reach_the_search():
    from pipeline.errors import ConfigError
    from pipeline.stages.config import load_config

    base = {"data": {"source": "sklearn", "name": "diabetes"}}
    with pytest.raises(
        ConfigError, match=r"cv.subsample=6 is not valid.*>= 10 \(two per fold of cv.folds=5\)"
    ):
        load_config({**base, "cv": {"alphas": [0.1], "subsample": 6}})
    with pytest.raises(ConfigError, match="refine"):
        load_config({**base, "cv": {"alphas": [0.1], "refine": 3}})
    cfg = load_config({**base, "cv": {"alphas": [0.1], "folds": 3, "subsample": 6}})
    assert (cfg.cv.subsample, cfg.cv.refine) == (6, None)
    # a section that names neither keeps the select stage's identity
    plain = load_config({**base, "cv": {"alphas": [0.1]}}).stage_params()["select"]["cv"]
    assert "subsample" not in plain and "refine" not in plain
    sel = cfg.stage_params()["select"]["cv"]
    assert sel["subsample"] == 6 and "refine" not in sel


def test_the_products_by_k_from_its_lower_triangle():
    """The in-memory held-out path keeps the factor in K's upper triangle and multiplies
    by K from the strict lower one and the diagonal, by blocks."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal((23, 23))
    K = A + A.T
    P = rng.standard_normal((23, 3))
    want = K @ P
    kept = np.tril(K, -1) + np.triu(rng.standard_normal((23, 23)))  # junk above
    for block in (1, 5, 23, 100):
        got = R._LowerProduct(kept, np.diag(K).copy(), block=block)(P)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
