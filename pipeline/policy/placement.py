"""Where a fit's tiles run, and the tile size that follows.

:class:`Resources` is what the caller measured (memory, disk, the client's
workers); :func:`gram_on_demand` is the one rule for an in-place factor that
computes its Gram from X in this process; :func:`tiles_on_workers` says on how many
workers a solver's tiles run, so that :func:`pipeline.policy.plan.plan_fit` sizes
the tile for them only when they do (:func:`default_block_size`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.policy import constants as C
from pipeline.solvers.cholesky_exec import dask_block_size

__all__ = ["Resources", "default_block_size", "gram_on_demand", "tiles_on_workers"]


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
        (:func:`pipeline.solvers.cholesky_exec.dask_block_size`: the tile Cholesky's
        critical path, docs/SCALING.md).
    workers_here : bool
        Whether those workers all run on this machine; then ``factor_scheduler="auto"``
        factors on threads in this process (:func:`~pipeline.solvers.cholesky_exec.auto_scheduler`)
        and CG's products too are not sized for them.
    """

    memory_bytes: float
    disk_bytes: float
    in_memory: bool = True
    workers: int = 1
    workers_here: bool = False


def gram_on_demand(solver: str, keep_gram: bool, x_in_memory: bool, factor_runs_here: bool) -> bool:
    """Whether the Gram is not stored first (``build_gram(defer=True)``): an in-place
    Cholesky (``keep_gram=False``) whose factor runs in this process, with X in memory,
    computes each Gram tile from X when it needs it (``GRAM_ON_DEMAND_IN_PLACE``). The
    one rule ``fit.execute`` and ``krr run``'s gram stage both apply."""
    return bool(
        C.GRAM_ON_DEMAND_IN_PLACE
        and solver == "cholesky"
        and not keep_gram
        and x_in_memory
        and factor_runs_here
    )


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
    its Gram from X here (:func:`gram_on_demand`, the rule
    :func:`pipeline.fit.factor_executor` applies). Other solvers' tiles go to the
    workers when they run on other machines."""
    w = int(resources.workers)
    if w < 2:
        return 1
    here = resources.workers_here and C.FACTOR_THREADS_ON_THIS_HOST
    if solver == "cholesky":
        if factor_scheduler == "dask":
            return w
        if factor_scheduler != "auto" or here:
            return 1
        return 1 if gram_on_demand(solver, keep_gram, x_in_memory, True) else w
    return 1 if here else w


def default_block_size(n: int, workers: int) -> int:
    """The tile edge when none is chosen: by worker count on a cluster, else the default."""
    if workers >= 2:
        return dask_block_size(n, workers)
    return min(C.DEFAULT_BLOCK_SIZE, max(1, n))
