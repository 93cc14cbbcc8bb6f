"""``factor_dtype="auto"``: factor in float32 and refine, when that is safe and pays.

A float32 tile Cholesky (float64 POTRF on the diagonal tiles) runs 1.8-1.9x faster
than the float64 one on this hardware, and refinement with float64 products from X
turns its solution into the float64 answer in a few CG steps. It fails in two ways
when the shift is small against float32's rounding of K: the factor loses positive
definiteness, or the refinement needs so many steps that float64 would have been
faster. Both depend on the data's spectrum, not on λ alone (at λ = 1e-5, 10,000
diamonds rows fail and 10,000 Gaussian rows refine in 8 iterations).

The rule measures the *risk* ``ε₃₂ · λmax(K) / (λmin(K_m) + μ)`` on a seeded
subsample of m rows (its largest eigenvalue scaled by N/m estimates K's, as in
:mod:`pipeline.policy.spectrum`; its smallest is an upper bound on K's, so small
eigenvalues the subsample misses make the risk look smaller). float32 is chosen
when the risk is at most :data:`~pipeline.policy.constants.FACTOR_FLOAT32_MAX_RISK`,
N is at least :data:`~pipeline.policy.constants.FACTOR_FLOAT32_MIN_ROWS`, and X is in
memory (the refinement's products are matrix-free from it). Because the subsample
can miss, :func:`pipeline.fit.execute` falls back to float64 when an auto-chosen
float32 factor fails: never a wrong answer, at worst the float32 attempt's time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.policy import constants as C
from pipeline.policy.spectrum import subsample_rows

__all__ = ["choose_factor_dtype", "float32_factor_risk"]

EPS32 = float(np.finfo(np.float32).eps)


def float32_factor_risk(
    X: np.ndarray, kernel: Any, shift: float, *, random_state: int = C.DEFAULT_RANDOM_STATE
) -> float:
    """``ε₃₂ · λmax(K) / (λmin(K_m) + shift)`` from a seeded subsample of ``X``'s rows."""

    n = int(X.shape[0])
    m = int(min(n, C.FACTOR_FLOAT32_SAMPLE_ROWS))
    ev = np.linalg.eigvalsh(
        np.asarray(kernel(subsample_rows(X, m, np.random.default_rng(random_state))))
    )
    lmax = float(ev[-1]) * n / m
    return EPS32 * lmax / (max(float(ev[0]), 0.0) + float(shift))


def choose_factor_dtype(
    n: int, shift: float | None, *, X: Any = None, kernel: Any = None
) -> tuple[str, str]:
    """``(factor_dtype, reason)`` for ``factor_dtype="auto"``."""
    if n < C.FACTOR_FLOAT32_MIN_ROWS:
        return "float64", (
            f"factor float64 (n_samples={n} < {C.FACTOR_FLOAT32_MIN_ROWS}: float32 saves little)"
        )
    if not isinstance(X, np.ndarray) or kernel is None or shift is None or shift <= 0:
        return "float64", (
            "factor float64 (float32 needs X in memory and a positive shift, to refine "
            "with float64 products from X)"
        )
    risk = float32_factor_risk(X, kernel, shift)
    if risk > C.FACTOR_FLOAT32_MAX_RISK:
        return "float64", (
            f"factor float64 (float32 risk {risk:.2g} > {C.FACTOR_FLOAT32_MAX_RISK}: the "
            "shift is small against float32's rounding of K)"
        )
    return "float32", (
        f"factor float32, refined to float64 from X (risk {risk:.2g} <= "
        f"{C.FACTOR_FLOAT32_MAX_RISK})"
    )
