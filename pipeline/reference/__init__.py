"""Exact in-memory reference solvers: the ground truth every later solver is tested against.

- :func:`solve_dual`: Cholesky solve of (K + lam I) a = y (jitter policy, OpenBLAS-safe threads).
- :func:`solve_primal`: (Phi^T Phi + lam I) w = Phi^T y for the linear kernel / explicit features.
- :func:`choose_solver`: the cost model n^2 D + n^3/3 against n D^2 + D^3/3.
- :func:`fit_reference`: one call, returns a :class:`ReferenceModel` with ``predict``.
- :func:`check_dense_memory`: refuse (``InsufficientMemoryError``) above the available memory.
"""

from pipeline.reference.auto import (
    ReferenceModel,
    choose_solver,
    dual_flops,
    fit_reference,
    primal_flops,
)
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
    "ReferenceModel",
    "SingularKernelWarning",
    "available_memory",
    "check_dense_memory",
    "choose_solver",
    "dense_dual_bytes",
    "dual_flops",
    "effective_alpha",
    "fit_reference",
    "predict_dual",
    "primal_bytes",
    "primal_flops",
    "primal_to_dual",
    "solve_dual",
    "solve_primal",
]
