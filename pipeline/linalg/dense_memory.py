"""Memory guard for the in-memory reference path.

The dense dual solve holds the N x N kernel matrix in float64 (factorised in
place), plus one more N x N copy when the caller's matrix must be preserved
(a precomputed kernel, float32 input). The primal solve holds a D x D matrix.
Before any work, :func:`check_dense_memory` compares that estimate with the
memory available to this process and refuses with
:class:`InsufficientMemoryError` (a ``MemoryError``) that points to the
out-of-core solvers.
"""

from __future__ import annotations

from pathlib import Path

import psutil

import pipeline.constants as C
from pipeline.errors import InsufficientMemoryError

GiB = 1024**3

#: fraction of the available memory the in-memory path may plan to use
SAFETY_FRACTION = 0.85


def _cgroup_available() -> int | None:
    """Bytes left under a cgroup v2 / v1 memory limit, if one is set."""
    for limit_f, usage_f in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            raw = Path(limit_f).read_text().strip()
            if raw == "max":
                return None
            limit = int(raw)
            if limit >= 1 << 60:  # cgroup v1 "unlimited"
                return None
            return max(limit - int(Path(usage_f).read_text().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


def available_memory() -> int:
    """Bytes this process can still allocate: min(system available, cgroup headroom)."""
    avail = int(psutil.virtual_memory().available)
    cg = _cgroup_available()
    return avail if cg is None else min(avail, cg)


def dense_dual_bytes(
    n_samples: int, n_features: int, n_targets: int = 1, *, kernel_copies: int = 1
) -> int:
    """Peak bytes of the in-memory dual fit: ``kernel_copies`` float64 N x N matrices
    plus the data, targets and dual coefficients (float64), and, from the order at which
    the factor is blocked (:data:`~pipeline.constants.ONE_BLAS_THREAD_FROM`), the tiles
    the driver holds besides the matrix (:data:`~pipeline.constants.DENSE_POTRF_TILES_HELD`,
    the one it updates among them) and one for its temporaries (the GEMM updates the tile
    in place; a TRSM's output lies beside the tile it solves): HELD + 1 tiles of
    ``DENSE_POTRF_TILE``."""
    n = int(n_samples)
    tiles = 0
    if n >= C.ONE_BLAS_THREAD_FROM:
        edge = min(C.DENSE_POTRF_TILE, n)
        tiles = (C.DENSE_POTRF_TILES_HELD + 1) * edge * edge
    return 8 * (kernel_copies * n * n + tiles + n * int(n_features) + 3 * n * int(n_targets))


def primal_bytes(n_samples: int, n_features: int, n_targets: int = 1) -> int:
    """Peak bytes of the in-memory primal fit: two D x D matrices plus a weighted copy of X."""
    d = int(n_features)
    return 8 * (2 * d * d + 2 * int(n_samples) * d + 3 * int(n_samples) * int(n_targets))


def check_dense_memory(
    needed_bytes: int,
    *,
    what: str,
    available: int | None = None,
    fraction: float = SAFETY_FRACTION,
) -> None:
    """Raise :class:`InsufficientMemoryError` if ``needed_bytes`` will not fit.

    Parameters
    ----------
    needed_bytes : int
        Estimate from :func:`dense_dual_bytes` or :func:`primal_bytes`.
    what : str
        Description for the message, e.g. ``"the dense dual solve with N=40000"``.
    available : int, optional
        Override the measured available memory (bytes), e.g. in tests.
    fraction : float
        Plan to use at most this fraction of the available memory.
    """
    avail = available_memory() if available is None else int(available)
    budget = int(avail * fraction)
    if needed_bytes > budget:
        raise InsufficientMemoryError(
            f"{what} needs about {needed_bytes / GiB:.2f} GiB in memory but only "
            f"{avail / GiB:.2f} GiB is available ({fraction:.0%} usable); "
            "use an out-of-core solver instead: KernelRidge(solver='cholesky', store=...) "
            "for the exact tiled Cholesky, or solver='cg' for preconditioned conjugate "
            "gradients, both with the Gram matrix tiled on disk"
        )
