"""One fitted-model type (issue #43, item 2): every fit produces a
:class:`pipeline.models.artifact.Model`, made once, and every estimator predicts by it.

``KernelRidge.model_`` was a view made from the estimator on each access, the in-memory
reference fit returned a type of its own (``ReferenceModel``, with its own predict), and
the estimators predicted by code of their own; the Model's own predict of a primal fit
was another evaluation than its estimator's.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.kernel_ridge import KernelRidge as SKKernelRidge

from pipeline import KernelPerceptron, KernelRidge, load
from pipeline.fit import FitResult, fit_reference
from pipeline.kernels import RBF, Linear
from pipeline.models.artifact import Model, load_artifact
from pipeline.models.selection import KernelRidgeCV


def _data(n=150, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(n), rng.standard_normal((37, d))


def _same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()  # bitwise


def _calls(monkeypatch):
    """Count Model.predict calls (the estimators must predict through it)."""
    calls = []
    real = Model.predict

    def spy(self, X, **kw):
        calls.append(self)
        return real(self, X, **kw)

    monkeypatch.setattr(Model, "predict", spy)
    return calls


@pytest.mark.parametrize(
    "params",
    [
        {"kernel": "rbf", "gamma": 0.5, "solver": "dense"},
        {"kernel": "linear", "solver": "primal"},
        {"kernel": "rbf", "solver": "cholesky", "block_size": 64},
        {"kernel": "rbf", "solver": "cg", "block_size": 64},
    ],
    ids=["dense", "primal", "cholesky", "cg"],
)
def test_kernel_ridge_holds_one_model_made_by_fit_and_predicts_by_it(params, monkeypatch):
    X, y, Xt = _data()
    est = KernelRidge(alpha=0.3, **params).fit(X, y)
    m = est.model_
    assert type(m) is Model and est.model_ is m  # made once, by fit: not a view per access
    assert m.extra["solver_"] == est.solver_
    assert m.dual_coef is est.dual_coef_
    calls = _calls(monkeypatch)
    got = est.predict(Xt)
    assert calls == [m]  # the estimator's predict is the model's
    # the model predicts what the estimator does, with the estimator's block sizes
    bs = est.block_size or 2048
    _same(m.predict(Xt, block_size=bs, train_block_size=bs), got)
    if est.solver_ == "primal":
        _same(got, Xt @ est.primal_coef_)  # in memory, as the primal fit predicted
    # a new fit makes a new model
    est.set_params(alpha=0.7).fit(X, y)
    assert est.model_ is not m and est.model_.regularization == 0.7


def test_a_loaded_estimator_holds_the_loaded_model(tmp_path):
    X, y, Xt = _data()
    est = KernelRidge(alpha=0.3, kernel="rbf", solver="dense").fit(X, y)
    saved = est.save(str(tmp_path / "m"))
    back = load(str(tmp_path / "m"))
    assert type(back.model_) is Model and back.model_.path == saved.path
    assert back.model_.model_fingerprint == saved.model_fingerprint != ""
    _same(back.predict(Xt), est.predict(Xt))
    # and the artifact loaded on its own predicts as the estimator did
    _same(load_artifact(tmp_path / "m").predict(Xt), est.predict(Xt))


def test_a_primal_model_predicts_as_its_estimator_through_its_artifact(tmp_path):
    X, y, Xt = _data()
    for rows in (X, X.astype(np.float32)):
        est = KernelRidge(alpha=1e-2, kernel="linear", solver="primal").fit(rows, y)
        new = Xt.astype(rows.dtype)
        est.save(str(tmp_path / str(rows.dtype)))
        _same(load_artifact(tmp_path / str(rows.dtype)).predict(new), est.predict(new))


def test_the_model_predicts_rows_it_cannot_take_in_memory_blockwise():
    """The in-memory path takes finite rows in memory only: a NaN row, a table, a batch
    into a store or ``nan_policy`` are the blockwise prediction's, errors included."""
    X, y, Xt = _data()
    m = KernelRidge(alpha=0.3, kernel="rbf", solver="dense").fit(X, y).model_
    bad = Xt.copy()
    bad[5, 1] = np.nan
    with pytest.raises(ValueError, match="nan_policy='propagate'"):
        m.predict(bad)
    got = m.predict(bad, nan_policy="propagate", progress=False)
    assert np.isnan(got[5]) and np.isfinite(np.delete(got, 5)).all()
    np.testing.assert_allclose(np.delete(got, 5), np.delete(m.predict(Xt), 5), atol=1e-12)
    with pytest.raises(ValueError, match="features"):
        m.predict(Xt[:, :3])
    _same(m.predict(sp.csr_matrix(Xt)), m.predict(Xt))


