"""λ for the full N: a search on a subsample, then a refinement of λ on all the rows.

A grid search at large N runs on a seeded uniform subsample of the training rows
(``KernelRidgeCV(subsample=ROWS)``, ``cv.subsample`` in a run config). The λ it
chooses is biased upward: the best λ shrinks as N grows. The refinement
(``refine=True``, on by default when a subsample was drawn) keeps the chosen kernel
(γ etc. fixed) and scores the λ of :data:`REFINE_FACTORS` times the subsample's
choice (1/16 to 4: mostly below it), on the FULL training set:

- up to :data:`REFINE_EIGEN_MAX_N` rows (``loo-eigen``), by the exact leave-one-out
  residuals of every λ from ONE eigendecomposition ``K = Q Λ Qᵀ``
  (:func:`pipeline.models.selection.eigen.loo_predictions`: ``O(N²)`` per λ once
  ``Q`` exists), scored on the pooled held-out predictions. An eigendecomposition
  costs 10-15 Cholesky factorisations of K (measured: 14x the in-memory refit at
  3,000 rows), so this is the path only where that is a few seconds;
- up to :data:`REFINE_IN_MEMORY_MAX_N` rows while K fits in memory
  (``holdout-dense``): one held-out split of all rows (the fraction ``1/folds`` of
  the search, seeded), one kernel matrix, ONE Cholesky of the training block at the
  subsample's λ (``(1 - 1/folds)³`` = 0.51 of one exact fit's factorisation at 5
  folds), and the smaller λ by CG preconditioned with that factor, all λ as the
  columns of one block (:func:`_holdout_shifted`: a condition number of at most 16,
  ~46 iterations of ``O(n²)`` at 3,000 and 8,000 rows), in one n_train x n_train
  array (its cost against the refit: docs/CV_AT_SCALE.md);
- above it (``holdout-cg``), the search's own block CG
  (:mod:`pipeline.models.selection.cvblock`) on the full operator with the same
  held-out split: the seven λ systems are the columns of one preconditioned block
  solve, so each iteration is one matrix-free pass over K for all of them (one
  Nyström preconditioner, shifted per λ), every λ to ``tol`` (no screening).

The first and the last are a :class:`~pipeline.models.selection.KernelRidgeCV` of the
one setting on all rows (no subsample, no refinement, no refit). The λ kept is the
best-scoring one, the subsample's own on a tie; its seconds are recorded, and the ratio
to one exact fit (the refit's seconds) where the search refits.
"""

from __future__ import annotations

import logging
import time
from numbers import Integral, Real
from typing import Any

import numpy as np
from scipy import linalg
from sklearn.base import clone
from sklearn.metrics import check_scoring
from sklearn.model_selection import BaseCrossValidator, LeaveOneOut

from pipeline.engine.dense import kernel_matrix
from pipeline.linalg.cg import conjugate_gradient
from pipeline.linalg.dense_dual import cho_factor
from pipeline.linalg.dense_memory import check_dense_memory
from pipeline.models.selection.grid import make_splits
from pipeline.models.selection.guard import FixedPredictions
from pipeline.models.selection.scoring import target_exponent
from pipeline.validation import check_random_seed

__all__ = [
    "REFINE_EIGEN_MAX_N",
    "REFINE_FACTORS",
    "REFINE_IN_MEMORY_MAX_N",
    "check_subsample",
    "draw_subsample",
    "min_subsample",
    "refine_alpha",
    "refine_wanted",
]

log = logging.getLogger("pipeline.models.selection")

#: the λ scored at the full N, as multiples of the subsample's choice: mostly down (the
#: best λ of the n_samples convention shrinks as N grows), four steps to 1/16, and two
#: up (on kin40k's first 4,000 rows, RBF γ = 0.25, the test RMSE was best at 2x the
#: grid's 3.2e-3 under the sklearn convention, and the held-out split chose 2x too);
#: the in-memory path factors once at the subsample's λ, so a λ more costs a column of
#: CG
REFINE_FACTORS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0)
#: up to this many rows the refinement is exact LOO from one eigendecomposition
#: (it costs 14x the refit at 3,000 rows: docs/CV_AT_SCALE.md); above it, a
#: held-out split (one Cholesky and preconditioned CG in memory, else block CG)
REFINE_EIGEN_MAX_N = 1_000
#: up to this many rows (and while the training block's K fits in memory: one
#: n_train x n_train array, 6.6 GB for kin40k's 36,000 rows at 4/5) the held-out split
#: is solved in memory, one Cholesky and preconditioned CG; above it by block CG
REFINE_IN_MEMORY_MAX_N = 40_000


