"""Power-of-two scaling for numbers at the edges of float64.

A sum of squares (``np.linalg.norm``, an inner product, a variance) overflows
for entries above about 1e154 and loses its digits to subnormal numbers below
about 1e-154: CG on a target of order 1e-200 saw ``‖y‖ = 0`` and stopped at
iteration 0 with alpha = 0. Multiplying by a power of two is exact in the normal
range, so a computation that is homogeneous in its input (CG's iterates, a mean
and a standard deviation) gives on ``2**k * v`` exactly the bits it gives on
``v``, times ``2**k``, wherever neither underflows nor overflows.

:func:`pow2_exponents` picks ``k`` per column: 0 while the column's largest
magnitude lies in ``[2**-SAFE_EXPONENT, 2**SAFE_EXPONENT)`` (ordinary data, left
exactly as it is), else the ``k`` that brings that magnitude into ``[0.5, 1)``.
Scale with ``np.ldexp(v, k)`` and undo with ``np.ldexp(w, -k)``: ``2.0**k`` itself
overflows for the subnormal magnitudes (``k`` up to 1074).
"""

from __future__ import annotations

import numpy as np

__all__ = ["SAFE_EXPONENT", "pow2_exponents"]

#: columns whose largest magnitude lies in [2**-SAFE_EXPONENT, 2**SAFE_EXPONENT)
#: (about 7.9e-31 to 1.3e30) are not scaled: their squares and sums of squares
#: over 1e10 rows stay far inside float64's normal range
SAFE_EXPONENT = 100


def pow2_exponents(amax: np.ndarray | float) -> np.ndarray:
    """Per column, the exponent ``k`` with ``2**k * amax`` in ``[0.5, 1)``, or 0 where
    ``amax`` (the column's largest magnitude) is zero, not finite or in the safe range.

    Returns an int64 array of ``amax``'s shape.
    """
    amax = np.asarray(amax, dtype=np.float64)
    _, e = np.frexp(amax)  # amax = f * 2**e, 0.5 <= f < 1
    far = np.isfinite(amax) & (amax > 0) & ((e > SAFE_EXPONENT) | (e <= -SAFE_EXPONENT))
    return np.where(far, -e, 0).astype(np.int64)
