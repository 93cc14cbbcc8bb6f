"""KernelRidgeCV's routing past the memory wall prices the block CG as the search runs it
by default (adaptive factor, screening) and the Cholesky route per λ with its residual
panels (issue #45, item 5): pure functions, no data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline import constants as C
from pipeline.options import CvOptions
from pipeline.plan.calibrated import SimpleCostModel
from pipeline.plan.cv_routing import (
    cg_passes,
    cg_rank,
    choose_cv_solver,
    precond_rank_cap,
    predicted_search_seconds,
    rank_cap,
)

N = 35_000


def _kfold(n, k=5):
    idx = np.arange(n)
    return [(np.setdiff1d(idx, te), te) for te in np.array_split(idx, k)]


def _cg_options(opts=None):
    """The search's options as choice.cg_pricing hands them to the cost model."""
    opts = CvOptions() if opts is None else opts
    return dict(
        preconditioner=opts.preconditioner, rank=opts.rank, tol=opts.tol,
        screen_tol=opts.screen_tol, screen_centers=opts.screen_centers,
        screen_top=opts.screen_top,
    )  # fmt: skip


OUT_OF_CORE = dict(fits=lambda b: False, band_ok=True, has_store=True)


def test_defaults_route_the_35k_grid_to_the_block_cg_within_five_exact_fits():
    """10 λ x 3 γ x 5 folds at N = 35,000 with a store: auto picks cg, predicted at most
    5x one exact fit (the issue's target), and at least 10x cheaper than the Cholesky
    route, one factorisation and its panels per λ per setting."""
    splits = _kfold(N)
    assert choose_cv_solver(N, "complement", 10, splits, **OUT_OF_CORE) == "cg"
    assert choose_cv_solver(N, "complement", 10, splits, **OUT_OF_CORE, **_cg_options()) == "cg"
    cg = predicted_search_seconds("cg", N, 10, 3, splits, **_cg_options())
    chol = predicted_search_seconds("cholesky", N, 10, 3, splits, **_cg_options())
    one_fit = SimpleCostModel().cholesky_seconds(N, 1) + N * N / C.KERNEL_ENTRIES_PER_SECOND / 2
    assert cg == predicted_search_seconds("cg", N, 10, 3, splits)  # the defaults are these
    assert cg <= 5 * one_fit, (cg, one_fit)
    assert chol >= 10 * cg, (chol, cg)
    # the Cholesky route: 10 λ x 3 settings factorisations, each with its L⁻¹ panels
    factor = SimpleCostModel().cholesky_seconds(N, 1)
    assert chol == pytest.approx(30 * factor * (1 + C.CV_PANELS_PER_FACTORISATION), rel=1e-3)


def test_the_old_defaults_are_priced_as_they_ran():
    """A fixed-rank Nyström factor without screening (the defaults before issue #45, which
    took more than 20 exact fits on the hidden data) is priced above 20 exact fits at
    35,000 rows; each of the two new defaults lowers the price."""
    splits = _kfold(N)
    old = _cg_options(CvOptions(preconditioner="nystrom", screen_tol=None, screen_centers=None))
    one_fit = SimpleCostModel().cholesky_seconds(N, 1) + N * N / C.KERNEL_ENTRIES_PER_SECOND / 2
    assert predicted_search_seconds("cg", N, 10, 3, splits, **old) > 20 * one_fit
    price = {
        (pre, scr): predicted_search_seconds(
            "cg", N, 10, 3, splits, preconditioner=pre, screen_tol=scr, screen_centers=None
        )
        for pre in ("nystrom", "adaptive")
        for scr in (None, 1e-3)
    }
    assert price["nystrom", None] > price["nystrom", 1e-3] > price["adaptive", 1e-3]
    assert price["nystrom", None] > price["adaptive", None] > price["adaptive", 1e-3]
    # screening runs only above tol (cvblock's rule): screen_tol <= tol is no screening
    assert (
        predicted_search_seconds("cg", N, 10, 3, splits, tol=1e-3, screen_centers=None)
        == price["adaptive", None]
    )
    # the Nyström screen (the default) lowers it again
    assert predicted_search_seconds("cg", N, 10, 3, splits) < price["adaptive", 1e-3]
    # no preconditioner: the plain-CG price, the most any fixed rank is charged
    none = predicted_search_seconds(
        "cg", N, 10, 3, splits, preconditioner="none", screen_centers=None
    )
    assert none > price["nystrom", 1e-3]
    assert cg_passes(N, 5, "nystrom", rank=1) == cg_passes(N, 5, "none")


