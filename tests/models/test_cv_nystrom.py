"""KernelRidgeCV(solver="nystrom"): scores from one pass of sufficient statistics and one
pass predicting the held-out rows equal a brute-force nystrom_solve per fold with the
same centres."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from sklearn.metrics import mean_squared_error, r2_score
from sklearn.model_selection import KFold

from pipeline.engine.dense import kernel_matrix
from pipeline.engine.fused import kernel_tile
from pipeline.errors import NonFiniteKernelError
from pipeline.kernels import Constant, make_kernel
from pipeline.linalg.nystrom_solve import (
    FalkonPreconditioner,
    NystromNormalOperator,
    ShiftPath,
    _Rows,
    centre_kernel,
    nystrom_centres,
    nystrom_solve,
)
from pipeline.models.estimator import KernelRidge
from pipeline.models.selection import KernelRidgeCV, nystrom_cv
from pipeline.models.selection.grid import resolve_kernel

M = 60
ALPHAS = [3e-3, 3e-2, 3e-1, 3.0]
GAMMAS = [0.5, 2.0]


def data(n=500, t=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 3))
    Y = np.stack([np.sin(X[:, 0] * (j + 1)) + 0.3 * X[:, 1] for j in range(t)], axis=1)
    Y += 0.1 * rng.standard_normal(Y.shape)
    return X, (Y[:, 0] if t == 1 else Y)


def brute_scores(X, y, gamma, splits, alphas, scoring, w=None, seed=0, centres_m=M):
    """Per (λ, fold): nystrom_solve on the fold's training rows with the search's
    centres (appended as rows of weight zero), scored by scikit-learn on its test rows."""
    kern = copy.deepcopy(resolve_kernel("rbf", None, 3, 1)).set_params(gamma=gamma)
    m = centres_m
    idx = nystrom_centres(X, kern, m, random_state=seed)
    C = X[idx]
    n = X.shape[0]
    w = np.ones(n) if w is None else w
    out = np.empty((len(alphas), len(splits)))
    for f, (tr, te) in enumerate(splits):
        Xa = np.vstack([X[tr], C])
        ya = np.concatenate([y[tr], np.zeros((m,) + y.shape[1:])])
        wa = np.concatenate([w[tr], np.zeros(m)])
        for li, a in enumerate(alphas):
            sol = nystrom_solve(
                Xa, ya, kern, a, n_centers=m, sample_weight=wa,
                centre_indices=np.arange(len(tr), len(tr) + m), method="direct",
            )  # fmt: skip
            p = np.asarray(kernel_matrix(kern, X[te], C)) @ sol.coef
            if scoring == "neg_mean_squared_error":
                out[li, f] = -mean_squared_error(y[te], p, sample_weight=w[te])
            else:
                out[li, f] = r2_score(y[te], p, sample_weight=w[te])
    return out


@pytest.mark.parametrize(("t", "scoring"), [(1, None), (2, "neg_mean_squared_error"), (2, "r2")])
def test_scores_equal_brute_force(t, scoring):
    X, y = data(t=t)
    cv = KFold(4, shuffle=True, random_state=0)
    splits = list(cv.split(X))
    s = KernelRidgeCV(
        ALPHAS, param_grid={"gamma": GAMMAS}, cv=cv, scoring=scoring, solver="nystrom",
        n_centers=M, random_state=0,
    ).fit(X, y)  # fmt: skip
    assert s.solver_ == "nystrom"
    got = np.stack([s.cv_results_[f"split{f}_test_score"] for f in range(len(splits))], axis=1)
    brute = {g: brute_scores(X, y, g, splits, ALPHAS, scoring) for g in GAMMAS}
    order = [(c["gamma"], c["alpha"]) for c in s.cv_results_["params"]]
    assert sorted(order) == sorted((g, a) for g in GAMMAS for a in ALPHAS)
    want = np.stack([brute[g][ALPHAS.index(a)] for g, a in order])
    np.testing.assert_allclose(got, want, rtol=1e-8)
    best = int(np.argmax(want.mean(axis=1)))
    assert s.best_params_ == {"gamma": order[best][0], "alpha": order[best][1]}
    # the refit: KernelRidge(solver="nystrom") with the best parameters and the same centres
    ref = KernelRidge(
        alpha=s.best_alpha_, kernel="rbf", gamma=s.best_params_["gamma"], solver="nystrom",
        n_centers=M, random_state=0,
    ).fit(X, y)  # fmt: skip
    kern = copy.deepcopy(resolve_kernel("rbf", None, 3, 1)).set_params(
        gamma=s.best_params_["gamma"]
    )
    np.testing.assert_array_equal(s.best_estimator_.centers_, nystrom_centres(X, kern, M))
    np.testing.assert_array_equal(s.best_estimator_.centers_, ref.centers_)
    np.testing.assert_allclose(s.predict(X[:50]), ref.predict(X[:50]), rtol=1e-12)


def test_sample_weights_equal_brute_force():
    X, y = data(n=400, t=2, seed=1)
    w = np.random.default_rng(2).uniform(0.2, 3.0, size=X.shape[0])
    splits = list(KFold(3, shuffle=True, random_state=1).split(X))
    kern = copy.deepcopy(resolve_kernel("rbf", None, 3, 1)).set_params(gamma=0.5)
    out = nystrom_cv.setting_statistics(
        X, y, kern, splits, ALPHAS, lambda a, n: a, m=M, centers="uniform", random_state=0,
        sample_weight=w,
    )  # fmt: skip
    for scoring in ("neg_mean_squared_error", "r2"):
        got = np.array(
            [[nystrom_cv.scores_from_statistics(v, scoring) for v in row] for row in out]
        )
        want = brute_scores(X, y, 0.5, splits, ALPHAS, scoring, w=w)
        np.testing.assert_allclose(got, want, rtol=1e-8)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_folds_statistics_are_the_solvers_pass_sums_on_its_rows_to_the_bit(weighted):
    """The CV's pass is the solver's (one home, ``kernel_blocks`` + ``add_block_sums``):
    for folds made of whole row blocks, S_f and r_f equal ``pass_sums`` (``K_nMᵀ W K_nM``,
    ``K_nMᵀ W y``) over the fold's rows alone, bitwise; W_f, q_f, s_f are the fold's."""
    X, y = data(n=300, t=2, seed=3)
    n, b = X.shape[0], 64
    w = np.random.default_rng(4).uniform(0.2, 3.0, size=n) if weighted else None
    kern = copy.deepcopy(resolve_kernel("rbf", None, 3, 1)).set_params(gamma=0.5)
    idx = nystrom_centres(X, kern, M)
    C = X[idx]
    fold = np.ones(n, dtype=np.int64)
    fold[b : 3 * b] = 0  # fold 0: blocks 1-2; fold 1: blocks 0, 3 and the short last one
    st = nystrom_cv.fold_statistics(X, y, kern, C, fold, 2, sample_weight=w, block_size=b)
    for f in (0, 1):
        rows = np.flatnonzero(fold == f)
        wf = None if w is None else w[rows]
        op = NystromNormalOperator(_Rows(X[rows], b), kern, idx, C, 1.0, wf, "float64", None)
        normal = np.zeros((M, M))
        acc = op.pass_sums(y[rows], normal)
        np.testing.assert_array_equal(st["S"][f], normal)
        np.testing.assert_array_equal(st["r"][f], acc)
        wr = np.ones(rows.size) if w is None else wf
        assert st["W"][f] == pytest.approx(wr.sum(), rel=1e-14)
        np.testing.assert_allclose(st["q"][f], (wr[:, None] * y[rows] ** 2).sum(axis=0))
        np.testing.assert_allclose(st["s"][f], (wr[:, None] * y[rows]).sum(axis=0))
    assert not np.array_equal(st["S"][0], st["S"][1])


def test_the_statistics_pass_refuses_a_non_finite_x_or_kernel_as_the_solver_does():
    X, y = data(n=200, t=1)
    y2 = y.reshape(-1, 1)
    fold = np.arange(200) % 2
    kern = resolve_kernel("rbf", None, 3, 1)
    C = X[:M]
    bad = X.copy()
    bad[150, 1] = np.nan  # not a centre
    msg = re.escape("X contains NaN or infinite values; clean or impute them first")
    with pytest.raises(ValueError, match=msg):
        nystrom_cv.fold_statistics(bad, y2, kern, C, fold, 2, block_size=64)
    with pytest.raises(ValueError, match=msg):
        nystrom_solve(bad, y, kern, 1.0, n_centers=M, centre_indices=np.arange(M), block_size=64)
    poly = make_kernel({"name": "polynomial", "params": {"degree": 3}})
    big = X.copy()
    big[150] = 1e120  # K(X, C) overflows, K(C, C) does not
    what = re.escape("the kernel K(X, C) of the Nyström centres holds a non-finite value")
    with pytest.raises(NonFiniteKernelError, match=what), np.errstate(all="ignore"):
        nystrom_cv.fold_statistics(big, y2, poly, C, fold, 2, block_size=64)
    with pytest.raises(NonFiniteKernelError, match=what), np.errstate(all="ignore"):
        nystrom_solve(big, y, poly, 1.0, n_centers=M, centre_indices=np.arange(M), block_size=64)


def test_bad_scorer_refused():
    X, y = data(n=200)
    with pytest.raises(ValueError, match="neg_mean_absolute_error.*solver='nystrom'.*'r2'"):
        KernelRidgeCV(
            ALPHAS, solver="nystrom", n_centers=20, scoring="neg_mean_absolute_error"
        ).fit(X, y)


def test_refine_refused_before_any_work(monkeypatch):
    X, y = data(n=200)
    monkeypatch.setattr(nystrom_cv, "fold_statistics", None)  # no pass over X may start
    with pytest.raises(ValueError, match="refine=True.*solver='nystrom' does not refine"):
        KernelRidgeCV(ALPHAS, solver="nystrom", n_centers=20, refine=True).fit(X, y)


def test_memory_refused(monkeypatch):
    X, y = data(n=200)
    monkeypatch.setattr(nystrom_cv, "memory_budget", lambda: 1e5)
    msg = r"\(folds \+ 1\) = 6 M x M float64 matrices with M = n_centers = 50 and 5 folds: 120000 bytes"
    with pytest.raises(ValueError, match=msg):
        KernelRidgeCV(ALPHAS, solver="nystrom", n_centers=50).fit(X, y)


def test_splits_that_are_not_complements_refused():
    X, y = data(n=200)
    splits = [(np.arange(0, 100), np.arange(150, 200))]
    with pytest.raises(ValueError, match="complement of its test set"):
        KernelRidgeCV(ALPHAS, solver="nystrom", n_centers=20, cv=splits).fit(X, y)


def test_checkpoint_resumes(tmp_path):
    X, y = data(n=300)
    kw = dict(param_grid={"gamma": GAMMAS}, solver="nystrom", n_centers=30,
              checkpoint=tmp_path / "ck")  # fmt: skip
    a = KernelRidgeCV(ALPHAS, **kw).fit(X, y)
    b = KernelRidgeCV(ALPHAS, **kw).fit(X, y)
    assert b.search_stats_["settings_resumed"] == len(GAMMAS)
    np.testing.assert_array_equal(
        a.cv_results_["mean_test_score"], b.cv_results_["mean_test_score"]
    )
    c = KernelRidgeCV(ALPHAS, **{**kw, "n_centers": 31}).fit(X, y)  # other centres: recomputed
    assert c.search_stats_.get("settings_resumed", 0) == 0


def test_scores_in_the_data_units():
    """The select stage's scorer of the data's units (y stored standardised): the MSE of
    the mapped-back targets is scale² times the standardised one, R² unchanged."""
    from pipeline.stages.select import OriginalUnits

    X, y = data(n=300, t=2)
    mean, scale = np.array([1.0, -2.0]), np.array([3.0, 0.5])
    kw = dict(solver="nystrom", n_centers=30, cv=3)
    plain = KernelRidgeCV(ALPHAS, scoring="neg_mean_squared_error", **kw).fit(X, y)
    units = KernelRidgeCV(
        ALPHAS, scoring=OriginalUnits("neg_mean_squared_error", mean, scale), **kw
    ).fit(X, y)
    r2 = KernelRidgeCV(ALPHAS, scoring=OriginalUnits(None, mean, scale), **kw).fit(X, y)
    plain_r2 = KernelRidgeCV(ALPHAS, **kw).fit(X, y)
    for f in range(3):
        key = f"split{f}_test_score"
        np.testing.assert_array_equal(r2.cv_results_[key], plain_r2.cv_results_[key])
    # per column: -mean_j(scale_j² rss_j / W); check against brute force per column
    splits = list(KFold(3).split(X))
    want = np.mean(
        [scale[j] ** 2 * brute_scores(X, y[:, j], None, splits, ALPHAS,
                                      "neg_mean_squared_error", centres_m=30)
         for j in range(2)], axis=0,
    )  # fmt: skip
    got = np.stack([units.cv_results_[f"split{f}_test_score"] for f in range(3)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-8)
    assert not np.allclose(got, plain.cv_results_["split0_test_score"][:, None])


def test_config_section_keeps_its_fingerprint_unless_nystrom_knobs_are_set():
    from pipeline.stages.config import CvConfig

    dump = CvConfig(alphas=[0.1]).stage_dump()
    assert "n_centers" not in dump and "centers" not in dump
    dump = CvConfig(alphas=[0.1], solver="nystrom", n_centers=30, centers="rpcholesky")
    assert dump.stage_dump()["n_centers"] == 30
    assert dump.stage_dump()["centers"] == "rpcholesky"


def test_select_stage_runs_the_nystrom_search(tmp_path):
    """``cv.solver: nystrom`` in a run config: the select stage searches with it (y stored
    standardised: scored in the data's units) and its choice is KernelRidgeCV's."""
    from _diabetes_run import RUN

    from pipeline.stages import default_stages, run_stages
    from pipeline.stages.config import load_config
    from pipeline.stages.ingest import open_rows

    run_cfg = {
        **RUN,
        "cv": {"alphas": [0.03, 0.3, 3.0], "param_grid": {"gamma": [0.01, 0.1]}, "folds": 3,
               "solver": "nystrom", "n_centers": 40, "scoring": "neg_mean_squared_error"},
    }  # fmt: skip
    cfg = load_config(run_cfg, [])
    rep = run_stages(tmp_path / "run", default_stages(), cfg.stage_params(),
                     identity=cfg.identity())  # fmt: skip
    sel = rep.outputs["select"]
    ing = rep.outputs["ingest"]
    X = np.asarray(open_rows(ing, "X_train").compute())
    y = np.asarray(open_rows(ing, "y_train").compute()).ravel()
    s = KernelRidgeCV(
        [0.03, 0.3, 3.0], param_grid={"gamma": [0.01, 0.1]}, cv=3, solver="nystrom",
        n_centers=40, scoring="neg_mean_squared_error", random_state=0, refit=False,
    ).fit(X, y)  # fmt: skip
    assert sel["best_params"] == pytest.approx(s.best_params_)
    scale = ing["y_scaler"]["scale"][0]
    assert sel["best_score"] == pytest.approx(s.best_score_ * scale**2, rel=1e-10)


def test_held_out_residuals_are_summed_from_predictions_where_the_moments_cancel():
    """Each fold's held-out residuals are those of its test rows' predictions ``k(x, C) β``,
    also where the moment formula ``q - 2 β·r + βᵀ S β`` cancels: centres on a grid of
    repeated rows (X rounded to 0.1), a smooth kernel and a small λ make β about 1e7.
    On diamonds (35,000 rows, M = 2,000 uniform centres) that formula gave a fold an R² of
    1.000000 where its predictions scored -10.6, and the search picked that setting."""
    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(600, 2)), 1)
    y = (np.sin(X[:, 0]) + 0.1 * rng.standard_normal(600)).reshape(-1, 1)
    splits = list(KFold(3, shuffle=True, random_state=0).split(X))
    kern = make_kernel("rbf", gamma=0.05)
    lam, m = 1e-5, 150
    out = nystrom_cv.setting_statistics(
        X, y, kern, splits, [lam], lambda a, n: a, m=m, centers="uniform", random_state=0
    )
    C = X[nystrom_centres(X, kern, m, random_state=0)]
    fold = nystrom_cv.fold_index(600, splits)
    st, K_MM, base = nystrom_cv.setting_system(
        X, y, kern, C, fold, 3, shift=lam
    )  # the search's bits
    raw = nystrom_cv.fold_statistics(X, y, kern, C, fold, 3)  # in the centres' own basis
    moments_off = 0.0
    for f, (_, te) in enumerate(splits):
        beta, _ = nystrom_cv.fold_coefficients(st, K_MM, f, lam, base)
        G = np.empty((len(te), m))
        kernel_tile(kern, X[te], C, G, kernel_dtype="float64")
        direct = float(np.sum((y[te] - G @ beta) ** 2))
        np.testing.assert_allclose(out[0][f][0], direct, rtol=1e-6)
        S, r, q = raw["S"][f], raw["r"][f], raw["q"][f]
        moments = float((q - 2 * np.sum(beta * r, axis=0) + np.sum(beta * (S @ beta), axis=0))[0])
        moments_off = max(moments_off, abs(moments - direct) / direct)
    assert moments_off > 0.1  # the case is one where the moment formula fails


def test_r2_of_a_target_far_from_zero_and_of_pooled_folds_equal_scikit_learns():
    """R²'s denominator ``Σ w (y - ȳ)²`` is summed about each fold's mean on the second
    pass: from the moments, ``Σ w y² - (Σ w y)² / Σ w`` is 5 % off at y = 1e7 ± 1 (and 0
    at 1e8), which moves an R² near 0 by 0.05. Pooled
    folds (leave-one-out's one score) combine by the parallel-axis rule."""
    X, y = data(n=300, seed=5)
    y = (1e7 + y).reshape(-1, 1)
    w = np.random.default_rng(6).uniform(0.5, 2.0, size=300)
    splits = list(KFold(3, shuffle=True, random_state=0).split(X))
    # a constant kernel term carries the offset
    kern = make_kernel("rbf", gamma=0.5) + Constant(1e14)
    out = nystrom_cv.setting_statistics(
        X, y, kern, splits, [3e-2], lambda a, n: a, m=M, centers="uniform", random_state=0,
        sample_weight=w,
    )  # fmt: skip
    C = X[nystrom_centres(X, kern, M, random_state=0)]
    fold = nystrom_cv.fold_index(300, splits)
    st, K_MM, base = nystrom_cv.setting_system(X, y, kern, C, fold, 3, sample_weight=w, shift=3e-2)
    ys, ps, ws = [], [], []
    for f, (_, te) in enumerate(splits):
        beta, _ = nystrom_cv.fold_coefficients(st, K_MM, f, 3e-2, base)
        G = np.empty((len(te), M))
        kernel_tile(kern, X[te], C, G, kernel_dtype="float64")
        p = G @ beta
        want = r2_score(y[te], p, sample_weight=w[te])
        assert -1.0 < want < 1.0
        assert nystrom_cv.scores_from_statistics(out[0][f], "r2") == pytest.approx(want, rel=1e-7)
        ys, ps, ws = ys + [y[te]], ps + [p], ws + [w[te]]
    want = r2_score(np.vstack(ys), np.vstack(ps), sample_weight=np.concatenate(ws))
    got = nystrom_cv.scores_from_statistics(nystrom_cv.pooled(out[0]), "r2")
    assert got == pytest.approx(want, rel=1e-7)


@pytest.mark.parametrize("mapped", [False, True])
def test_every_lambda_of_a_fold_from_one_eigendecomposition_equals_its_direct_solves(mapped):
    """:class:`ShiftPath` (the search's λ path: one eigendecomposition per fold) solves the
    system the direct solve factors λ by λ, in the centres' basis and in the mapped one,
    with weights and two targets: the test rows' predictions agree to 1e-9."""
    X, y = data(n=450, t=2, seed=3)
    w = np.random.default_rng(4).uniform(0.3, 2.0, size=450)
    splits = list(KFold(3, shuffle=True, random_state=2).split(X))
    kern = make_kernel("rbf", gamma=0.5)
    C = X[nystrom_centres(X, kern, M, random_state=0)]
    fold = nystrom_cv.fold_index(450, splits)
    K_MM = centre_kernel(kern, C)
    base = FalkonPreconditioner(K_MM, 1.0)
    maps = base.map_rows if mapped else None
    st = nystrom_cv.fold_statistics(X, y, kern, C, fold, 3, sample_weight=w, map_rows=maps)
    path = ShiftPath.make(base, mapped)
    assert path is not None and path.kappa_min > 0.5
    shifts = [1.7 * a for a in ALPHAS]
    for f, (_, te) in enumerate(splits):
        B, res = path.coefficients(st["S"][3] - st["S"][f], st["r"][3] - st["r"][f], shifts)
        assert B.shape == (M, 2 * len(shifts)) and np.max(res) < 1e-10
        G = np.empty((len(te), M))
        kernel_tile(kern, X[te], C, G, kernel_dtype="float64")
        for li, s in enumerate(shifts):
            beta, _ = nystrom_cv.fold_coefficients(st, K_MM, f, s, base)
            want = G @ beta
            got = G @ B[:, 2 * li : 2 * li + 2]
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())


def test_a_singular_centre_kernel_is_solved_lambda_by_lambda():
    """Repeated centres make K_MM singular (κ_min about 0): no λ path
    (:data:`~pipeline.linalg.nystrom_solve.PATH_KAPPA_MIN`); the search solves each λ
    directly and its scores still equal the brute-force solves."""
    X, y = data(n=120, seed=7)
    X, y = np.repeat(X, 3, axis=0), np.repeat(y, 3)
    kern = make_kernel("rbf", gamma=0.5)
    m = 100
    C = X[nystrom_centres(X, kern, m, random_state=0)]
    assert len(np.unique(C, axis=0)) < m
    K_MM = centre_kernel(kern, C)
    assert ShiftPath.make(FalkonPreconditioner(K_MM, 1.0), False) is None
    splits = list(KFold(3, shuffle=True, random_state=0).split(X))
    out = nystrom_cv.setting_statistics(
        X, y.reshape(-1, 1), kern, splits, ALPHAS, lambda a, n: a, m=m, centers="uniform",
        random_state=0,
    )  # fmt: skip
    got = np.array([[nystrom_cv.scores_from_statistics(v, "r2") for v in row] for row in out])
    want = brute_scores(X, y, 0.5, splits, ALPHAS, "r2", centres_m=m)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_nested_fidelities_are_nystrom_on_the_first_pivots():
    """``setting_statistics(nested=)``: the held-out residuals of Nyström KRR on the first
    m' RPCholesky pivots (the CV screen's fidelities) come from the leading blocks of the
    same statistics and equal a brute-force solve on those centres, fold by fold."""
    X, y = data(n=400, t=2, seed=4)
    splits = list(KFold(3, shuffle=True, random_state=3).split(X))
    kern = make_kernel("rbf", gamma=0.5)
    out = nystrom_cv.setting_statistics(
        X, y, kern, splits, ALPHAS, lambda a, n: a, m=M, centers="rpcholesky",
        random_state=0, nested=(M // 4, M // 2),
    )  # fmt: skip
    piv = nystrom_centres(X, kern, M, centers="rpcholesky", random_state=0, pivot_order=True)
    np.testing.assert_array_equal(np.sort(piv), nystrom_centres(X, kern, M, centers="rpcholesky"))
    for j, mm in enumerate((M, M // 4, M // 2)):
        C = X[piv[:mm]]
        for f, (tr, te) in enumerate(splits):
            Xa, ya = np.vstack([X[tr], C]), np.vstack([y[tr], np.zeros((mm, 2))])
            wa = np.concatenate([np.ones(len(tr)), np.zeros(mm)])
            for li, a in enumerate(ALPHAS):
                sol = nystrom_solve(
                    Xa, ya, kern, a, n_centers=mm, sample_weight=wa, method="direct",
                    centre_indices=np.arange(len(tr), len(tr) + mm),
                )  # fmt: skip
                R = y[te] - np.asarray(kernel_matrix(kern, X[te], C)) @ sol.coef
                got = nystrom_cv.nested_vectors(out[li][f], 2)[j][:2]
                np.testing.assert_allclose(got, (R * R).sum(axis=0), rtol=1e-7)
