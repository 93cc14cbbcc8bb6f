"""``K + shift·I`` for an in-memory K, with the kernel-operator interface.

The interface is that of :mod:`pipeline.linalg.matvec` (``matvec``, ``diagonal``,
``columns``, ``submatrix``), so :func:`pipeline.linalg.precond.build_nystrom` and CG run
on a small dense Gram unchanged: the policy's preconditioner estimate on a subsample
(:mod:`pipeline.linalg.spectrum`) and the in-memory CV strategies use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DenseKernelOperator"]


class DenseKernelOperator:
    """``K + shift·I`` for an in-memory K, with the operator interface of
    :mod:`pipeline.linalg.matvec` (``matvec``, ``diagonal``, ``columns``, ``submatrix``)."""

    def __init__(self, K: np.ndarray, shift: float = 1.0) -> None:
        self.K, self.shift, self.n = K, float(shift), int(K.shape[0])

    def matvec(self, V: np.ndarray) -> np.ndarray:
        return self.K @ V + self.shift * V

    def diagonal(self) -> np.ndarray:
        return np.diag(self.K).copy()

    def columns(self, idx: Any) -> np.ndarray:
        return self.K[:, np.asarray(idx)]

    def submatrix(self, idx: Any) -> np.ndarray:
        idx = np.asarray(idx)
        return self.K[np.ix_(idx, idx)]
