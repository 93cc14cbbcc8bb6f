"""Exact in-memory reference solvers: the ground truth every later solver is tested against.

- :func:`solve_dual`: Cholesky solve of (K + lam I) a = y (jitter policy, OpenBLAS-safe threads).
- :func:`solve_primal`: (Phi^T Phi + lam I) w = Phi^T y for the linear kernel / explicit features.
- :func:`check_dense_memory`: refuse (``InsufficientMemoryError``) above the available memory.

The choice between them (n² D + n³/3 against n D² + D³/3) is the fit plan's
(:func:`pipeline.policy.plan.in_memory_choice`), and the one-call reference fit,
:func:`pipeline.fit.fit_reference`, runs that plan: both sit above these solvers.
"""

from pipeline.reference.dual import (
    ALPHA_CONVENTIONS,
    POTRF_THREADED_MAX_N,
    SingularKernelWarning,
    effective_alpha,
    predict_dual,
    solve_dual,
)
from pipeline.reference.memory import (
    InsufficientMemoryError,
    available_memory,
    check_dense_memory,
    dense_dual_bytes,
    primal_bytes,
)
from pipeline.reference.primal import primal_to_dual, solve_primal

__all__ = [
    "ALPHA_CONVENTIONS",
    "POTRF_THREADED_MAX_N",
    "InsufficientMemoryError",
    "SingularKernelWarning",
    "available_memory",
    "check_dense_memory",
    "dense_dual_bytes",
    "effective_alpha",
    "predict_dual",
    "primal_bytes",
    "primal_to_dual",
    "solve_dual",
    "solve_primal",
]
