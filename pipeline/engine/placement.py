"""Where a fit's tiles run, and the tile size that follows.

:class:`Resources` is what the caller measured (memory, disk, the client's
workers), :class:`Probes` what it may measure on the training rows;
:func:`tiles_on_workers` says on how many workers a solver's tiles run, by the rules of
:mod:`pipeline.engine.where` (:func:`~pipeline.engine.where.factor_threads_here`,
:func:`~pipeline.engine.where.gram_on_demand`) on the measured resources, so that
:func:`pipeline.plan.fit_plan.plan_fit` sizes the tile for them only when they do
(:func:`default_block_size`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pipeline.constants as C
from pipeline.engine.where import factor_threads_here, gram_on_demand

__all__ = [
    "Probes",
    "Resources",
    "dask_block_size",
    "default_block_size",
    "tiles_on_workers",
]


@dataclass(frozen=True)
class Resources:
    """What the fit may use, measured by the caller.

    Parameters
    ----------
    memory_bytes : float
        Memory available to the process.
    disk_bytes : float
        Free bytes where the store lives (``inf`` for object storage).
    in_memory : bool
        Whether an in-memory solver (``dense``, ``primal``) may be planned; False
        for ``krr run`` and for an estimator given a ``store``.
    workers : int
        Workers of the active distributed client that tiles are dealt to (1 without
        one). With no ``block_size`` chosen and the tiles running on ``workers >= 2``
        of them, the tile is sized by their count
        (:func:`dask_block_size`: the tile Cholesky's
        critical path, docs/SCALING.md).
    workers_here : bool
        Whether those workers all run on this machine; then ``factor_scheduler="auto"``
        factors on threads in this process (:func:`~pipeline.engine.where.auto_scheduler`)
        and CG's products too are not sized for them.
    gpu_memory_bytes : float, optional
        Free memory of the GPU the fit would run on (``device`` not ``"cpu"`` and a GPU
        usable); None on the CPU.
    gpu_name : str, optional
        That GPU's name; None on the CPU.
    gpu_compute_capability : tuple of int, optional
        Its compute capability ``(major, minor)``: a float64 fit on a part with a low
        float64 rate gets a warning in the plan's reason; None on the CPU.
    """

    memory_bytes: float
    disk_bytes: float
    in_memory: bool = True
    workers: int = 1
    workers_here: bool = False
    gpu_memory_bytes: float | None = None
    gpu_name: str | None = None
    gpu_compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class Probes:
    """What the plan may measure on the training rows, passed in by the caller: the plan
    imports no solver, and calls a probe only when its figure can change the plan.

    Built from the rows by :func:`pipeline.fit.row_probes`; ``Probes()`` (the default)
    is a plan without the rows.

    Parameters
    ----------
    x_in_memory : bool
        The rows are an in-memory array (not a Dask array or a store).
    residual : callable, optional
        ``residual(rank)``: ρ = ‖K - F Fᵀ‖₂ of the rank-``rank`` Nyström preconditioner,
        or None when the rows are too few to measure it
        (:func:`pipeline.linalg.spectrum.estimate_residual`).
    float32_risk : callable, optional
        ``float32_risk(shift)``: the float32 factor's risk
        (:func:`pipeline.linalg.spectrum.float32_factor_risk`); given only for rows in
        memory.
    """

    x_in_memory: bool = False
    residual: Callable[[int], float | None] | None = None
    float32_risk: Callable[[float], float] | None = None


def tiles_on_workers(
    solver: str,
    resources: Resources,
    *,
    factor_scheduler: str = "auto",
    keep_gram: bool = True,
    x_in_memory: bool = False,
) -> int:
    """How many workers the tiles of ``solver`` run on (1: in this process), for sizing
    the tile. A Cholesky factor runs on the client's workers under
    ``factor_scheduler="dask"``, never under ``"threads"``; under ``"auto"`` only when
    they run on other machines and the factor is not an in-place one that computes
    its Gram from X here (:func:`~pipeline.engine.where.factor_threads_here`, the rule
    :func:`pipeline.engine.where.factor_executor` applies). Other solvers' tiles go to the
    workers when they run on other machines."""
    w = int(resources.workers)
    if w < 2:
        return 1
    if solver == "cholesky":
        from_x = gram_on_demand(solver, keep_gram, x_in_memory, True)
        return 1 if factor_threads_here(factor_scheduler, resources.workers_here, from_x) else w
    return 1 if resources.workers_here and C.FACTOR_THREADS_ON_THIS_HOST else w


def default_block_size(n: int, workers: int) -> int:
    """The tile edge when none is chosen: by worker count on a cluster, else the default."""
    if workers >= 2:
        return dask_block_size(n, workers)
    return min(C.DEFAULT_BLOCK_SIZE, max(1, n))


def dask_block_size(
    n: int,
    workers: int,
    *,
    path_factor: float | None = None,
    min_block: int | None = None,
    max_block: int | None = None,
    step: int = 256,
) -> int:
    """Tile edge for the Dask tile Cholesky of order ``n`` on ``workers`` workers.

    The left-looking graph's critical path (the diagonal and first sub-diagonal task
    of every column, one after the other) costs about ``1.5 n^2 b`` flops and the
    whole factor ``n^3 / 3``, so with tiles of ``b`` only about ``n / (4.5 b)``
    workers can ever be busy. The policy takes ``b = n / (6 P)``, a path of 3/4 of
    one worker's share of the work (``CHOL_DASK_PATH_FACTOR``): smaller tiles shorten
    the path further but read more (each ``2 b^3`` GEMM reads up to two
    ``8 b^2``-byte tiles) and cost Dask more tasks. In the scaling model
    (``docs/SCALING.md``) this tile is within 3 % of the best one at N = 100k to 1M
    on 8 to 128 workers. Rounded down to a multiple of ``step``, kept
    within ``[min_block, max_block]`` (constants ``CHOL_DASK_MIN_BLOCK``,
    ``CHOL_DASK_MAX_BLOCK``) and at most ``n``. One worker (or none): the plan's
    default, :data:`~pipeline.constants.DEFAULT_BLOCK_SIZE`. A pure
    function; the block size changes the Gram's tiling and so its fingerprint,
    never the factor's correctness.

    >>> dask_block_size(1_000_000, 8), dask_block_size(1_000_000, 128)
    (4096, 1280)
    """
    k = C.CHOL_DASK_PATH_FACTOR if path_factor is None else float(path_factor)
    lo = C.CHOL_DASK_MIN_BLOCK if min_block is None else int(min_block)
    hi = C.CHOL_DASK_MAX_BLOCK if max_block is None else int(max_block)
    if int(n) < 1 or int(workers) < 0:
        raise ValueError(
            f"dask_block_size needs n >= 1 and workers >= 0, got n={n}, workers={workers}"
        )
    if not (k > 0 and 1 <= lo <= hi and step >= 1):
        raise ValueError(
            f"dask_block_size needs path_factor > 0, step >= 1 and 1 <= min_block <= "
            f"max_block, got path_factor={k}, min_block={lo}, max_block={hi}, step={step}"
        )
    if int(workers) <= 1:
        return min(int(C.DEFAULT_BLOCK_SIZE), int(n))
    b = int(int(n) / (k * int(workers)) // step) * step
    return int(min(max(lo, min(b, hi)), int(n)))
