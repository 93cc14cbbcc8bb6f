"""``KernelRidgeCV(solver="nystrom")``: the λ grid of Nyström KRR from sufficient statistics.

For one kernel setting the M centres C are chosen once from all the search's rows, as
:func:`pipeline.linalg.nystrom_solve.nystrom_solve` chooses them (same recipe, same
seed). ONE pass over the row blocks of X then accumulates, for each fold f (its test
rows) and for all rows, with ``g_i = k(x_i, C)``:

    S_f = Σ_{i in f} w_i g_i g_iᵀ (M x M),  r_f = Σ w_i g_i y_iᵀ (M x t),
    q_f = Σ w_i y_i²,  s_f = Σ w_i y_i,  W_f = Σ w_i.

The training statistics of fold f are the totals minus fold f's (so the training set
must be the complement of the test set and the test sets disjoint: K-fold, a held-out
split, leave-one-out). Each (fold, λ) is then the M x M system of the direct Nyström
solve, ``(S_train + shift K_MM) β = r_train``. All λ of a fold come from ONE
eigendecomposition (:class:`~pipeline.linalg.nystrom_solve.ShiftPath`: the pencil
diagonalised with FALKON's T), where K_MM is far enough from singular
(``PATH_KAPPA_MIN``). Otherwise (repeated centres) each (fold, λ) is factored by
:meth:`~pipeline.linalg.nystrom_solve.NystromNormalOperator.solve_direct` itself (its
code, not a copy: :class:`_FoldSystem` lends it the attributes it reads): FALKON's B
built per (fold, λ) from K_MM and λ / n_train_f, ``β = B γ``. At M = 1,000 on
diamonds (35,000 rows, 5 folds x 10 λ, RPCholesky centres) the path took the solves of
three settings from 25.3 s to 4.9 s, and the search from 37.6 s to 16.0 s.

A second pass over the row blocks then predicts each fold's test rows with every λ's β
at once (``g_i β``, an (M x λ·t) product per block) and sums the held-out residuals
``Σ w (y - g β)²`` (:func:`held_out_rss`). The moment formula ``q_f - 2 β·r_f + βᵀ S_f
β`` would need no second pass, but it cancels: where β is large (a smooth kernel, a
small λ, centres close together), its terms are many orders of magnitude above the
residual. On diamonds (N = 35,000, M = 2,000 uniform centres, RBF γ = 0.03, λ = 0.01)
it gave fold 4 an R² of 1.000000 where the fold's predictions score -10.6, and the
search picked that setting. R² then follows from the residuals and the fold's moments
(``W_f``, ``s_f`` and the centred ``Σ w (y - ȳ_f)²``, summed on the same pass).

Memory: (folds + 1) M x M float64 matrices, refused (:func:`check_statistics_memory`)
beyond the memory available. Time: N·M² flops for the first pass (a SYRK per fold and
block; twice that where the blocks are mapped by FALKON's ``T⁻¹``, the solver's rule
:meth:`~pipeline.linalg.nystrom_solve.FalkonPreconditioner.maps_rows`), plus one M x M
eigendecomposition per fold (folds x λ factorisations without the path), plus N·M·λ·t
for the second pass.

The runner's strategy (:class:`pipeline.models.selection.strategies.NystromStrategy`:
:func:`setting_statistics` per kernel setting) returns, per (λ, fold), the vector
``[rss (t), W_f, c_f (t), s_f (t)]`` in place of predictions (``c_f = Σ w (y - ȳ_f)²``,
about the fold's own mean, summed on the second pass too: ``q_f - s_f² / W_f`` cancels
for a target far from zero, 1 - 1 at y = 1e8 ± 1): the runner checkpoints it as it
checkpoints predictions, and :func:`nystrom_scores` turns it into the supported scores
(:data:`NYSTROM_SCORERS`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipeline.constants import DEFAULT_N_CENTERS
from pipeline.engine.fused import kernel_tile
from pipeline.linalg import dense_memory
from pipeline.linalg.nystrom_solve import (
    FalkonPreconditioner,
    NystromNormalOperator,
    ShiftPath,
    _Rows,
    add_block_sums,
    centre_kernel,
    check_n_centers,
    kernel_blocks,
    nystrom_centres,
)

__all__ = [
    "NYSTROM_SCORERS",
    "check_nystrom_search",
    "check_statistics_memory",
    "fold_statistics",
    "nystrom_scores",
    "pooled",
    "scores_from_statistics",
    "setting_system",
]

log = logging.getLogger("pipeline.models.selection")

#: the scorers whose value follows from the statistics (None is KernelRidgeCV's default, R²)
NYSTROM_SCORERS = (None, "r2", "neg_mean_squared_error", "neg_root_mean_squared_error")
#: rows per kernel block of the statistics pass
BLOCK_ROWS = 2048
#: the version of the λ arithmetic, in the settings' checkpoints
#: (``checkpoint.PREDICTIONS_RECIPE``): 2, every λ of a fold from one eigendecomposition
#: (:class:`~pipeline.linalg.nystrom_solve.ShiftPath`) where it is offered; 1 factored
#: each (fold, λ) system
LAMBDA_PATH = 2


def n_centres(cv: Any, n: int) -> int:
    """M of the search ``cv`` on ``n`` rows (None: the default M, at most n)."""
    if cv.n_centers is None:
        return min(DEFAULT_N_CENTERS, n)
    m = check_n_centers(cv.n_centers)
    if m > n:
        raise ValueError(
            f"n_centers={m} exceeds the number of rows searched N={n}; use n_centers <= N"
        )
    return m


def seed(cv: Any) -> int:
    """The centres' seed: ``random_state`` when an int, else 0 (as the refit's)."""
    rs = cv.random_state
    return int(rs) if isinstance(rs, int | np.integer) else 0


def memory_budget() -> float:
    """Bytes the statistics may take (a fraction of the memory available now)."""
    return dense_memory.available_memory() * dense_memory.SAFETY_FRACTION


def check_statistics_memory(m: int, n_folds: int, budget: float | None = None) -> int:
    """The bytes of the (folds + 1) M x M statistics; MemoryError-free ValueError above
    ``budget`` (default :func:`memory_budget`)."""
    nbytes = (n_folds + 1) * m * m * 8
    budget = memory_budget() if budget is None else float(budget)
    if nbytes > budget:
        raise ValueError(
            f"KernelRidgeCV(solver='nystrom') holds (folds + 1) = {n_folds + 1} M x M "
            f"float64 matrices with M = n_centers = {m} and {n_folds} folds: {nbytes} bytes, "
            f"more than the {int(budget)} bytes available; use fewer n_centers or fewer folds"
        )
    return nbytes


def fold_index(n: int, splits: list) -> np.ndarray:
    """Each row's test fold (-1: in none); ValueError unless the test sets are disjoint
    and each training set is the complement of its test set."""
    fold = np.full(n, -1, dtype=np.int64)
    for f, (tr, te) in enumerate(splits):
        te = np.asarray(te, dtype=np.int64)
        if np.any(fold[te] >= 0) or np.unique(te).size != te.size:
            raise ValueError(
                "solver='nystrom' scores each fold from per-fold statistics, so the test "
                "sets must be disjoint; these splits repeat a test row (e.g. ShuffleSplit); "
                "use K-fold or one held-out split"
            )
        fold[te] = f
        if len(tr) + len(te) != n or np.unique(tr).size != len(tr) or np.any(fold[tr] == f):
            raise ValueError(
                "solver='nystrom' takes each fold's training statistics as the totals minus "
                "the fold's, so each training set must be the complement of its test set; "
                "these splits are not (e.g. bootstrap or group subsets); use K-fold or one "
                "held-out split"
            )
    return fold


def scorer_units(scoring: Any, n_targets: int) -> tuple[Any, np.ndarray]:
    """``(name, column scale)`` of a supported scorer: a name of :data:`NYSTROM_SCORERS`
    (scale 1), or the run's scorer of the data's units (``pipeline.stages.select.
    OriginalUnits``: the targets mapped back by ``y * scale + mean`` per column, so the
    residuals scale by ``scale``); ValueError naming any other scorer."""
    name, scale = scoring, np.ones(n_targets)
    if hasattr(scoring, "scoring") and hasattr(scoring, "_back"):  # OriginalUnits
        name = scoring.scoring
        one = np.ones((1, n_targets))
        scale = np.abs(scoring._back(one) - scoring._back(0 * one)).reshape(-1)
    if name not in NYSTROM_SCORERS:
        raise ValueError(
            f"scoring={scoring!r} is not supported by KernelRidgeCV(solver='nystrom'), "
            f"which scores from sufficient statistics; use one of {NYSTROM_SCORERS} "
            "(None is R²)"
        )
    return name, scale


def check_nystrom_search(cv: Any, n: int, kind: str, splits: list) -> None:
    """The refusals of ``solver="nystrom"`` before any work: the scorer, M, the splits and
    the statistics' memory."""
    scorer_units(cv.scoring, 1)
    if cv.refine:
        raise ValueError(
            "refine=True scores λ with the exact solvers; solver='nystrom' does not "
            "refine: use refine=None or False (its grid runs on all rows unless subsample=)"
        )
    m = n_centres(cv, n)
    fold_index(n, splits)
    check_statistics_memory(m, len(splits))


