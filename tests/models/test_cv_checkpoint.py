"""The CV search's per-setting checkpoints: what their fingerprint covers, and
leave-one-out's pooled predictions (session 25's review found both wrong)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.models.selection import KernelRidgeCV


def _data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def test_a_screened_searchs_checkpoints_are_not_resumed_by_an_unscreened_one(tmp_path):
    # screening keeps rough CG solves for the lambdas it does not refine; an unscreened
    # search on the same checkpoint reused them (scores off by 0.15) with exit 0
    X, y = _data(80)
    kw = dict(param_grid={"gamma": [0.2]}, cv=3, solver="cg", block_size=32,
              preconditioner="none", refit=False, tol=1e-8)  # fmt: skip
    alphas = [1e-2, 1e-1, 1.0]
    ck = str(tmp_path / "ck")
    KernelRidgeCV(alphas, checkpoint=ck, screen_tol=0.5, screen_top=1, **kw).fit(X, y)
    again = KernelRidgeCV(alphas, checkpoint=ck, **kw).fit(X, y)
    fresh = KernelRidgeCV(alphas, **kw).fit(X, y)
    assert not again.search_stats_.get("settings_resumed")
    np.testing.assert_allclose(
        again.cv_results_["mean_test_score"], fresh.cv_results_["mean_test_score"], atol=1e-9
    )
    # the same unscreened search again does resume, with the same scores
    third = KernelRidgeCV(alphas, checkpoint=ck, **kw).fit(X, y)
    assert third.search_stats_.get("settings_resumed") == 1
    np.testing.assert_array_equal(
        third.cv_results_["mean_test_score"], again.cv_results_["mean_test_score"]
    )


@pytest.mark.parametrize("solver", ["eigen", "cholesky"])
def test_leave_one_out_with_a_checkpoint_saves_and_resumes(tmp_path, solver):
    # LOO stores one pooled prediction array per lambda; the checkpoint counted n folds
    # and raised IndexError, so the CLI's cv: {folds: loo} always failed
    X, y = _data(60)
    kw = dict(gamma=0.3, cv="loo", solver=solver, refit=False, store=str(tmp_path / "s"))
    first = KernelRidgeCV([0.1, 1.0], checkpoint=str(tmp_path / "ck"), **kw).fit(X, y)
    again = KernelRidgeCV([0.1, 1.0], checkpoint=str(tmp_path / "ck"), **kw).fit(X, y)
    plain = KernelRidgeCV([0.1, 1.0], **kw).fit(X, y)
    assert again.search_stats_.get("settings_resumed") == 1
    for m in (first, again):
        np.testing.assert_allclose(
            m.cv_results_["mean_test_score"], plain.cv_results_["mean_test_score"], rtol=1e-12
        )


def test_the_select_stage_scores_in_the_data_units_of_y(tmp_path):
    # with standardize_y the stored y_train is standardised, and neg_mean_squared_error
    # was reported in its units: var(y) (about 5,900 for diabetes) times too small
    from pipeline.stages import default_stages, run_stages
    from pipeline.stages.config import load_config
    from pipeline.stages.ingest import open_rows

    run = {
        "data": {"source": "sklearn", "name": "diabetes"},
        "split": {"test_fraction": 0.25},
        "preprocess": {"standardize_y": True},
        "kernel": {"name": "rbf", "params": {"gamma": 0.1}},
        "lambda": 0.5,
        "evaluate": {"baseline": "none"},
        "cv": {"alphas": [0.01, 0.1], "folds": 3, "solver": "eigen",
               "scoring": "neg_mean_squared_error"},
    }  # fmt: skip
    cfg = load_config(run)
    rep = run_stages(tmp_path / "run", default_stages(), cfg.stage_params(),
                     identity=cfg.identity(), until="select")  # fmt: skip
    ing, sel = rep.outputs["ingest"], rep.outputs["select"]
    X = np.asarray(open_rows(ing, "X_train").compute())
    y = np.asarray(open_rows(ing, "y_train").compute())[:, 0]
    std = KernelRidgeCV([0.01, 0.1], gamma=0.1, cv=3, solver="eigen",
                        scoring="neg_mean_squared_error", refit=False).fit(X, y)  # fmt: skip
    scale = ing["y_scaler"]["scale"][0]
    assert scale > 10
    np.testing.assert_allclose(sel["best_score"], std.best_score_ * scale**2, rtol=1e-10)
