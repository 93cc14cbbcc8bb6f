"""The one Nyström builder (:func:`pipeline.linalg.precond.build_nystrom`) and its
applies of ``(F Fᵀ + μ I)⁻¹``, for one operator and per fold, against dense inverses.

Issue #43 gathered four builders and three Woodbury applies (the fixed-rank and
adaptive preconditioners, the block CV's fold preconditioner, the CV path's per-fold
one) into :mod:`pipeline.linalg.precond`; issue #45's FALKON solver builds on it.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.dense_operator import DenseKernelOperator
from pipeline.linalg.precond import (
    CENTRES,
    FoldNystrom,
    FoldNystromBlock,
    NystromFactor,
    adaptive_rpcholesky,
    build_nystrom,
    rpcholesky,
    uniform_nystrom,
)


@pytest.fixture(scope="module")
def op():
    X = np.random.default_rng(3).standard_normal((300, 4))
    return DenseKernelOperator(RBF(gamma=0.2)(X), 1e-2)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("centres", CENTRES)
def test_builder_gives_the_factor_of_the_named_method(op, centres):
    nf = build_nystrom(op, centres=centres, rank=40, shift=1e-2, random_state=5)
    assert isinstance(nf, NystromFactor) and nf.rank == nf.F.shape[1] == nf.centres.size
    if centres == "uniform":
        F, piv = uniform_nystrom(op, 40, random_state=5)
    elif centres == "rpcholesky":
        F, piv = rpcholesky(op, 40, random_state=5)
    else:
        F, piv, _ = adaptive_rpcholesky(op, 1e-2, random_state=5)
        assert nf.info["method"] == "rpcholesky-adaptive"
    np.testing.assert_array_equal(nf.F, F)
    np.testing.assert_array_equal(nf.centres, piv)


@pytest.mark.parametrize("centres", ["uniform", "rpcholesky"])
def test_woodbury_and_folds_apply_the_dense_inverse(op, centres):
    nf = build_nystrom(op, centres=centres, rank=30, random_state=1)
    F = np.asarray(nf.F, dtype=np.float64)
    R = np.random.default_rng(0).standard_normal((op.n, 3))
    mu = 0.05
    want = np.linalg.solve(F @ F.T + mu * np.eye(op.n), R)
    assert _rel(nf.woodbury(mu).apply(R), want) < 1e-9
    trains = [np.arange(0, 200), np.arange(100, 300)]
    pre = nf.folds(trains)
    assert isinstance(pre, FoldNystromBlock) and pre.rank == nf.rank
    for f, tr in enumerate(trains):
        s = 10.0 ** -(f + 1)
        Rp = np.zeros_like(R)
        Rp[tr] = R[tr]
        mask = np.zeros((op.n, 3))
        mask[tr] = 1.0
        got = pre.apply(Rp, np.full(3, f), np.full(3, s), mask)
        Ft = F[tr]
        want_t = np.linalg.solve(Ft @ Ft.T + s * np.eye(len(tr)), R[tr])
        assert _rel(got[tr], want_t) < 1e-9
        assert _rel(FoldNystrom(Ft).apply(R[tr], s), want_t) < 1e-9


def test_builder_refuses_bad_requests_before_any_work(op):
    with pytest.raises(ValueError, match="unknown Nyström centres 'greedy'"):
        build_nystrom(op, centres="greedy", rank=10)
    with pytest.raises(ValueError, match="needs shift="):
        build_nystrom(op, centres="adaptive")
    with pytest.raises(ValueError, match="needs rank="):
        build_nystrom(op, centres="uniform")