def min_subsample(cv: Any) -> int:
    """The fewest rows a subsample may have for the splits ``cv``: two per fold (K-fold
    and splitters that say their number of splits), else 4."""
    if isinstance(cv, Integral) and not isinstance(cv, bool):
        return 2 * max(int(cv), 2)
    get = getattr(cv, "get_n_splits", None)
    if get is not None and not isinstance(cv, LeaveOneOut):
        try:
            return 2 * max(int(get()), 2)
        except (TypeError, ValueError):  # needs X or groups to say
            pass
    return 4


def check_subsample(subsample: Any, cv: Any, name: str = "subsample", cv_name: str = "cv") -> None:
    """ValueError naming ``subsample`` unless it is None or an integer of at least
    :func:`min_subsample` rows (``name``, ``cv_name``: how the caller spells them)."""
    if subsample is None:
        return
    least = min_subsample(cv)
    if isinstance(subsample, bool) or not isinstance(subsample, Integral) or int(subsample) < least:
        raise ValueError(
            f"{name}={subsample!r} is not valid: give the number of training rows the grid "
            f"search runs on, an integer >= {least} (two per fold of {cv_name}={cv!r}), e.g. "
            f"{name}=8000, or null for all rows"
        )
    if (
        cv is not None
        and not isinstance(cv, str | Real | BaseCrossValidator)
        and not hasattr(cv, "split")
    ):
        raise ValueError(
            f"{name}={subsample!r} needs splits that can be cut on the subsample (folds, a "
            f"held-out fraction, 'loo' or a splitter); {cv_name}={cv!r} lists row indices "
            "of all rows"
        )


def draw_subsample(n: int, rows: int, random_state: Any) -> np.ndarray:
    """``rows`` distinct row indices of ``range(n)``, uniform and seeded, sorted.

    ``random_state``: an int (or None: 0, so that a search is repeatable), or a
    ``RandomState`` (a seed is drawn from it)."""
    seed = check_random_seed(random_state)
    rng = np.random.default_rng(0 if seed is None else seed)
    return np.sort(rng.choice(n, size=int(rows), replace=False))


def refine_wanted(refine: Any, subsampled: bool) -> bool:
    """Whether to refine: as asked, else (None: auto) when a subsample was drawn."""
    return subsampled if refine is None else bool(refine)


def _holdout_fraction(cv: Any) -> float:
    """The held-out fraction of the refinement's one split: ``1/folds`` of the search's
    K-fold (its own fraction for a held-out ``cv``), else 1/5."""
    if isinstance(cv, Real) and not isinstance(cv, bool | Integral) and 0 < cv < 1:
        return float(cv)
    k = 5
    if isinstance(cv, Integral) and not isinstance(cv, bool):
        k = int(cv)
    elif isinstance(cv, BaseCrossValidator) and not isinstance(cv, LeaveOneOut):
        try:
            k = int(cv.get_n_splits())
        except (TypeError, ValueError):  # needs X or groups to say
            pass
    return 1.0 / max(k, 2)


#: the shifted solves of the in-memory held-out path: relative residual and iteration cap
#: (a column that does not get there is solved by its own Cholesky)
_PCG_TOL = 1e-10
_PCG_MAX_ITER = 200
#: rows of a block of the products by K in the in-memory held-out path
_PRODUCT_BLOCK = 2048


class _LowerProduct:
    """``K @ P`` from the strict lower triangle of ``K`` (C order) and its diagonal,
    by blocks: GEMMs on the off-diagonal blocks and their transposes (views, no copy),
    the diagonal blocks made symmetric once (``n x block`` floats)."""

    def __init__(self, K: np.ndarray, diag: np.ndarray, block: int | None = None) -> None:
        n, block = K.shape[0], block or _PRODUCT_BLOCK
        self.K = K
        self.edges = [*range(0, n, block), n]
        self.diag_blocks = []
        for a, b in zip(self.edges[:-1], self.edges[1:]):
            D = np.tril(K[a:b, a:b], -1)
            D += D.T
            D[np.diag_indices_from(D)] = diag[a:b]
            self.diag_blocks.append(D)

    def __call__(self, P: np.ndarray) -> np.ndarray:
        out = np.empty_like(P)
        e = self.edges
        for i, D in enumerate(self.diag_blocks):  # a fixed order: reproducible sums
            out[e[i] : e[i + 1]] = D @ P[e[i] : e[i + 1]]
        for i in range(len(e) - 1):
            for j in range(i + 1, len(e) - 1):
                B = self.K[e[j] : e[j + 1], e[i] : e[i + 1]]
                out[e[i] : e[i + 1]] += B.T @ P[e[j] : e[j + 1]]
                out[e[j] : e[j + 1]] += B @ P[e[i] : e[i + 1]]
        return out


