"""The exactness gap, shown: ``evaluate.compare`` (issue #45 item 2).

On the same held-out rows as the evaluate stage's own metrics, with the kernel and λ
of the chosen model, :func:`compare_rows` fits and scores

- Nyström models (``KernelRidge(solver="nystrom", n_centers=M)``) at each M of
  ``evaluate.compare.nystrom`` (an M >= n_train is skipped, with a log line: it would
  be the exact fit);
- the exact model on nested subsamples of the training rows (``subsample``: fractions
  of n_train; the rows of the smaller subsample lie inside the larger, drawn once by a
  seeded permutation), in memory, or out of core in the run directory's
  ``compare_store`` when the fit plan says the subsample's dense solve does not fit
  in memory.

Each row is ``{"kind": "exact" | "nystrom", "n_train", "n_centers" (None for exact),
"metrics", "seconds"}``; the run's own model's row carries the evaluate stage's own
metrics (its fit is the solve stage's: ``seconds`` is None): the full exact fit's row,
or, when the run solved Nyström (``solver.method: nystrom``), that Nyström row, and the
full exact fit is then fitted here. :func:`compare_summary`
says in one plain sentence what the rows show.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.fit import measure_resources
from pipeline.kernels import make_kernel
from pipeline.models.estimator import KernelRidge
from pipeline.options import ALPHA_CONVENTION_ALIASES
from pipeline.plan.fit_plan import plan_fit

__all__ = ["GAIN_PER_DOUBLING", "compare_rows", "compare_summary", "nested_subsamples"]

log = logging.getLogger(__name__)

#: the error must fall by more than this fraction per doubling of the training rows
#: (on the last step of the exact fits) for "the error still falls with N"
GAIN_PER_DOUBLING = 0.02


def nested_subsamples(n: int, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Sorted row indices of ``round(f * n)`` rows for each fraction (ascending), nested:
    each is the first rows of one seeded permutation of ``range(n)``, so a smaller
    subsample lies inside every larger one."""
    perm = np.random.default_rng(seed).permutation(int(n))
    sizes = sorted({int(round(float(f) * n)) for f in fractions})
    return [np.sort(perm[:m]) for m in sizes]


def _alpha_convention(lam_convention: str) -> str:
    """The stage's λ convention (``sklearn`` or ``n``) as the estimator spells it."""
    return ALPHA_CONVENTION_ALIASES[lam_convention]


def _exact_out_of_core(n: int, d: int, t: int, kernel: Any, lam: float, conv: str) -> bool:
    """Whether the fit plan sends an exact fit of ``n`` rows out of core: its in-memory
    dual does not fit in the memory available now."""
    choices = {"solver": "auto", "alpha": lam, "alpha_convention": conv}
    plan, _ = plan_fit(n, d, kernel, measure_resources(None, in_memory=True), choices,
                       n_targets=t)  # fmt: skip
    return plan.out_of_core


def compare_rows(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    score: Callable[[np.ndarray], dict[str, float]],
    *,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    nystrom: Sequence[int],
    subsample: Sequence[float],
    seed: int = 0,
    store: str | None = None,
    full_metrics: Mapping[str, float] | None = None,
    full_n_centers: int | None = None,
) -> list[dict[str, Any]]:
    """Fit and score the comparison models on the held-out rows ``X_test``.

    Parameters
    ----------
    X_train, y_train : ndarray
        The training rows as the solve stage saw them (standardised when the run
        standardises).
    X_test : ndarray
        The held-out rows, preprocessed as ``X_train``.
    score : callable
        ``score(pred)`` -> the metrics of the predictions on the held-out rows (in the
        units of ``y_train``; the caller maps them back to y's).
    kernel : dict
        The chosen kernel's spec.
    lam, lam_convention : float, str
        The chosen λ and its convention (``sklearn`` or ``n``), as the solve stage took them.
    nystrom : sequence of int
        Numbers of Nyström centres.
    subsample : sequence of float
        Fractions of the training rows for the nested exact fits.
    seed : int
        Seed of the subsamples and of the Nyström centres.
    store : str, optional
        Where an exact fit the plan sends out of core keeps its tiles (None: a
        temporary directory).
    full_metrics : mapping, optional
        The run's own model's metrics (the evaluate stage's): the full exact fit's row,
        after the subsamples'.
    full_n_centers : int, optional
        The run's own model is Nyström with this many centres (``solver.method:
        nystrom``): its metrics are that Nyström row, and the full exact fit is fitted
        here (in memory or out of core, as the subsamples).

    Returns
    -------
    list of dict
        The exact rows by training size, then the Nyström rows by M.
    """
    n, d = X_train.shape
    t = 1 if y_train.ndim == 1 else y_train.shape[1]
    k = make_kernel(kernel)
    conv = _alpha_convention(lam_convention)
    rows: list[dict[str, Any]] = []

    def fit_score(kind: str, rows_idx: np.ndarray | None, m: int | None, **params: Any) -> None:
        Xs = X_train if rows_idx is None else X_train[rows_idx]
        ys = y_train if rows_idx is None else y_train[rows_idx]
        t0 = time.perf_counter()
        model = KernelRidge(alpha=lam, kernel=k, alpha_convention=conv, random_state=seed,
                            **params).fit(Xs, ys)  # fmt: skip
        pred = model.predict(X_test)
        secs = time.perf_counter() - t0
        rows.append({"kind": kind, "n_train": int(len(Xs)), "n_centers": m,
                     "metrics": score(pred), "seconds": secs})  # fmt: skip
        log.info("compare: %s n_train=%d n_centers=%s in %.2f s", kind, len(Xs), m, secs)

    def exact(idx: np.ndarray | None) -> None:
        m = n if idx is None else len(idx)
        ooc = store is not None and _exact_out_of_core(m, d, t, k, lam, conv)
        fit_score("exact", idx, None, solver="auto", **({"store": store} if ooc else {}))

    for idx in nested_subsamples(n, subsample, seed):
        if len(idx) < 2 or len(idx) >= n:
            log.info("compare: exact fit on %d of %d training rows skipped (need 2..%d)",
                     len(idx), n, n - 1)  # fmt: skip
            continue
        exact(idx)
    own = None
    if full_metrics is not None:
        own = {"kind": "exact" if full_n_centers is None else "nystrom", "n_train": int(n),
               "n_centers": full_n_centers, "metrics": dict(full_metrics), "seconds": None}  # fmt: skip
    if own is not None and full_n_centers is not None:
        exact(None)  # the run solved Nyström: the full exact fit is this comparison's
    elif own is not None:
        rows.append(own)
    for m in sorted(
        {int(m) for m in nystrom} | ({full_n_centers} if own and full_n_centers else set())
    ):
        if m == full_n_centers and own is not None:
            rows.append(own)  # the run's own Nyström model, not fitted again
        elif m >= n:
            log.info("compare: Nyström(%d) skipped: M >= n_train=%d is the exact fit", m, n)
        else:
            fit_score("nystrom", None, m, solver="nystrom", n_centers=m)
    return rows


