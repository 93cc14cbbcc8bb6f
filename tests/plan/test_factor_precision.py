"""factor_dtype="auto": the rule (pipeline.plan.factor_precision) and its float64 fallback."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline import constants as C
from pipeline.fit import row_probes
from pipeline.kernels import RBF
from pipeline.linalg.spectrum import float32_factor_risk
from pipeline.plan.factor_precision import choose_factor_dtype
from pipeline.plan.fit_plan import Resources, plan_fit


def _smooth(n, seed=0):
    """Rows on a 2-D grid-like cloud: an RBF Gram whose eigenvalues fall to ~0."""
    return np.random.default_rng(seed).uniform(size=(n, 2))


def _gaussian(n, d=12, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d))


@pytest.fixture
def small_min_rows(monkeypatch):
    monkeypatch.setattr(C, "FACTOR_FLOAT32_MIN_ROWS", 200)
    monkeypatch.setattr(C, "FACTOR_FLOAT32_SAMPLE_ROWS", 300)


def test_risk_falls_as_the_shift_grows_and_is_deterministic():
    X, k = _smooth(400), RBF(gamma=0.5)
    risks = [float32_factor_risk(X, k, s) for s in (1e-8, 1e-5, 1e-2)]
    assert risks[0] > risks[1] > risks[2] > 0
    assert float32_factor_risk(X, k, 1e-5) == risks[1]  # seeded subsample
    # low-rank data at a tiny shift: far above the threshold; a large shift: below it
    assert risks[0] > C.FACTOR_FLOAT32_MAX_RISK > risks[2]


def test_rule_needs_rows_x_in_memory_and_a_safe_shift(small_min_rows):
    X, k = _gaussian(400), RBF(gamma=1 / 12)
    assert choose_factor_dtype(400, 1e-3, risk=row_probes(X, k).float32_risk)[0] == "float32"
    dt, why = choose_factor_dtype(150, 1e-3, risk=row_probes(X[:150], k).float32_risk)
    assert dt == "float64" and "150 < 200" in why
    dt, why = choose_factor_dtype(400, 1e-3, risk=row_probes(None, k).float32_risk)
    assert dt == "float64" and "X in memory" in why
    dt, why = choose_factor_dtype(
        400, 1e-9, risk=row_probes(_smooth(400), RBF(gamma=0.5)).float32_risk
    )
    assert dt == "float64" and "risk" in why


def test_plan_resolves_auto_only_for_the_cholesky(small_min_rows):
    X, k = _gaussian(400), RBF(gamma=1 / 12)
    res = Resources(memory_bytes=1 << 34, disk_bytes=1 << 40, in_memory=False)
    plan, reason = plan_fit(
        400,
        12,
        k,
        res,
        {"solver": "cholesky", "factor_dtype": "auto", "alpha": 1e-3},
        probes=row_probes(X, k),
    )
    assert plan.factor_dtype == "float32" and plan.factor_dtype_auto
    assert "factor float32" in reason
    plan, _ = plan_fit(
        400, 12, k, res, {"solver": "cg", "factor_dtype": "auto"}, probes=row_probes(X, k)
    )
    assert plan.factor_dtype == "float64" and not plan.factor_dtype_auto
    with pytest.raises(ValueError, match="factor_dtype='half'"):
        plan_fit(
            400, 12, k, res, {"solver": "cholesky", "factor_dtype": "half"}, probes=row_probes(X, k)
        )


@pytest.mark.parametrize("keep_gram", [True, False])
def test_auto_matches_the_float64_fit(small_min_rows, tmp_path, keep_gram):
    X = _gaussian(400)
    y = np.sin(X[:, 0])
    kw = dict(alpha=1e-3, kernel="rbf", gamma=1 / 12, solver="cholesky", block_size=150)
    exact = KernelRidge(**kw, store=str(tmp_path / "a")).fit(X, y)
    auto = KernelRidge(
        **kw, store=str(tmp_path / "b"), factor_dtype="auto", keep_gram=keep_gram
    ).fit(X, y)
    assert auto.fit_info_.get("refine_iterations", 0) >= 1  # the float32 factor, refined
    np.testing.assert_allclose(auto.dual_coef_, exact.dual_coef_, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("keep_gram", [True, False])
def test_a_failing_float32_choice_falls_back_to_float64(
    small_min_rows, monkeypatch, tmp_path, caplog, keep_gram
):
    monkeypatch.setattr(C, "FACTOR_FLOAT32_MAX_RISK", float("inf"))  # a rule that misjudges
    X = _smooth(400)
    y = np.sin(4 * X[:, 0])
    kw = dict(alpha=1e-9, kernel="rbf", gamma=0.5, solver="cholesky", block_size=150)
    kw["keep_gram"] = keep_gram  # in place, both Grams are computed on demand (same bits)
    exact = KernelRidge(**kw, store=str(tmp_path / "a")).fit(X, y)
    with caplog.at_level(logging.WARNING, logger="pipeline.fit"):
        auto = KernelRidge(**kw, store=str(tmp_path / "b"), factor_dtype="auto").fit(X, y)
    assert "factor_dtype='auto' chose failed" in caplog.text
    assert "NotPositiveDefiniteError" in auto.fit_info_["factor_dtype_fallback"]
    np.testing.assert_array_equal(auto.dual_coef_, exact.dual_coef_)  # the float64 fit