def _holdout_shifted(
    search: Any, X: np.ndarray, y: np.ndarray, kern: Any, alphas: list[float], a0: float,
    held: float, seed: int, info: dict[str, Any],
) -> list[float]:  # fmt: skip
    """Scores of every λ on one seeded held-out split (``held`` of the rows), in memory.

    ONE Cholesky factor of the training block at the shift ``s0`` of ``a0`` (the
    subsample's λ); every other shift ``s`` is solved by CG preconditioned with that
    factor, all λ as the columns of one block. The preconditioned matrix ``(K + s0 I)⁻¹
    (K + s I)`` has its eigenvalues between 1 and ``s / s0``: a condition number of at
    most 16 for λ/16 and 4 for 4λ, so a few dozen iterations of ``O(n²)`` reach 1e-10
    where a factorisation per λ costs ``O(n³)``. One n_train x n_train array: the factor
    is computed in place in its upper triangle (:func:`~pipeline.linalg.dense_dual.cho_factor`
    on the Fortran view: the package's one in-memory Cholesky, which never meets
    OpenBLAS' multi-threaded potrf crash at this order), K stays in the strict lower one
    and its diagonal beside it, and the products by K are GEMMs on that triangle's blocks
    (:class:`_LowerProduct`). A column that misses 1e-10 is
    solved by its own Cholesky (never scored rough). Raises :class:`MemoryError` before
    any work where it does not fit.
    """
    n = X.shape[0]
    splits, _ = make_splits(held, X, y, seed)
    tr, te = splits[0]
    nt, m = len(tr), len(alphas)
    t = 1 if y.ndim == 1 else y.shape[1]
    check_dense_memory(
        8 * (nt * nt + 8 * nt * m * t), what=f"the lambda refinement on {nt} training rows"
    )
    k, back = target_exponent(y, search.scoring)
    ys = np.ldexp(y, k) if np.any(k) else y
    y2 = ys.reshape(n, -1)
    Xf = np.asarray(X, dtype=np.float64)
    shifts = np.array([search._shift(a, nt) for a in alphas])
    s0 = float(search._shift(a0, nt))  # the subsample's λ: factored, the rest by PCG
    K = np.asarray(kernel_matrix(kern, Xf[tr]), dtype=np.float64)
    kdiag = K.diagonal().copy()
    K[np.diag_indices_from(K)] += s0
    try:  # in place on the Fortran view of the symmetric K + s0 I
        c = cho_factor(K, overwrite_a=True)
    except linalg.LinAlgError:
        raise ValueError(
            f"the lambda refinement: K + {s0:g} I of the held-out split's training rows is "
            "not positive definite; use a positive definite kernel, or refine=False"
        ) from None
    # the factor is in K's upper triangle, in place; K's strict lower triangle is still
    # K: the products by K are GEMMs on its blocks (SYMM on the triangle measured 4-5x
    # slower than GEMM for a few columns)
    k_times = _LowerProduct(K, kdiag)

    Yt = np.tile(y2[tr], (1, m))  # columns: λ major, targets minor
    sc = np.repeat(shifts, t)[None, :]
    Xs = linalg.cho_solve(c, Yt, check_finite=False)  # exact at s0: a warm start

    class _Factor:  # M⁻¹ = (K + s0 I)⁻¹ for every column
        def __init__(self, factor: tuple[np.ndarray, bool]) -> None:
            self.factor = factor

        def apply(self, R: np.ndarray, cols: np.ndarray) -> np.ndarray:
            return linalg.cho_solve(self.factor, R, check_finite=False)

    # the package's one CG loop, every λ a column of one block (the s0 columns start at
    # the goal already); no true-residual checks: a column that misses 1e-10 is redone
    res = conjugate_gradient(
        lambda V, cols, kv=k_times: kv(V) + V * sc[0, cols],
        Yt,
        x0=Xs,
        preconditioner=_Factor(c),
        tol=_PCG_TOL,
        max_iter=_PCG_MAX_ITER,
        true_residual_every=0,
        stagnation_window=0,
        confirm=False,
        column_operator=True,
        column_failures="freeze",
        warn=False,
    )
    Xs = res.x
    info["pcg_iterations"] = int(res.n_iter)
    act = np.flatnonzero([r is not None for r in res.column_reason])
    del c, K, k_times
    info["redone_direct"] = int(act.size)
    for j in act:  # never score a rough solve
        B = np.asarray(kernel_matrix(kern, Xf[tr]), dtype=np.float64)
        B[np.diag_indices_from(B)] += sc[0, j]
        Xs[:, j] = linalg.cho_solve(cho_factor(B, overwrite_a=True), Yt[:, j], check_finite=False)
        del B
    preds = np.asarray(kernel_matrix(kern, Xf[te], Xf[tr]), dtype=np.float64) @ Xs
    scorer = check_scoring(search, scoring="r2" if search.scoring is None else search.scoring)
    out = []
    for li in range(m):
        p = preds[:, li * t : (li + 1) * t]
        p = p[:, 0] if ys.ndim == 1 else p
        score = scorer(FixedPredictions(p), X[te], ys[te])
        out.append(float(np.ldexp(score, back)) if back else float(score))
    return out


