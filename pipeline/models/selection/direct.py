"""Exact fold solves for the settings an iterative CV solve could not finish.

A search never scores a solve that did not reach its tolerance (NaN in the
products, divergence, stagnation, ``max_iter``): the CG strategies hand those
(λ, fold) systems here, where each is solved by a Cholesky of the fold's
training Gram ``K_TT + s I`` (in memory, checked against the available memory
first), or, when that does not fit, by the out-of-core route the caller
provides (a tile Cholesky of the stored Gram). When neither is possible the
search fails with an error naming the setting, never with a silent score.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.linalg

from pipeline.errors import SolveNotConverged
from pipeline.linalg.dense_dual import cho_factor
from pipeline.linalg.dense_memory import InsufficientMemoryError, check_dense_memory

#: the old name of :class:`pipeline.errors.SolveNotConverged` (a CV solve that did not converge)
UnconvergedSolveError = SolveNotConverged

__all__ = ["UnconvergedSolveError", "direct_fold_predictions", "record_redo"]

log = logging.getLogger("pipeline.models.selection")


def _dense_fold(Ktt: np.ndarray, Kvt: np.ndarray, y: np.ndarray, shift: float) -> np.ndarray:
    Ktt[np.diag_indices_from(Ktt)] += shift
    c = cho_factor(Ktt, overwrite_a=True)
    return Kvt @ scipy.linalg.cho_solve(c, y, check_finite=False)


def direct_fold_predictions(
    block: Callable[[np.ndarray, np.ndarray], np.ndarray],
    y: np.ndarray,
    trains: Sequence[np.ndarray],
    tests: Sequence[np.ndarray],
    todo: Sequence[tuple[int, int, float]],
    *,
    out_of_core: Callable[[list[tuple[int, int, float]]], dict] | None = None,
    available: int | None = None,
    what: str = "",
) -> dict[tuple[int, int], np.ndarray]:
    """Exact held-out predictions of the (λ index, fold, shift) systems in ``todo``.

    Parameters
    ----------
    block : callable
        ``block(rows, cols) -> K[rows][:, cols]`` (float64).
    y : ndarray (n, t)
    trains, tests : index arrays per fold
    todo : list of (li, f, shift)
    out_of_core : callable, optional
        ``out_of_core(todo) -> {(li, f): predictions}`` for systems whose fold Gram does
        not fit in memory (e.g. a tile Cholesky of a stored Gram).
    available : int, optional
        Bytes of memory to plan with (default: measured).
    what : str
        The setting, for messages.

    Returns
    -------
    dict of (li, f) -> ndarray (n_test, t)

    Raises
    ------
    UnconvergedSolveError
        A system fits neither in memory nor out of core.
    """

    out: dict[tuple[int, int], np.ndarray] = {}
    too_big: list[tuple[int, int, float]] = []
    by_fold: dict[int, list[tuple[int, float]]] = {}
    for li, f, s in todo:
        by_fold.setdefault(int(f), []).append((int(li), float(s)))
    for f, items in sorted(by_fold.items()):
        tr, te = trains[f], tests[f]
        m = len(tr)
        try:
            check_dense_memory(
                2 * m * m * 8 + len(te) * m * 8,
                what=f"the exact redo of fold {f} ({m} rows)",
                available=available,
            )
        except InsufficientMemoryError:
            too_big.extend((li, f, s) for li, s in items)
            continue
        K_tt = block(tr, tr)
        K_vt = block(te, tr)
        for li, s in items:
            out[(li, f)] = _dense_fold(K_tt.copy(), K_vt, y[tr], s)
        del K_tt, K_vt
    if too_big:
        if out_of_core is None:
            raise UnconvergedSolveError(
                f"{what}: {len(too_big)} CV solve(s) (lambda index, fold, shift) "
                f"{too_big[:3]} did not reach the CG tolerance, and their exact redo needs "
                "the fold's training Gram in memory, which does not fit; give the search a "
                "store= (the redo then runs the out-of-core Cholesky), raise the smallest "
                "lambda, or use solver='cholesky'"
            )
        out.update(out_of_core(too_big))
    return out


def record_redo(
    stats: dict[str, Any], setting: Any, failures: list[dict[str, Any]], how: str
) -> None:
    """Count the redone solves in ``stats`` (``unconverged_settings``, ``redone_direct``)."""
    if not failures:
        return
    stats.setdefault("unconverged_settings", []).append(
        {"setting": setting, "solves": failures, "redone_by": how}
    )
    stats["redone_direct"] = stats.get("redone_direct", 0) + len(failures)
    log.warning(
        "%d CV solve(s) of setting %s did not reach the CG tolerance (%s); redone exactly (%s)",
        len(failures),
        setting,
        ", ".join(sorted({str(x.get("reason")) for x in failures})),
        how,
    )