def _fold_blocks(
    X: Any, Y: np.ndarray, kernel: Any, C: np.ndarray, fold: np.ndarray,
    sample_weight: np.ndarray | None, block_size: int, n_threads: int | None, check: bool,
    map_rows: Any = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:  # fmt: skip
    """The pass over X's row blocks that both passes of the search make: for each block
    (in row order) and each fold f with rows in it (ascending; -1: rows of no fold),
    ``(f, G_f, y_f, w_f)``: those rows' kernel block ``k(X_f, C)`` (mapped by ``map_rows``
    when given, as the solver's direct pass maps it), targets and weights (the solver's
    pass, :func:`~pipeline.linalg.nystrom_solve.kernel_blocks`; ``check``: its finite
    checks)."""
    rows = _Rows(X, block_size)
    G = np.empty((rows.block, C.shape[0]))

    def block(xb: np.ndarray) -> np.ndarray:
        Gb = G[: xb.shape[0]]
        kernel_tile(kernel, xb, C, Gb, kernel_dtype="float64", n_threads=n_threads)
        return Gb

    for start, _, Gb in kernel_blocks(rows, block, check=check):
        if map_rows is not None:
            Gb = map_rows(Gb)
        b = Gb.shape[0]
        fb = fold[start : start + b]
        yb = Y[start : start + b]
        wb = np.ones(b) if sample_weight is None else sample_weight[start : start + b]
        for f in np.unique(fb):
            sel = np.flatnonzero(fb == f)
            yield int(f), Gb[sel], yb[sel], wb[sel]


def fold_statistics(
    X: Any,
    Y: np.ndarray,
    kernel: Any,
    C: np.ndarray,
    fold: np.ndarray,
    n_folds: int,
    *,
    sample_weight: np.ndarray | None = None,
    block_size: int = BLOCK_ROWS,
    n_threads: int | None = None,
    map_rows: Any = None,
) -> dict[str, np.ndarray]:
    """One pass over the row blocks of X: per fold f, then for all rows (index
    ``n_folds``), S (M x M), r (M x t), q (t), s (t) and W (see the module notes).

    The solver's pass (:func:`pipeline.linalg.nystrom_solve.kernel_blocks`, the finite
    checks included) with its per-block sums (:func:`~pipeline.linalg.nystrom_solve.
    add_block_sums`) on each fold's rows of the block: block by block in row order, each
    fold's in its own float64 accumulator, so a fold of whole blocks has the bits of the
    solver's pass over its rows; the totals are the rows of no fold plus each fold's, in
    fold order."""
    M, t = C.shape[0], Y.shape[1]
    F = n_folds
    S = np.zeros((F + 1, M, M))
    r = np.zeros((F + 1, M, t))
    q = np.zeros((F + 1, t))
    s = np.zeros((F + 1, t))
    W = np.zeros(F + 1)
    blocks = _fold_blocks(
        X, Y, kernel, C, fold, sample_weight, block_size, n_threads, True, map_rows
    )
    for f, Gf, y, w in blocks:
        k = F if f < 0 else f
        add_block_sums(Gf, y, w[:, None], r[k], S[k])
        q[k] += (w[:, None] * y * y).sum(axis=0)
        s[k] += (w[:, None] * y).sum(axis=0)
        W[k] += w.sum()
    for f in range(F):
        S[F] += S[f]
        r[F] += r[f]
        q[F] += q[f]
        s[F] += s[f]
        W[F] += W[f]
    return {"S": S, "r": r, "q": q, "s": s, "W": W, "mapped": map_rows is not None}


class _FoldSystem:
    """The preconditioned M x M system of one (fold, λ): the attributes that
    :meth:`NystromNormalOperator.solve_direct` and :meth:`~NystromNormalOperator.coef`
    read (``K_MM``, ``shift``, ``n_eff``, ``pre``, ``n``, ``mapped``), so the one direct
    solve of the Nyström solver serves each fold without a pass over X.

    FALKON's ``B = T⁻¹ A⁻¹`` per (fold, λ): T (``chol(K_MM + ε I)``, from K_MM alone) is
    the setting's ``base`` preconditioner's, factored once; only
    ``A = chol(T Tᵀ / M + λ' I)`` is factored here
    (:meth:`FalkonPreconditioner.with_shift`: the same bits as building it anew)."""

    solve_direct = NystromNormalOperator.solve_direct
    sums_rhs = NystromNormalOperator.sums_rhs
    coef = NystromNormalOperator.coef

    def __init__(self, K_MM: np.ndarray, shift: float, n_eff: float,
                 base: FalkonPreconditioner, mapped: bool = False) -> None:  # fmt: skip
        self.mapped = bool(mapped)
        self.K_MM = K_MM
        self.shift = float(shift)
        self.n_eff = float(n_eff)
        self.n = K_MM.shape[0]
        self.pre = base.with_shift(self.shift / self.n_eff)
        self.n_products = 0


def fold_coefficients(
    st: dict[str, np.ndarray], K_MM: np.ndarray, f: int, shift: float,
    base: FalkonPreconditioner | None = None,
) -> tuple[np.ndarray, float]:  # fmt: skip
    """β (M x t) of fold f's training rows at ``shift``, and the preconditioned system's
    largest relative residual (``base``: the setting's preconditioner, for its T)."""
    F = st["W"].shape[0] - 1
    normal = st["S"][F] - st["S"][f]
    base = FalkonPreconditioner(K_MM, 1.0) if base is None else base
    sysm = _FoldSystem(K_MM, shift, st["W"][F] - st["W"][f], base, bool(st.get("mapped")))
    b = sysm.sums_rhs(st["r"][F] - st["r"][f])
    g, res = sysm.solve_direct(normal, b)
    return sysm.coef(g), float(np.max(res))


def held_out_rss(
    X: Any, Y: np.ndarray, kernel: Any, C: np.ndarray, fold: np.ndarray, betas: np.ndarray,
    means: np.ndarray, *, sample_weight: np.ndarray | None = None,
    block_size: int = BLOCK_ROWS, n_threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``rss[f, c] = Σ_{i in fold f} w_i (Y_i - g_i β_f)²`` for the columns c of ``betas[f]``
    (F x M x c; fold f's coefficients, λ after λ, each with the t targets of ``Y``), and
    ``centred[f] = Σ_{i in fold f} w_i (Y_i - means[f])²`` (t): a second pass over X's row
    blocks (the statistics' pass, whose finite checks it does not repeat), predicting each
    fold's test rows with all its columns in one product."""
    F, _, c = betas.shape
    t = Y.shape[1]
    rss = np.zeros((F, c))
    centred = np.zeros((F, t))
    blocks = _fold_blocks(X, Y, kernel, C, fold, sample_weight, block_size, n_threads, False)
    for f, Gf, y, w in blocks:
        if f >= 0:
            R = np.tile(y, (1, c // t)) - Gf @ betas[f]
            rss[f] += (w[:, None] * R * R).sum(axis=0)
            centred[f] += (w[:, None] * (y - means[f]) ** 2).sum(axis=0)
    return rss, centred


def held_out(st: dict[str, np.ndarray], f: int, rss: np.ndarray, centred: np.ndarray) -> np.ndarray:
    """``[rss (t), W_f, c_f (t), s_f (t)]`` of fold f's test rows (``rss``: their residuals'
    weighted sum of squares per target, ``c_f``: their targets' about the fold's mean,
    :func:`held_out_rss`): the held-out vector, read back by :func:`held_out_parts`."""
    return np.concatenate([rss, [st["W"][f]], centred, st["s"][f]])


def held_out_parts(v: Any, t: int | None = None) -> tuple[np.ndarray, ...]:
    """``(rss, W, c, s)`` of held-out vectors (:func:`held_out`) along the last axis; ``t``,
    the number of targets, defaults to a plain vector's ``(size - 1) / 3`` (a vector with
    nested fidelities' residuals after it needs it given: :func:`nested_vectors`)."""
    v = np.asarray(v, dtype=np.float64)
    t = (v.shape[-1] - 1) // 3 if t is None else t
    return v[..., :t], v[..., t], v[..., t + 1 : 2 * t + 1], v[..., 2 * t + 1 : 3 * t + 1]


def fold_means(st: dict[str, np.ndarray], n_folds: int) -> np.ndarray:
    """Each fold's weighted mean target ``s_f / W_f`` (F x t; 0 for a fold of weight 0)."""
    W = st["W"][:n_folds, None]
    return np.where(W > 0, st["s"][:n_folds] / np.where(W > 0, W, 1.0), 0.0)


def pooled(vs: list[np.ndarray]) -> np.ndarray:
    """The held-out vector of several folds together (leave-one-out's): the residuals,
    weights and sums add up, and the centred sums of squares by the parallel-axis rule
    ``Σ_f c_f + Σ_f W_f (ȳ_f - ȳ)²`` (a sum of non-negative terms: no cancellation)."""
    rss, W, c, s = held_out_parts(np.stack([np.asarray(v, dtype=np.float64) for v in vs]))
    Wt = W.sum()
    mean_f = np.where(W[:, None] > 0, s / np.where(W > 0, W, 1.0)[:, None], 0.0)
    mean = s.sum(axis=0) / Wt if Wt > 0 else np.zeros(s.shape[1])
    c = c.sum(axis=0) + (W[:, None] * (mean_f - mean) ** 2).sum(axis=0)
    return np.concatenate([rss.sum(axis=0), [Wt], c, s.sum(axis=0)])


def scores_from_statistics(v: np.ndarray, scoring: Any, scale: Any = 1.0) -> float:
    """The score of one held-out vector ``[rss (t), W, c (t), s (t)]`` (several folds
    pooled by :func:`pooled`): scikit-learn's weighted scorer, its targets averaged with
    equal weights (``multioutput="uniform_average"``); ``scale``: the residuals' scale per
    column (:func:`scorer_units`; R² does not change)."""
    rss, W, den, s = held_out_parts(v)
    if scoring != "r2" and scoring is not None:
        rss = rss * np.asarray(scale, dtype=np.float64) ** 2
    if scoring == "neg_mean_squared_error":
        return float(-np.mean(rss / W))
    if scoring == "neg_root_mean_squared_error":
        return float(-np.mean(np.sqrt(rss / W)))
    # R² (None and "r2"): 1 - rss / Σ w (y - ȳ_w)², scikit-learn's force_finite cases (a
    # constant target: its deviations from the rounded mean are a few ulps of ȳ)
    mean = s / W if W > 0 else np.zeros_like(s)
    zero = den <= W * (8 * np.finfo(np.float64).eps * np.abs(mean)) ** 2
    r2 = np.where(zero, np.where(rss == 0, 1.0, 0.0), 1.0 - rss / np.where(zero, 1.0, den))
    return float(np.mean(r2))


def nystrom_scores(
    results: list[dict], candidates: list, settings: list[dict], splits: list, kind: str,
    scoring: Any,
) -> np.ndarray:  # fmt: skip
    """``scores[c, f]`` from the strategy's held-out vectors (LOO: one pooled column)."""
    n_scored = 1 if kind == "loo" else len(splits)
    scores = np.empty((len(candidates), n_scored))
    first = next(iter(results[0].values()))[0]
    name, scale = scorer_units(scoring, held_out_parts(first)[0].size)
    for ci, c in enumerate(candidates):
        vs = results[settings.index(c.kernel_params)][c["alpha"]]
        if kind == "loo":
            scores[ci, 0] = scores_from_statistics(pooled(vs), name, scale)
        else:
            for f in range(n_scored):
                scores[ci, f] = scores_from_statistics(np.asarray(vs[f]), name, scale)
    return scores


def setting_system(
    X: Any, Y: np.ndarray, kern: Any, C: np.ndarray, fold: np.ndarray, n_folds: int,
    *, sample_weight: np.ndarray | None = None, shift: float,
) -> tuple[dict[str, np.ndarray], np.ndarray, FalkonPreconditioner]:  # fmt: skip
    """One kernel setting's statistics (:func:`fold_statistics`), ``K_MM`` and FALKON's
    preconditioner of it (its T serves every (fold, λ): :func:`fold_coefficients`). The
    solver's rule (:meth:`FalkonPreconditioner.maps_rows` at ``shift``, the smallest of
    the setting's (fold, λ)) decides the basis: the blocks mapped by ``T⁻¹`` where the
    centres' own would round too much."""
    K_MM = centre_kernel(kern, C)
    base = FalkonPreconditioner(K_MM, 1.0)
    mapped = base.maps_rows(int(np.shape(Y)[0]), shift)
    if mapped:
        base.mapped_kernel()  # made once, shared by every (fold, λ)
    st = fold_statistics(
        X, Y, kern, C, fold, n_folds, sample_weight=sample_weight,
        map_rows=base.map_rows if mapped else None,
    )  # fmt: skip
    return st, K_MM, base


def _nested_betas(
    st: dict[str, np.ndarray], K_MM: np.ndarray, base: FalkonPreconditioner, splits: list,
    alphas: list[float], shift_of: Any, mm: int,
) -> np.ndarray | None:  # fmt: skip
    """β (F x M x λ·t, zero beyond row ``mm``) of Nyström KRR on the first ``mm`` centres,
    from the leading blocks of the statistics: in the mapped basis those are the blocks
    of ``G T⁻¹`` with T's leading block (T is triangular); None where that block offers
    no λ path (:class:`ShiftPath`)."""
    M = K_MM.shape[0]
    path = ShiftPath.make(base.leading(mm), bool(st["mapped"]))
    if path is None:
        return None
    F = len(splits)
    t = st["r"].shape[2]
    out = np.zeros((F, M, len(alphas) * t))
    S, r = st["S"][:, :mm, :mm], st["r"][:, :mm, :]
    for f, (tr, _) in enumerate(splits):
        shifts = [shift_of(a, len(tr)) for a in alphas]
        out[f, :mm], _ = path.coefficients(S[F] - S[f], r[F] - r[f], shifts)
    return out


def nested_vectors(v: np.ndarray, t: int) -> list[np.ndarray]:
    """The held-out vector ``[rss, W, c, s]`` of the full centres and of each nested
    fidelity of a vector :func:`setting_statistics` made with ``nested``: the same
    weights and sums, its own residuals."""
    v = np.asarray(v, dtype=np.float64)
    _, W, c, s = held_out_parts(v, t)
    head, shared = v[: 1 + 3 * t], np.concatenate([[W], c, s])
    k = (v.size - head.size) // t
    return [head] + [
        np.concatenate([v[head.size + j * t : head.size + (j + 1) * t], shared]) for j in range(k)
    ]


def setting_statistics(
    X: Any, y2: np.ndarray, kern: Any, splits: list, alphas: list[float], shift_of: Any,
    *, m: int, centers: str, random_state: int, sample_weight: np.ndarray | None = None,
    stats: Any = None, nested: tuple[int, ...] = (),
) -> list[list[np.ndarray]]:  # fmt: skip
    """``out[l][f]``: the held-out vector of ``alphas[l]`` on fold f for one kernel
    setting (``shift_of(alpha, n_train)`` is the search's diagonal shift).

    ``nested`` (the CV screen's fidelities, :mod:`~pipeline.models.selection.finalists`):
    also the held-out residuals of Nyström KRR on the first m' centres (in the order
    RPCholesky picked them, so each is a rank-m' RPCholesky's own) for each m' of
    ``nested``, from the same statistics (their leading blocks) and the same held-out
    pass: each vector then ends with those residuals, t per m' (:func:`nested_vectors`);
    NaN where K_MM's leading block offers no λ path."""
    t0 = time.perf_counter()
    n = X.shape[0]
    fold = fold_index(n, splits)
    idx = nystrom_centres(
        X, kern, m, centers=centers, random_state=random_state, pivot_order=bool(nested)
    )
    C = np.ascontiguousarray(np.asarray(X)[idx], dtype=np.float64)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    smallest = min(shift_of(a, len(tr)) for a in alphas for tr, _ in splits)
    st, K_MM, base = setting_system(
        X, y2, kern, C, fold, len(splits), sample_weight=w, shift=smallest
    )
    t1 = time.perf_counter()
    out: list[list[np.ndarray]] = [[None] * len(splits) for _ in alphas]  # type: ignore[list-item]
    worst = 0.0
    t = y2.shape[1]
    betas = np.empty((len(splits), m, len(alphas) * t))
    path = ShiftPath.make(base, bool(st["mapped"])) if len(alphas) > 1 else None
    F = len(splits)
    for f, (tr, _) in enumerate(splits):
        shifts = [shift_of(a, len(tr)) for a in alphas]
        if path is not None:  # every λ of the fold from one eigendecomposition
            betas[f], res = path.coefficients(
                st["S"][F] - st["S"][f], st["r"][F] - st["r"][f], shifts
            )
            worst = max(worst, float(np.max(res)))
            continue
        for li, shift in enumerate(shifts):
            beta, res = fold_coefficients(st, K_MM, f, shift, base)
            worst = max(worst, res)
            betas[f][:, li * t : (li + 1) * t] = beta
    lt = len(alphas) * t
    fidelities = [_nested_betas(st, K_MM, base, splits, alphas, shift_of, mm) for mm in nested]
    ok = [b is not None for b in fidelities]
    betas = np.concatenate([betas, *(b for b in fidelities if b is not None)], axis=2)
    t2 = time.perf_counter()
    means = fold_means(st, len(splits))
    rss, centred = held_out_rss(X, y2, kern, C, fold, betas, means, sample_weight=w)
    for f in range(len(splits)):
        for li in range(len(alphas)):
            v = held_out(st, f, rss[f, li * t : (li + 1) * t], centred[f])
            if nested:
                extra, k = [], 1
                for good in ok:
                    if good:
                        extra.append(rss[f, k * lt + li * t : k * lt + (li + 1) * t])
                        k += 1
                    else:
                        extra.append(np.full(t, np.nan))
                v = np.concatenate([v, *extra])
            out[li][f] = v
    if stats is not None:
        stats["kernel_matrices"] += 1
        stats["factorizations"] += len(splits) * (1 if path is not None else len(alphas))
        stats["fold_fits_equivalent"] += len(splits) * len(alphas)
        sec = stats["seconds"]
        sec["statistics"] = sec.get("statistics", 0) + round(t1 - t0, 4)
        sec["solves"] = sec.get("solves", 0) + round(t2 - t1, 4)
        sec["held_out"] = sec.get("held_out", 0) + round(time.perf_counter() - t2, 4)
    log.info(
        "Nyström CV: M=%d centres, %d folds x %d λ from one pass (%.2f s), %d M x M "
        "%s (%.2f s, largest relative residual %.1e) and a pass predicting the "
        "held-out rows (%.2f s)", m, len(splits), len(alphas), t1 - t0,
        len(splits) * (1 if path is not None else len(alphas)),
        "eigendecompositions" if path is not None else "solves", t2 - t1, worst,
        time.perf_counter() - t2,
    )  # fmt: skip
    return out
