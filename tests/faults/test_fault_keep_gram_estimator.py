"""``KernelRidge(keep_gram=False)`` and the plan's ``keep_gram``/``check_disk`` options."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.policy.plan import Resources, plan_fit


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
    np.testing.assert_allclose(inplace.dual_coef_, kept.dual_coef_, rtol=1e-12, atol=1e-12)
    assert inplace.fit_info_.get("keep_gram") is False
    again = _fit(X, y, tmp_path / "inplace", 1e-1, False)
    ref = _fit(X, y, tmp_path / "kept", 1e-1, True)
    np.testing.assert_allclose(again.dual_coef_, ref.dual_coef_, rtol=1e-12, atol=1e-12)


def test_keep_gram_is_validated():
    with pytest.raises(ValueError, match="keep_gram"):
        KernelRidge(solver="cholesky", keep_gram="no").fit(np.ones((4, 1)), np.ones(4))


def test_plan_carries_keep_gram_and_check_disk():
    res = Resources(memory_bytes=1e12, disk_bytes=1e15, in_memory=False)
    plan, _ = plan_fit(1000, 4, None, res, {"solver": "cholesky", "keep_gram": False})
    assert plan.keep_gram is False and plan.check_disk is True
    assert "keep_gram=False" in plan.describe()
    plan, _ = plan_fit(1000, 4, None, res, {"solver": "cholesky", "check_disk": False})
    assert plan.keep_gram is True and plan.check_disk is False


def test_config_keys():
    from pipeline.config import SolverConfig

    s = SolverConfig(keep_gram=False, check_disk=False)
    assert s.keep_gram is False and s.check_disk is False
    assert SolverConfig().keep_gram is True and SolverConfig().check_disk is True
