"""The one Nyström builder (:func:`pipeline.linalg.precond.build_nystrom`) and its
applies of ``(F Fᵀ + μ I)⁻¹``, for one operator and per fold, against dense inverses.

Issue #43 gathered four builders and three Woodbury applies (the fixed-rank and
adaptive preconditioners, the block CV's fold preconditioner, the CV path's per-fold
one) into :mod:`pipeline.linalg.precond`, then made the two fold forms one
(``FoldNystromBlock``) and the two pivoted Cholesky routines one; issue #45's FALKON
solver builds on it. Issue #43 item 2 left one builder (``build_nystrom``, the fixed-rank
and adaptive RPCholesky and the uniform centres private behind it) and one apply for one
operator (``NystromPreconditioner``, the Cholesky-form Woodbury; the eigen form retired).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg import precond
from pipeline.linalg.dense_operator import DenseKernelOperator
from pipeline.linalg.precond import (
    CENTRES,
    FoldNystromBlock,
    NystromFactor,
    NystromPreconditioner,
    build_nystrom,
    make_preconditioner,
)


@pytest.fixture(scope="module")
def op():
    X = np.random.default_rng(3).standard_normal((300, 4))
    return DenseKernelOperator(RBF(gamma=0.2)(X), 1e-2)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("centres", CENTRES)
def test_builder_gives_a_nystrom_factor_of_the_named_method(op, centres):
    nf = build_nystrom(op, centres=centres, rank=40, shift=1e-2, random_state=5)
    assert isinstance(nf, NystromFactor) and nf.rank == nf.F.shape[1] == nf.centres.size
    assert nf.info["method"] == {"adaptive": "rpcholesky-adaptive"}.get(centres, centres)
    assert nf.info["random_state"] == 5
    # float64 for the fixed rank, float32 (half the memory) for the adaptive build
    assert nf.F.dtype == (np.float32 if centres == "adaptive" else np.float64)
    if centres != "adaptive":
        assert nf.rank == 40 and nf.info["requested_rank"] == 40
    # a Nystrom factor reproduces K on its centres' columns (to the storage precision)
    F = np.asarray(nf.F, dtype=np.float64)
    piv = nf.centres
    tol = 1e-5 if centres == "adaptive" else 1e-9
    np.testing.assert_allclose(F @ F[piv].T, op.K[:, piv], atol=tol)
    # the same seed gives the same factor, bit for bit
    again = build_nystrom(op, centres=centres, rank=40, shift=1e-2, random_state=5)
    np.testing.assert_array_equal(again.F, nf.F)
    np.testing.assert_array_equal(again.centres, nf.centres)


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


def test_builder_refuses_bad_requests_before_any_work(op):
    with pytest.raises(ValueError, match="unknown Nyström centres 'greedy'"):
        build_nystrom(op, centres="greedy", rank=10)
    with pytest.raises(ValueError, match="needs shift="):
        build_nystrom(op, centres="adaptive")
    with pytest.raises(ValueError, match="needs rank="):
        build_nystrom(op, centres="uniform")


def test_adaptive_rpcholesky_is_the_fixed_rank_routine_with_a_stopping_rule(op):
    # one pivoted Cholesky (issue #43): the adaptive build draws its residual subsample
    # first, then runs the same rounds as the fixed-rank one from the same generator
    # state; held to the same rank (a target it cannot reach, float64 storage) the two
    # give the same factor and pivots, bit for bit
    ada = build_nystrom(
        op, centres="adaptive", shift=1e-12, max_rank=48, block=16, sample=100,
        dtype=np.float64, random_state=7,
    )  # fmt: skip
    F_a, piv_a, info = ada.F, ada.centres, ada.info
    assert info["capped"] and info["rank"] == 48
    rng = np.random.default_rng(7)
    rng.choice(op.n, size=100, replace=False)  # the subsample S of the rho estimate
    fixed = build_nystrom(op, centres="rpcholesky", rank=48, block=16, random_state=rng)
    F_r, piv_r = fixed.F, fixed.centres
    assert fixed.info["random_state"] is None  # a Generator is not a seed to record
    np.testing.assert_array_equal(piv_a, piv_r)
    np.testing.assert_array_equal(F_a, F_r)
    # and the factor is a Nystrom factor of K: F F^T matches K on its pivots
    K = op.K
    np.testing.assert_allclose(F_r[piv_r] @ F_r[piv_r].T, K[np.ix_(piv_r, piv_r)], atol=1e-10)


def test_one_builder_one_apply_one_fold_form():
    # issue #43 item 2: the module offers one way to build a factor and one apply per
    # use; the retired entry points and forms are gone, not aliased
    for gone in (
        "Float32NystromPreconditioner",
        "adaptive_nystrom_preconditioner",
        "adaptive_rpcholesky",
        "nystrom_factor",
        "rpcholesky",
        "uniform_nystrom",
    ):
        assert not hasattr(precond, gone), gone
    assert {n for n in precond.__all__ if "ystrom" in n} == {
        "FoldNystromBlock",
        "NystromFactor",
        "NystromPreconditioner",
        "build_nystrom",
        "nystrom_fingerprint",
    }


@pytest.mark.parametrize("name", ["nystrom", "adaptive"])
def test_make_preconditioner_is_the_builder_and_the_one_apply(op, name, monkeypatch):
    calls = []
    real = precond.build_nystrom

    def spy(o, **kw):
        calls.append(kw["centres"])
        return real(o, **kw)

    monkeypatch.setattr(precond, "build_nystrom", spy)
    pre = make_preconditioner(name, op, rank=30)
    assert calls == [{"nystrom": "rpcholesky", "adaptive": "adaptive"}[name]]
    assert type(pre) is NystromPreconditioner
    # it applies the dense (F Fᵀ + μ I)⁻¹ of its stored factor
    F = np.asarray(pre.F, dtype=np.float64)
    R = np.random.default_rng(1).standard_normal((op.n, 2))
    want = np.linalg.solve(F @ F.T + op.shift * np.eye(op.n), R)
    assert _rel(pre.apply(R), want) < 1e-9


def test_the_fingerprint_names_the_apply_form(op):
    # the deliberate bump of issue #43 item 2: a CG checkpoint keyed on an eigen-form
    # preconditioner is never resumed with the Cholesky form
    pre = make_preconditioner("nystrom", op, rank=20)
    fp = precond.nystrom_fingerprint(pre.shift, pre.rank, pre.summary, pre.info)
    assert pre.fingerprint == fp
    assert precond.NYSTROM_FORM == "woodbury-cholesky"
    # the pivots, the adaptive history and the timing are not part of it
    info = {**pre.info, "pivots": [1, 2], "history": [(1, 2.0)], "seconds": 9.0}
    assert precond.nystrom_fingerprint(pre.shift, pre.rank, pre.summary, info) == fp
    other = {**pre.info, "random_state": 1}
    assert precond.nystrom_fingerprint(pre.shift, pre.rank, pre.summary, other) != fp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_woodbury_apply_on_a_device_backend_is_the_host_apply(dtype):
    # the array API's reference namespace stands for a GPU here (CuPy: test_device_gpu.py)
    pytest.importorskip("array_api_strict")
    from pipeline.engine.backend import get_backend
    from pipeline.linalg.precond import NystromPreconditioner

    rng = np.random.default_rng(0)
    F = rng.standard_normal((20_000, 30)).astype(dtype)  # > one row step of F: 3 blocks
    R = rng.standard_normal((20_000, 2))
    host = NystromPreconditioner(F, 0.1)
    dev = NystromPreconditioner(F, 0.1, backend=get_backend("array_api_strict"))
    np.testing.assert_allclose(dev.apply(R), host.apply(R), rtol=1e-12, atol=1e-12)
    assert dev.apply(R[:, 0]).shape == (20_000,)
    assert dev.fingerprint == host.fingerprint