def refine_alpha(search: Any, X: np.ndarray, y: np.ndarray, kern: Any) -> dict[str, Any]:
    """Score the λ of :data:`REFINE_FACTORS` times ``search.best_alpha_`` for the kernel
    ``kern`` (the chosen setting) on all of ``X, y``; return the refinement's record.

    Returns
    -------
    dict
        ``alphas`` and ``scores`` (the refinement curve, λ ascending; scores in the
        search's units, larger is better), ``alpha`` (the λ kept), ``subsample_alpha``,
        ``method`` (``"loo-eigen"``, ``"holdout-dense"`` or ``"holdout-cg"``),
        ``n_train``, ``seconds`` and ``at_edge`` (the kept λ is the smallest or largest
        scored: one beyond may be better); ``holdout-dense`` also ``pcg_iterations`` and
        ``redone_direct`` (columns solved by their own Cholesky)."""
    t0 = time.perf_counter()
    n = int(X.shape[0])
    a0 = float(search.best_alpha_)
    alphas = sorted(a0 * f for f in REFINE_FACTORS)
    seed = check_random_seed(search.random_state)  # the held-out split: seeded (None: 0)
    # every λ scored exactly to tol (no tolerance screening, no Nyström screen): the
    # refinement keeps the best of them
    common = dict(
        alphas=alphas, kernel=kern, param_grid=None, gamma=None, store=None, refit=False,
        checkpoint=None, max_search_seconds=None, progress=False, subsample=None,
        refine=False, random_state=0 if seed is None else seed, screen_tol=None,
        screen_centers=None,
    )  # fmt: skip
    info: dict[str, Any] = {}
    if n <= REFINE_EIGEN_MAX_N:
        method, sub = "loo-eigen", clone(search).set_params(cv="loo", solver="eigen", **common)
    else:
        held = _holdout_fraction(search.cv)
        method, sub = "holdout-dense", None
        scores = None
        if n <= REFINE_IN_MEMORY_MAX_N:
            try:
                scores = _holdout_shifted(
                    search, X, y, kern, alphas, a0, held, common["random_state"], info
                )
            except MemoryError as e:  # K does not fit here (refused before any work)
                log.info("refine: not in memory (%s); by block CG", e)
                scores = None
        if scores is None:
            method = "holdout-cg"
            sub = clone(search).set_params(cv=held, solver="cg", **common)
    if sub is not None:
        sub.fit(X, y)
        res = sub.cv_results_
        got = {float(p["alpha"]): float(s) for p, s in zip(res["params"], res["mean_test_score"])}
        scores = [got[a] for a in alphas]
    best = max(scores)
    i0 = alphas.index(a0)
    # the subsample's λ on a tie (the refinement only moves λ for a better score)
    keep = i0 if scores[i0] >= best else int(np.argmax(scores))
    seconds = time.perf_counter() - t0
    out = {
        "method": method,
        "n_train": n,
        "subsample_alpha": a0,
        "alpha": alphas[keep],
        "alphas": alphas,
        "scores": scores,
        "at_edge": keep in (0, len(alphas) - 1),
        "seconds": round(seconds, 4),
        **info,
    }
    log.info(
        "refine: lambda %g -> %g on all %d rows (%s, %d lambdas, %.2f s)%s",
        a0, alphas[keep], n, method, len(alphas), seconds,
        "; the best is at the end of the range scored" if keep in (0, len(alphas) - 1) else "",
    )  # fmt: skip
    return out
