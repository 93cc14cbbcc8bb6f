"""Estimator API defects found by the session-26 review (each test fails on the old code)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from pipeline import KernelRidge


def _data(n=60):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    return X, X[:, 0] + 0.1 * rng.normal(size=n)


def test_a_refused_refit_leaves_the_model_unfitted_not_half_fitted():
    # the scaler of a loaded krr run model was dropped before a check refused the refit,
    # and its old coefficients then predicted in standardised units (session 26)
    X, y = _data()
    m = KernelRidge(kernel="rbf").fit(X, y)
    m.preprocessing_ = {"x_mean": np.zeros(3), "x_scale": np.ones(3), "y_mean": [5.0],
                        "y_scale": [2.0]}  # fmt: skip
    m.set_params(solver="cholesky", alpha=0.0)
    with pytest.raises(ValueError, match="alpha > 0"):
        m.fit(X, y)
    with pytest.raises(NotFittedError):
        m.predict(X)


def test_a_sparse_precomputed_kernel_and_numpy_parameters():
    X, y = _data()
    K = X @ X.T
    ref = KernelRidge(kernel="precomputed", alpha=0.5).fit(K, y).predict(K)
    got = KernelRidge(kernel="precomputed", alpha=0.5).fit(sp.csr_matrix(K), y)
    np.testing.assert_allclose(got.predict(sp.csr_matrix(K)), ref, rtol=1e-10)
    KernelRidge(solver="cg", tol=np.float32(1e-6)).fit(X, y)  # refused as "not a float"


def test_random_state_numpy_ints_and_randomstate_are_honoured():
    # np.int64(3) and RandomState were silently replaced by seed 0 (session 26)
    X, y = _data()
    seeds = [KernelRidge(solver="cg", random_state=rs).fit(X, y)._seed
             for rs in (np.int64(3), np.random.RandomState(7), None)]  # fmt: skip
    assert seeds == [3, np.random.RandomState(7).randint(2**31 - 1), None]
    with pytest.raises(ValueError, match="random_state must be"):
        KernelRidge(solver="cg", random_state="x").fit(X, y)


def test_an_unconverged_cg_fit_warns_with_sklearns_convergence_warning():
    X, y = _data(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        with pytest.raises(ConvergenceWarning, match="did not converge"):
            KernelRidge(solver="cg", alpha=1e-8, max_iter=2, preconditioner="none").fit(X, y)


def test_input_errors_name_the_source_and_the_fix(tmp_path):
    import pandas as pd
    import zarr

    from pipeline.storage.inputs import as_row_blocks

    pd.DataFrame({"price": [1.0, 2.0], "carat": [3.0, 4.0]}).to_csv(tmp_path / "t.csv",
                                                                    index=False)  # fmt: skip
    assert as_row_blocks(str(tmp_path / "t.csv"), 4, columns="price").shape == (2, 1)
    zarr.create_array(store=str(tmp_path / "v.zarr"), shape=(10,), dtype="f8")
    with pytest.raises(ValueError, match="must be 2-D"):
        as_row_blocks(str(tmp_path / "v.zarr"), 4)
    np.save(tmp_path / "o.npy", np.array([[1, "a"]], dtype=object))
    with pytest.raises(ValueError, match="cannot be read as a numeric array"):
        as_row_blocks(str(tmp_path / "o.npy"), 4)
