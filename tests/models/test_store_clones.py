"""``KernelRidge(store=...)`` goes wherever scikit-learn clones it (issue #20, item 6).

Each distinct fit gets its own subdirectory ``store/fit-<fingerprint>`` (parameters,
kernel identity, the content of X, y and the weights), so ``clone``,
``GridSearchCV`` and ``cross_val_score`` work with a store set; the same fit in the
same store reuses its subdirectory (a killed fit resumes); what is in the store and
not ours is left alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.kernel_ridge import KernelRidge as SkKernelRidge
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score

from pipeline import KernelRidge
from pipeline.kernels import RBF
from pipeline.linalg.gram import build_gram
from pipeline.storage import StoreMismatchError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(150, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.normal(size=150)
    return X, y


def test_grid_search_with_a_store_matches_scikit_learn(data, tmp_path):
    X, y = data
    grid = {"alpha": [0.05, 0.5], "gamma": [0.2, 0.8]}
    cv = KFold(3, shuffle=True, random_state=0)
    est = KernelRidge(kernel="rbf", solver="cholesky", block_size=40, store=tmp_path / "s")
    ours = GridSearchCV(est, grid, cv=cv, error_score="raise").fit(X, y)
    ref = GridSearchCV(SkKernelRidge(kernel="rbf"), grid, cv=cv).fit(X, y)
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], atol=1e-10
    )
    assert ours.best_params_ == ref.best_params_
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-9, atol=1e-10)
    # one subdirectory per distinct fit: 4 settings x 3 folds + the refit on all rows
    dirs = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert len(dirs) == 4 * 3 + 1 and all(d.startswith("fit-") for d in dirs)
    assert ours.best_estimator_.fit_info_["store"] in {str(tmp_path / "s" / d) for d in dirs}


def test_cross_val_score_with_a_store_cg(data, tmp_path):
    X, y = data
    kw = dict(alpha=0.1, kernel="rbf", gamma=0.5)
    est = KernelRidge(
        **kw, solver="cg", matvec="stored", tol=1e-12, block_size=32, store=tmp_path / "s"
    )
    ours = cross_val_score(est, X, y, cv=4, error_score="raise")
    ref = cross_val_score(SkKernelRidge(**kw), X, y, cv=4)
    np.testing.assert_allclose(ours, ref, atol=1e-9)


def test_clones_never_clash_and_the_same_fit_resumes(data, tmp_path):
    X, y = data
    store = tmp_path / "s"
    first = KernelRidge(alpha=0.1, kernel="rbf", solver="cholesky", block_size=40, store=store)
    first.fit(X, y)
    before = first.predict(X[:5])
    other = clone(first).fit(X[:100], y[:100])  # other data, same store: its own directory
    assert other.fit_info_["store"] != first.fit_info_["store"]
    np.testing.assert_allclose(
        other.dual_coef_,
        SkKernelRidge(alpha=0.1, kernel="rbf").fit(X[:100], y[:100]).dual_coef_,
        rtol=1e-9,
        atol=1e-10,
    )
    # the first fit's arrays are untouched: it still predicts, and refitting reuses them
    np.testing.assert_array_equal(first.predict(X[:5]), before)
    again = clone(first).fit(X, y)
    assert again.fit_info_["store"] == first.fit_info_["store"]
    assert again.fit_info_["factor_tiles_computed"] == 0
    np.testing.assert_array_equal(again.dual_coef_, first.dual_coef_)
    # another alpha on the same data is another fit too
    assert clone(first).set_params(alpha=0.2).fit(X, y).fit_info_["store"] not in (
        first.fit_info_["store"],
        other.fit_info_["store"],
    )


def test_fit_directory_is_stable_and_ignores_store_and_credentials(data, tmp_path):
    from pathlib import Path

    X, y = data
    kw = dict(alpha=0.1, kernel="rbf", solver="cholesky", block_size=64)
    a = KernelRidge(**kw, store=tmp_path / "a").fit(X, y)
    b = KernelRidge(**kw, store=str(tmp_path / "b")).fit(X, y)
    assert Path(a.fit_info_["store"]).name == Path(b.fit_info_["store"]).name
    # the kernel's identity, not how it was spelled: "rbf" with gamma=0.5 is RBF(0.5)
    c = KernelRidge(**{**kw, "kernel": "rbf"}, gamma=0.5, store=tmp_path / "c").fit(X, y)
    d = KernelRidge(**{**kw, "kernel": RBF(gamma=0.5)}, store=tmp_path / "d").fit(X, y)
    assert Path(c.fit_info_["store"]).name == Path(d.fit_info_["store"]).name


def test_what_is_not_ours_in_the_store_is_kept(data, tmp_path):
    X, y = data
    store = tmp_path / "s"
    store.mkdir()
    (store / "notes.txt").write_text("mine")
    (store / "gram").mkdir()  # a user's directory with the name of one of our arrays
    (store / "gram" / "data.bin").write_bytes(b"x" * 10)
    est = KernelRidge(alpha=0.1, kernel="rbf", solver="cholesky", block_size=40, store=store)
    GridSearchCV(est, {"alpha": [0.1, 1.0]}, cv=2, error_score="raise").fit(X, y)
    assert (store / "notes.txt").read_text() == "mine"
    assert (store / "gram" / "data.bin").read_bytes() == b"x" * 10


def test_store_mismatch_message_gives_advice_that_exists(data, tmp_path):
    X, y = data
    build_gram(X, RBF(0.5), tmp_path, 64, progress=False)
    with pytest.raises(StoreMismatchError) as err:
        build_gram(X[:100], RBF(0.5), tmp_path, 64, progress=False)
    msg = str(err.value)
    assert "or pass overwrite=True to replace it." not in msg
    assert "Use another store path, or remove that array" in msg
    assert "KernelRidge(store=...) gives each distinct fit its own subdirectory" in msg


@pytest.mark.slow
def test_grid_search_with_an_s3_store(data):
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    from _s3server import make_bucket, moto_server, s3_env

    X, y = data
    grid = {"alpha": [0.05, 0.5]}
    with moto_server() as env, s3_env(env):
        make_bucket("krr-clones")
        est = KernelRidge(
            kernel="rbf", gamma=0.4, solver="cholesky", block_size=64, store="s3://krr-clones/s"
        )
        ours = GridSearchCV(est, grid, cv=3, error_score="raise").fit(X, y)
        fs = s3fs.S3FileSystem()
        fs.invalidate_cache()
        dirs = {p.rsplit("/", 1)[-1] for p in fs.ls("krr-clones/s")}
    ref = GridSearchCV(SkKernelRidge(kernel="rbf", gamma=0.4), grid, cv=3).fit(X, y)
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"], atol=1e-10
    )
    assert len(dirs) == 2 * 3 + 1 and all(d.startswith("fit-") for d in dirs)
    assert ours.best_estimator_.fit_info_["store"].startswith("s3://krr-clones/s/fit-")
