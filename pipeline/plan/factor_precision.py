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
:mod:`pipeline.linalg.spectrum`; its smallest is an upper bound on K's, so small
eigenvalues the subsample misses make the risk look smaller). float32 is chosen
when the risk is at most :data:`~pipeline.constants.FACTOR_FLOAT32_MAX_RISK`,
N is at least :data:`~pipeline.constants.FACTOR_FLOAT32_MIN_ROWS`, and X is in
memory (the refinement's products are matrix-free from it). Because the subsample
can miss, :func:`pipeline.fit.execute` falls back to float64 when an auto-chosen
float32 factor fails: never a wrong answer, at worst the float32 attempt's time.
"""

from __future__ import annotations

from collections.abc import Callable

import pipeline.constants as C

__all__ = ["choose_factor_dtype"]


def choose_factor_dtype(
    n: int, shift: float | None, *, risk: Callable[[float], float] | None = None
) -> tuple[str, str]:
    """``(factor_dtype, reason)`` for ``factor_dtype="auto"``.

    ``risk(shift)`` is the measured probe (:attr:`pipeline.engine.placement.Probes.float32_risk`,
    :func:`pipeline.linalg.spectrum.float32_factor_risk` on the rows); None when X is not
    in memory or the kernel is not known to be PSD."""
    if n < C.FACTOR_FLOAT32_MIN_ROWS:
        return "float64", (
            f"factor float64 (n_samples={n} < {C.FACTOR_FLOAT32_MIN_ROWS}: float32 saves little)"
        )
    if risk is None or shift is None or shift <= 0:
        return "float64", (
            "factor float64 (float32 needs X in memory and a positive shift, to refine "
            "with float64 products from X)"
        )
    risk_value = risk(shift)
    if risk_value > C.FACTOR_FLOAT32_MAX_RISK:
        return "float64", (
            f"factor float64 (float32 risk {risk_value:.2g} > {C.FACTOR_FLOAT32_MAX_RISK}: the "
            "shift is small against float32's rounding of K)"
        )
    return "float32", (
        f"factor float32, refined to float64 from X (risk {risk_value:.2g} <= "
        f"{C.FACTOR_FLOAT32_MAX_RISK})"
    )
