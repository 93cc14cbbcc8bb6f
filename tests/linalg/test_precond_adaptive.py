"""Adaptive-rank RPCholesky Nyström preconditioner: stopping rule, memory cap, algebra."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.precond import (
    NystromPreconditioner,
    build_nystrom,
    make_preconditioner,
    residual_norm,
)
from pipeline.models.selection.route import DenseKernelOperator


def _adaptive(op, shift, **kw):
    nf = build_nystrom(op, centres="adaptive", shift=shift, **kw)
    return nf.F, nf.centres, nf.info


def _adaptive_pre(op, **kw):
    return build_nystrom(op, centres="adaptive", shift=op.shift, **kw).woodbury(op.shift)


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    n = 800
    X = rng.normal(size=(n, 4))
    K = RBF(gamma=0.3)(X)
    y = np.sin(X.sum(1)) + 0.1 * rng.normal(size=n)
    return K, y


def test_rank_grows_until_the_criterion_and_stops_there(problem):
    K, _ = problem
    mu = 1e-3
    op = DenseKernelOperator(K, mu)
    F, piv, info = _adaptive(op, mu, factor=5.0, block=100, sample=800)
    assert not info["capped"]
    assert info["rho_estimate"] <= 5.0 * mu
    hist = info["history"]
    assert all(r > 5.0 * mu for _, r in hist[:-1])  # it did not stop early
    assert hist[-1][0] == F.shape[1] == piv.size == info["rank"]
    assert F.dtype == np.float32
    # with the whole matrix as the subsample the estimate is the true norm
    true = float(np.linalg.eigvalsh(K - F.astype(float) @ F.astype(float).T)[-1])
    assert true == pytest.approx(info["rho_estimate"], rel=1e-2)
    assert residual_norm(op, F, iterations=30) == pytest.approx(true, rel=0.05)


def test_the_estimate_from_a_subsample_is_conservative_enough(problem):
    K, _ = problem
    mu = 1e-3
    op = DenseKernelOperator(K, mu)
    F, _, info = _adaptive(op, mu, factor=5.0, block=100, sample=250)
    true = float(np.linalg.eigvalsh(K - F.astype(float) @ F.astype(float).T)[-1])
    assert true <= 3 * 5.0 * mu  # within a factor 3 of the target


def test_memory_budget_caps_the_rank_with_a_log_line(problem, caplog):
    K, _ = problem
    n = K.shape[0]
    op = DenseKernelOperator(K, 1e-6)
    budget = n * 4 * 60  # room for rank 60 in float32
    with caplog.at_level(logging.WARNING, logger="pipeline.linalg.precond"):
        pre = _adaptive_pre(op, memory_budget=budget, block=50)
    assert pre.info["capped"] and pre.info["cap"] == 60
    assert pre.rank <= 60 and pre.nbytes <= budget
    assert any("capped at rank" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="memory_budget"):
        _adaptive(op, 1e-6, memory_budget=10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_applied_preconditioner_is_spd_and_matches_dense(problem, dtype):
    K, _ = problem
    mu = 1e-2
    op = DenseKernelOperator(K, mu)
    pre = _adaptive_pre(op, factor=2.0, dtype=dtype, block=100)
    F = np.asarray(pre.F, dtype=np.float64)
    Pinv = np.linalg.inv(F @ F.T + mu * np.eye(K.shape[0]))
    E = np.eye(K.shape[0])[:, :200]
    applied = pre.apply(E)
    assert np.allclose(applied, Pinv[:, :200], rtol=1e-6, atol=1e-6 * np.abs(Pinv).max())
    full = pre.apply(np.eye(K.shape[0]))
    assert np.allclose(full, full.T, atol=1e-9 * np.abs(full).max())
    assert np.linalg.eigvalsh(0.5 * (full + full.T))[0] > 0
    v = np.random.default_rng(3).normal(size=K.shape[0])
    assert np.allclose(pre.apply(v), full @ v)


def test_adaptive_beats_the_fixed_rank_default_at_small_shift(problem):
    K, y = problem
    mu = 1e-3
    op = DenseKernelOperator(K, mu)
    fixed = make_preconditioner("nystrom", op, rank=50)
    ada = _adaptive_pre(op, factor=5.0, block=100)
    assert isinstance(ada, NystromPreconditioner) and isinstance(fixed, NystromPreconditioner)
    it_fixed = conjugate_gradient(op.matvec, y, preconditioner=fixed, tol=1e-8, max_iter=3000)
    it_ada = conjugate_gradient(op.matvec, y, preconditioner=ada, tol=1e-8, max_iter=3000)
    assert it_ada.converged and it_fixed.converged
    assert it_ada.n_iter <= 15 and it_ada.n_iter * 3 <= it_fixed.n_iter
    assert ada.fingerprint != fixed.fingerprint


def test_make_preconditioner_knows_adaptive(problem):
    K, _ = problem
    pre = make_preconditioner("adaptive", DenseKernelOperator(K, 1e-2))
    assert isinstance(pre, NystromPreconditioner) and pre.F.dtype == np.float32
    # one fit's target (constants.ADAPTIVE_FIT_FACTOR), not the CV's
    assert pre.info["factor"] == 10.0 and pre.info["rho_estimate"] <= 10.0 * 1e-2


def test_a_build_stopped_by_its_rank_cap_says_so_without_a_warning(problem, caplog):
    """The rank cap is the plan's (it scales with N): stopping there is the designed
    trade-off, logged at INFO; only the memory budget's cap warns."""
    K, _ = problem
    op = DenseKernelOperator(K, 1e-6)
    with caplog.at_level(logging.INFO, logger="pipeline.linalg.precond"):
        pre = _adaptive_pre(op, max_rank=40, block=20)
    assert pre.info["capped"] and pre.rank <= 40
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert any(lv == logging.INFO and "stopped at its rank cap" in m for lv, m in msgs), msgs
    assert not any(lv >= logging.WARNING for lv, _ in msgs), msgs


def test_an_unnamed_rank_follows_the_plans_rule(monkeypatch):
    """``make_preconditioner("adaptive", op)`` without a rank caps the factor by the rule
    the plan records (constants.preconditioner_rank, with the memory available now)."""
    from pipeline import constants
    from pipeline.linalg import precond

    seen = {}
    real = precond.build_nystrom

    def spy(op, **kw):
        seen["max_rank"] = kw.get("max_rank")
        return real(op, **kw)

    monkeypatch.setattr(precond, "build_nystrom", spy)
    monkeypatch.setattr(precond, "available_memory", lambda: 4 * 300 * 37 * 4)  # 37 columns
    X = np.random.default_rng(0).standard_normal((300, 3))
    op = DenseKernelOperator(RBF(gamma=0.5)(X), 1e-6)
    precond.make_preconditioner("adaptive", op)
    assert seen["max_rank"] == constants.preconditioner_rank(
        "adaptive", None, 300, 4 * 300 * 37 * 4
    )
    assert seen["max_rank"] == 37  # a quarter of the memory, in float32