def _error(metrics: Mapping[str, float], name: str) -> float:
    """The error of one row by metric ``name``: lower is better (1 - R² for ``r2``)."""
    v = float(metrics[name])
    return 1.0 - v if name == "r2" else v


_LABELS = {"rmse": "RMSE", "mae": "MAE", "r2": "1 - R²"}


def compare_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """One plain sentence on the comparison rows, e.g. "the exact fit is 33% better than
    Nyström(4,000) in held-out RMSE (0.078 vs 0.116); the error still falls with N, so
    more data would pay".

    Rules (a pure function of the rows):

    - the error is RMSE when the rows have it, else MAE, else 1 - R²;
    - the exact fit is the exact row with the most training rows (the full fit); it is
      compared with the Nyström row of lowest error: "X% better" (or "worse") is
      ``|e_nystrom - e_exact| / e_nystrom``, the share of Nyström's error; within 0.5%
      they "score the same";
    - "still falls with N": on the last step of the exact rows (the largest subsample
      to the full fit) the error fell by more than :data:`GAIN_PER_DOUBLING` (2%) per
      doubling of the rows, ``1 - (e_last / e_prev) ** (1 / log2(n_last / n_prev))``
      (the step itself when the subsamples end at 1/2); else "has levelled off".
      Without two exact rows the sentence says nothing about N.
    """
    metrics = [r.get("metrics") or {} for r in rows]
    name = next((m for m in ("rmse", "mae", "r2") if metrics and all(m in x for x in metrics)),
                None)  # fmt: skip
    if name is None:
        return "nothing to compare: the rows share no metric"
    label = _LABELS[name]
    exact = sorted((r for r in rows if r["kind"] == "exact"), key=lambda r: r["n_train"])
    nys = [r for r in rows if r["kind"] == "nystrom"]
    parts = []
    if not exact:
        parts.append("no exact fit was scored")
    elif not nys:
        parts.append("no Nyström model was fitted (each M was at least the training rows)")
    else:
        e_x = _error(exact[-1]["metrics"], name)
        best = min(nys, key=lambda r: _error(r["metrics"], name))
        e_n = _error(best["metrics"], name)
        what = f"Nyström({best['n_centers']:,})"
        nums = f"in held-out {label} ({e_x:.4g} vs {e_n:.4g})"
        gap = (e_n - e_x) / e_n if e_n > 0 else 0.0
        if abs(gap) < 0.005 or (e_n <= 0 and e_x <= 0):
            parts.append(f"the exact fit and {what} score the same {nums}")
        elif e_n <= 0:
            parts.append(f"the exact fit is worse than {what} {nums}")
        else:
            word = "better" if gap > 0 else "worse"
            parts.append(f"the exact fit is {abs(gap):.0%} {word} than {what} {nums}")
    if len(exact) >= 2:
        prev, last = exact[-2], exact[-1]
        e0, e1 = _error(prev["metrics"], name), _error(last["metrics"], name)
        doublings = math.log2(last["n_train"] / prev["n_train"])
        per = 1.0 - (e1 / e0) ** (1.0 / doublings) if e0 > 0 and e1 >= 0 else 0.0
        if per > GAIN_PER_DOUBLING:
            parts.append("the error still falls with N, so more data would pay")
        else:
            parts.append("the error has levelled off with N, so more data would pay little")
    return "; ".join(parts)