def test_callable_and_precomputed_kernels_have_no_model_but_predict():
    X, y, Xt = _data(n=40)
    rbf = RBF(gamma=0.5)
    est = KernelRidge(alpha=0.3, kernel=lambda a, b: float(rbf(a[None], b[None])[0, 0]))
    est.fit(X, y)
    with pytest.raises(ValueError, match="cannot be saved"):
        _ = est.model_
    want = SKKernelRidge(alpha=0.3, kernel="rbf", gamma=0.5).fit(X, y).predict(Xt)
    np.testing.assert_allclose(est.predict(Xt), want, atol=1e-10)
    pre = KernelRidge(alpha=0.3, kernel="precomputed").fit(rbf(X), y)
    with pytest.raises(ValueError, match="cannot be saved"):
        _ = pre.model_
    np.testing.assert_allclose(pre.predict(rbf(Xt, X)), want, atol=1e-10)


def test_kernel_ridge_cv_refits_hold_a_model(tmp_path, monkeypatch):
    X, y, Xt = _data(n=120)
    for kw in ({}, {"solver": "cholesky", "store": str(tmp_path / "s")}):
        cv = KernelRidgeCV(alphas=[0.1, 1.0], kernel="rbf", cv=3, **kw).fit(X, y)
        best = cv.best_estimator_
        assert type(best.model_) is Model and best.model_ is best.model_
        calls = _calls(monkeypatch)
        cv.predict(Xt)
        assert calls == [best.model_]
        monkeypatch.undo()


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("n_classes", [2, 3])
def test_the_perceptron_holds_a_model_that_is_its_decision_function(n_classes, tmp_path):
    X, _, Xt = _data()
    labels = np.digitize(X[:, 0], [0.0] if n_classes == 2 else [-0.5, 0.5])
    est = KernelPerceptron(kernel="rbf", max_epochs=5).fit(X, labels)
    m = est.model_
    assert type(m) is Model and est.model_ is m
    _same(m.predict(Xt), est.decision_function(Xt))
    _same(np.asarray(m.preprocessing["y_mean"]), np.asarray(est.intercept_, dtype=np.float64))
    m.save(str(tmp_path / "p"))
    back = load_artifact(tmp_path / "p")
    assert back.extra["estimator"] == "pipeline.KernelPerceptron"
    _same(back.predict(Xt), est.decision_function(Xt))
    with pytest.raises(ValueError, match="cannot be saved"):
        _ = KernelPerceptron(kernel="precomputed", max_epochs=5).fit(X @ X.T, labels).model_


def test_the_reference_fit_returns_a_result_and_the_model_is_built_from_it():
    X, y, Xt = _data()
    for kernel, solver in ((RBF(gamma=0.5), "dense"), (Linear(), "primal")):
        fit = fit_reference(X, y, kernel, 0.3, solver=solver)
        assert type(fit) is FitResult and not hasattr(fit, "predict")
        m = Model.from_fit(fit, X, kernel, 0.3)
        assert type(m) is Model and m.extra["solver_"] == solver
        sk = SKKernelRidge(alpha=0.3, kernel="rbf" if solver == "dense" else "linear", gamma=0.5)
        np.testing.assert_allclose(m.predict(Xt), sk.fit(X, y).predict(Xt), atol=1e-10)
        # the same model as KernelRidge's own fit makes
        est = KernelRidge(alpha=0.3, kernel=kernel, solver=solver).fit(X, y)
        _same(m.predict(Xt), est.predict(Xt))
