"""``KernelRidge(keep_gram=False)`` and the plan's ``keep_gram``/``check_disk`` options."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.plan.fit_plan import Resources, plan_fit


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(250, 3))
    y = np.cos(X[:, 0]) + 0.1 * rng.normal(size=250)
    return X, y


def _fit(X, y, store, alpha, keep_gram):
    return KernelRidge(
        alpha=alpha,
        kernel="rbf",
        gamma=0.3,
        solver="cholesky",
        block_size=64,
        store=str(store),
        keep_gram=keep_gram,
    ).fit(X, y)


def test_in_place_matches_and_refits_with_a_new_alpha(data, tmp_path):
    X, y = data
    kept = _fit(X, y, tmp_path / "kept", 1e-2, True)
    inplace = _fit(X, y, tmp_path / "inplace", 1e-2, False)
    # in place, the Gram's tiles are computed on demand by the tile engine's fused
    # evaluation: the same alpha to rounding, not bit for bit (tests/linalg/test_gram_on_demand.py)
    np.testing.assert_allclose(inplace.dual_coef_, kept.dual_coef_, rtol=1e-9, atol=1e-10)
    assert inplace.fit_info_.get("keep_gram") is False
    again = _fit(X, y, tmp_path / "inplace", 1e-1, False)
    ref = _fit(X, y, tmp_path / "kept", 1e-1, True)
    np.testing.assert_allclose(again.dual_coef_, ref.dual_coef_, rtol=1e-9, atol=1e-10)


def test_keep_gram_is_validated():
    with pytest.raises(ValueError, match="keep_gram"):
        KernelRidge(solver="cholesky", keep_gram="no").fit(np.ones((4, 1)), np.ones(4))


def test_plan_carries_keep_gram_and_check_disk():
    res = Resources(memory_bytes=1e12, disk_bytes=1e15, in_memory=False)
    plan, _ = plan_fit(1000, 4, None, res, {"solver": "cholesky", "keep_gram": False})
    assert plan.options.keep_gram is False and plan.options.check_disk is True
    assert "keep_gram=False" in plan.describe()
    plan, _ = plan_fit(1000, 4, None, res, {"solver": "cholesky", "check_disk": False})
    assert plan.options.keep_gram is True and plan.options.check_disk is False


def test_config_keys():
    from pipeline.stages.config import SolverConfig

    s = SolverConfig(keep_gram=False, check_disk=False)
    assert s.keep_gram is False and s.check_disk is False
    assert SolverConfig().keep_gram is True and SolverConfig().check_disk is True


def test_float32_in_place_stores_a_float32_gram_and_refines_to_float64(data, tmp_path):
    """``keep_gram=False, factor_dtype="float32"``: the plan stores the Gram in float32
    (the in-place factor's own dtype; it used to raise a dtype mismatch) and the fit
    refines alpha to the float64 answer with matrix-free products from X, for two
    alphas and for a Dask X."""
    from pipeline.linalg.gram import open_gram

    X, y = data
    for alpha in (1e-2, 1e-1):
        ref = _fit(X, y, tmp_path / "kept", alpha, True)
        m = KernelRidge(
            alpha=alpha, kernel="rbf", gamma=0.3, solver="cholesky", block_size=64,
            store=str(tmp_path / "f32"), keep_gram=False, factor_dtype="float32",
        ).fit(X, y)  # fmt: skip
        np.testing.assert_allclose(m.dual_coef_, ref.dual_coef_, rtol=1e-8, atol=1e-10)
        assert m.fit_info_["rel_residual"] <= 1e-11
        assert np.dtype(open_gram(m.fit_info_["store"], "gram").dtype) == np.float32
    import dask.array as da  # the estimator holds a Dask X in memory for the refinement

    m = KernelRidge(
        alpha=1e-1, kernel="rbf", gamma=0.3, solver="cholesky", block_size=64,
        store=str(tmp_path / "f32dask"), keep_gram=False, factor_dtype="float32",
    ).fit(da.from_array(X, chunks=64), y)  # fmt: skip
    np.testing.assert_allclose(m.dual_coef_, ref.dual_coef_, rtol=1e-8, atol=1e-10)
