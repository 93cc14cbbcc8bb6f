"""The one CG loop's per-column rules: a tolerance per column, a column-aware operator and
preconditioner (each column its own system), and failing columns frozen instead of raising.

These are what :func:`pipeline.models.selection.blockcg.block_pcg` needs; it used to run a
second copy of the CG iteration and is now one call of
:func:`pipeline.linalg.cg.conjugate_gradient`.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from pipeline.errors import CGDivergenceError, CGStagnationError
from pipeline.kernels import RBF
from pipeline.linalg.cg import conjugate_gradient
from pipeline.models.selection.blockcg import FoldNystromBlock, block_pcg


@pytest.fixture(scope="module")
def system():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 2))
    K = RBF(gamma=0.5)(X)
    B = rng.normal(size=(120, 3))
    return K, B


def _rel(A, x, b):
    return np.linalg.norm(b - A @ x) / np.linalg.norm(b)


def test_each_column_stops_at_its_own_tolerance(system):
    K, B = system
    A = K + 1e-2 * np.eye(len(K))
    tol = np.array([1e-2, 1e-6, 1e-10])
    res = conjugate_gradient(lambda V: A @ V, B, tol=tol, true_residual_every=0)
    assert res.converged and res.column_reason == [None, None, None]
    for j in range(3):
        assert _rel(A, res.x[:, j], B[:, j]) <= tol[j]
    # the loose column left the product long before the tight one: its residual froze
    stop = [int(np.argmax(res.history[:, j] <= tol[j])) for j in range(3)]
    assert stop[0] < stop[1] < stop[2] == res.n_iter
    assert np.all(res.history[stop[0] :, 0] == res.history[stop[0], 0])
    assert _rel(A, res.x[:, 0], B[:, 0]) > 1e-6  # not solved further than asked


def test_column_operator_solves_one_shifted_system_per_column(system):
    K, B = system
    shifts = np.array([1e-1, 1e-2, 1e-3])
    seen = []

    def matvec(V, cols):
        return K @ V + V * shifts[cols]

    class Jacobi:
        def apply(self, R, cols):
            seen.append(np.array(cols))
            return R / (np.diag(K)[:, None] + shifts[cols])

    res = conjugate_gradient(
        matvec, B, preconditioner=Jacobi(), tol=1e-10, column_operator=True, max_iter=2000
    )
    assert res.converged
    for j, s in enumerate(shifts):
        ref = scipy.linalg.solve(K + s * np.eye(len(K)), B[:, j], assume_a="pos")
        np.testing.assert_allclose(res.x[:, j], ref, rtol=1e-7, atol=1e-9)
    # the best-conditioned column converged first and left the preconditioner's block
    assert seen[0].tolist() == [0, 1, 2] and seen[-1].tolist() == [2]


def test_a_nan_column_is_frozen_and_zeroed_and_the_others_converge(system):
    K, B = system
    A = K + 1e-2 * np.eye(len(K))
    calls = {"n": 0}

    def matvec(V):
        calls["n"] += 1
        out = A @ V
        if calls["n"] == 3:
            out[:, 1] = np.nan
        return out

    res = conjugate_gradient(matvec, B, tol=1e-10, column_failures="freeze", warn=False)
    assert res.column_reason == [None, "nonfinite", None] and not res.converged
    assert np.all(res.x[:, 1] == 0.0)
    for j in (0, 2):
        assert _rel(A, res.x[:, j], B[:, j]) <= 1e-9
    calls["n"] = 0
    with pytest.raises(CGDivergenceError, match="the operator product returned NaN"):
        conjugate_gradient(matvec, B, tol=1e-10)


def test_a_stagnating_column_is_frozen_with_its_reason(system):
    K, B = system
    A = K + 1e-9 * np.eye(len(K))  # kappa ~ 1e11: no 1% progress over 2 iterations soon
    kw = dict(tol=1e-12, stagnation_window=2, max_iter=2000)
    res = conjugate_gradient(lambda V: A @ V, B, column_failures="freeze", warn=False, **kw)
    assert "stagnation" in res.column_reason
    assert all(r in (None, "stagnation") for r in res.column_reason)
    with pytest.raises(CGStagnationError, match="CG stagnated"):
        conjugate_gradient(lambda V: A @ V, B, **kw)


def test_block_pcg_is_the_one_loop_on_its_fold_systems(system):
    """block_pcg is conjugate_gradient with its column systems: the same bits."""
    K, B = system
    n = len(K)
    trains = [np.arange(0, 80), np.arange(40, 120)]
    masks = np.zeros((2, n), dtype=bool)
    for f, tr in enumerate(trains):
        masks[f, tr] = True
    folds = np.array([0, 1, 1])
    shifts = np.array([1e-1, 1e-2, 1e-3])
    Bp = B * masks[folds].T
    F = np.linalg.cholesky(K + 1e-8 * np.eye(n))[:, :15]
    pre = FoldNystromBlock(F, trains)
    res = block_pcg(lambda V: K @ V, Bp, shifts, folds, masks, pre, tol=1e-10, max_iter=500)
    assert res.reason == [None, None, None]
    for j, f in enumerate(folds):
        tr = trains[f]
        ref = scipy.linalg.solve(K[np.ix_(tr, tr)] + shifts[j] * np.eye(len(tr)), Bp[tr, j])
        np.testing.assert_allclose(res.x[tr, j], ref, rtol=1e-7, atol=1e-8)
        assert np.all(res.x[np.setdiff1d(np.arange(n), tr), j] == 0.0)
    Mc = masks[folds].T.astype(np.float64)
    one = conjugate_gradient(
        lambda V, c: K @ V * Mc[:, c] + V * shifts[c],
        Bp,
        preconditioner=type("P", (), {"apply": lambda s, R, c: pre.apply(R, folds[c], shifts[c], Mc[:, c])})(),
        tol=1e-10, max_iter=500, true_residual_every=0, confirm=False, column_operator=True,
        column_failures="freeze", start_dots="active",
    )  # fmt: skip
    np.testing.assert_array_equal(one.x, res.x)
    assert one.n_iter == res.n_iter and one.n_matvec == res.n_products


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(tol=np.array([1e-6, 1e-6])), "one per column"),
        (dict(tol=np.array([1e-6, 1.0, 1e-6])), "tol must lie in"),
        (dict(column_failures="skip"), "column_failures must be"),
        (dict(start_dots="some"), "start_dots must be"),
    ],
)
def test_bad_column_options_are_refused_before_any_product(system, kw, match):
    K, B = system
    calls = []
    with pytest.raises(ValueError, match=match):
        conjugate_gradient(lambda V: calls.append(1) or K @ V, B, **kw)
    assert not calls