def test_pass_counts_follow_the_measured_factors():
    n, nf = 3000, 5
    base = cg_passes(n, nf)
    assert base == C.CV_BLOCK_PASSES
    assert cg_passes(n, nf, screened=False) == pytest.approx(base * C.CV_UNSCREENED_PASS_FACTOR)
    ratio = cg_rank(n, nf, "adaptive") / cg_rank(n, nf, "nystrom")
    assert cg_passes(n, nf, "nystrom") == pytest.approx(base * ratio**C.CV_FIXED_RANK_PASS_EXPONENT)
    # a fixed rank at or above the adaptive cap is priced as the adaptive factor
    assert cg_passes(n, nf, "nystrom", rank=10**6) == base


def test_the_cg_rank_is_the_one_the_block_pcg_builds():
    """cvblock builds the ranks priced here (one definition: it asks cg_rank, and
    restates no cap of its own)."""
    from pipeline.models.selection import cvblock

    assert cvblock.cg_rank is cg_rank
    assert not hasattr(cvblock, "rank_cap") and not hasattr(cvblock, "precond_rank_cap")
    cap = min(rank_cap(N), precond_rank_cap(N, 5))
    assert rank_cap(N) == int(C.CV_RANK_SCALE * N ** (2 / 3)) and rank_cap(100) == 100
    assert 4 * N * cap + 8 * 5 * cap**2 <= C.CV_PRECOND_BUDGET
    assert cg_rank(N, 5) == cap
    assert cg_rank(N, 5, "adaptive", rank=500) == 500  # rank= caps the adaptive rank
    assert cg_rank(N, 5, "nystrom") == C.CV_DEFAULT_RANK
    assert cg_rank(N, 5, "nystrom", rank=10**6) == cap
    assert cg_rank(N, 5, "none") == 0


def test_the_cholesky_route_is_priced_per_lambda_per_setting_per_shift():
    splits = _kfold(N)
    one = predicted_search_seconds("cholesky", N, 1, 1, splits)
    ten = predicted_search_seconds("cholesky", N, 10, 1, splits)
    assert predicted_search_seconds("cholesky", N, 10, 3, splits) == pytest.approx(3 * ten)
    factor = SimpleCostModel().cholesky_seconds(N, 1)  # the Gram is built once a setting
    assert ten - one == pytest.approx(9 * factor * (1 + C.CV_PANELS_PER_FACTORISATION))
    # the "n_samples" convention shifts by λ times the training rows: one factor per
    # distinct training-set size (5 folds of 35,001 rows: two sizes)
    uneven = _kfold(N + 1)
    assert len({len(tr) for tr, _ in uneven}) == 2
    sk = predicted_search_seconds("cholesky", N + 1, 10, 1, uneven)
    ns = predicted_search_seconds("cholesky", N + 1, 10, 1, uneven, convention="n_samples")
    assert ns > 1.9 * sk
    assert predicted_search_seconds("cholesky", N, 10, 1, splits, convention="n") == (
        predicted_search_seconds("cholesky", N, 10, 1, splits)
    )  # equal folds: one shift per λ


def test_leave_one_out_keeps_the_factor_route():
    splits = _kfold(N)
    assert choose_cv_solver(N, "loo", 10, splits, **OUT_OF_CORE) == "cholesky"
    # without a store the search cannot factor out of core: the block CG
    no_store = {**OUT_OF_CORE, "has_store": False}
    assert choose_cv_solver(N, "complement", 10, splits, **no_store) == "cg"


def test_the_default_options_are_the_cost_models_defaults():
    """predicted_search_seconds' keyword defaults are CvOptions' (one set of defaults)."""
    import inspect

    sig = inspect.signature(predicted_search_seconds).parameters
    d = CvOptions()
    for name in ("preconditioner", "rank", "tol", "screen_tol", "screen_centers", "screen_top"):
        assert sig[name].default == getattr(d, name), name
    assert dataclasses.replace(d).screen_tol == C.CV_SCREEN_TOL
