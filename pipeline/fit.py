"""Run one :class:`~pipeline.plan.fit_plan.FitPlan`: the one place a kernel ridge fit is wired.

``KernelRidge.fit`` (through :func:`fit_out_of_core`, below), the solve stage of
``krr run``, ``KernelRidgeCV``'s refit and the tests' reference
(:func:`fit_reference`, the in-memory ground truth) plan with
:func:`pipeline.plan.fit_plan.plan_fit`, log the plan with :func:`log_plan`, and run
it with :func:`execute`. Layering: this module sits above the solvers (gram,
tile Cholesky, CG, reference dense/primal solves) and below the estimators and
stages.

The estimator's out-of-core fit is here too (it was ``pipeline.out_of_core``, a layer
of its own between this module and the estimator): :func:`fit_out_of_core` plans (or
takes the estimator's plan) and runs :func:`execute` in a store directory, one per fit
(:func:`fit_store_path`), locked while it runs; :func:`weighted_problem` turns sample
weights into an unweighted problem. Its log lines keep the logger name
``pipeline.out_of_core`` (:data:`ooc_log`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import dask
import numpy as np
import scipy.sparse as sp

import pipeline.constants as C
from pipeline.engine import device as dev
from pipeline.engine.backend import Backend, cuda_available, get_backend
from pipeline.engine.dense import check_finite_kernel, kernel_matrix
from pipeline.engine.progress import cg_progress
from pipeline.engine.where import active_client, cluster_workers, factor_executor, gram_on_demand
from pipeline.errors import (
    CGStagnationError,
    IndefiniteKernelError,
    LockHeldError,
    NonFiniteKernelError,
    NotPositiveDefiniteError,
)
from pipeline.kernels import FunctionScaled, Kernel, Linear, Warped, make_kernel
from pipeline.kernels.warping import Coordinate, SelectFeatures
from pipeline.linalg import cholesky_device as cd
from pipeline.linalg import dense_memory as memory
from pipeline.linalg import matvec as matvec_ops
from pipeline.linalg import spectrum
from pipeline.linalg.cg import CGConvergenceError, conjugate_gradient
from pipeline.linalg.cg_checkpoint import resumable_cg
from pipeline.linalg.cg_mixed_fit import mixed_cg_fit
from pipeline.linalg.cholesky import regularisation_shift, tile_cholesky
from pipeline.linalg.cholesky_inplace import GramTileRecomputer
from pipeline.linalg.dense_dual import effective_alpha, solve_dual
from pipeline.linalg.dense_memory import check_dense_memory, dense_dual_bytes, primal_bytes
from pipeline.linalg.dense_primal import primal_to_dual, solve_primal
from pipeline.linalg.gram import build_gram
from pipeline.linalg.matvec import make_operator
from pipeline.linalg.nystrom_solve import nystrom_solve
from pipeline.linalg.precond import make_preconditioner
from pipeline.linalg.triangular import cholesky_solve
from pipeline.options import ALPHA_CONVENTIONS, solver_choices, solver_convention
from pipeline.plan.cg_cost import nystrom_method
from pipeline.plan.fit_plan import FitPlan, Probes, Resources, plan_fit
from pipeline.storage import fingerprint_blocks, fingerprint_obj
from pipeline.storage.arrays import normalize_store
from pipeline.storage.lease import LeaseLock
from pipeline.storage.tempfiles import make_temp_store
from pipeline.storage.waits import cap_store_waits

__all__ = [
    "FitResult",
    "OutOfCoreFit",
    "device_backend",
    "execute",
    "fit_nystrom",
    "fit_out_of_core",
    "fit_reference",
    "fit_store_path",
    "log_plan",
    "measure_resources",
    "plan_fit",
    "row_probes",
    "solver_convention",
    "weighted_problem",
]

log = logging.getLogger("pipeline.fit")


@dataclass
class FitResult:
    """What :func:`execute` produced: the one fit-result type (also what
    :func:`fit_out_of_core` returns, as ``OutOfCoreFit``). The solvers' own results
    (``CGResult``, ``MixedCGResult``, ``BlockCGResult``) are what one solve returned;
    this is what one fit returned.

    Attributes
    ----------
    dual_coef : ndarray of shape (n,) or (n, outputs)
    solver : str
        The plan's solver.
    n_iter : int
        1 for the direct solvers, CG iterations otherwise.
    shift : float
        The diagonal shift added to K (out of core; NaN in memory).
    info : dict
        Solver details (JSON-able).
    plan : FitPlan
    factor, cg : objects, optional
        The Cholesky factor or the CG result, for callers that report more.
    primal_coef : ndarray, optional
        The primal weights of ``solver="primal"``.
    X_fit : ndarray, optional
        The rows ``dual_coef`` belongs to when they are not the training rows: the
        centres of ``solver="nystrom"`` (their row indices are ``info["centres"]``).
    """

    dual_coef: np.ndarray
    solver: str
    n_iter: int
    shift: float
    plan: FitPlan
    info: dict[str, Any] = field(default_factory=dict)
    factor: Any = None
    cg: Any = None
    primal_coef: np.ndarray | None = None
    X_fit: np.ndarray | None = None


def _disk_free(store: Any) -> float:
    if store is None or "://" in str(store):
        return float("inf")
    import os

    path = os.fspath(store)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        return float(shutil.disk_usage(path or ".").free)
    except OSError:
        return float("inf")


def measure_resources(
    store: Any = None, *, in_memory: bool = True, device: str = "cpu"
) -> Resources:
    """Measure free memory and the free disk where ``store`` lives; with ``device`` not
    ``"cpu"`` and a usable GPU, its free memory, name and compute capability too.

    Measured once per fit, before it writes anything: ``krr run`` records its plan
    (``RUN_DIR/plan.json``) and reads it back rather than measuring again after the
    Gram took its share of the disk.
    """
    # the plan sizes the tile by this count only where its tiles run on the workers
    # (:func:`~pipeline.plan.fit_plan.tiles_on_workers`)
    workers, workers_here = cluster_workers()
    return Resources(
        memory_bytes=float(memory.available_memory()),
        disk_bytes=_disk_free(store),
        in_memory=in_memory,
        workers=workers,
        workers_here=workers_here,
        **(_gpu_resources() if device != "cpu" else {}),
    )


def _gpu_resources() -> dict[str, Any]:
    """The current GPU's free memory, name and compute capability (Resources' fields),
    or nothing when no GPU is usable (the plan then refuses ``device="cuda"``)."""
    ok, _ = cuda_available()
    if not ok:
        return {}
    import cupy

    free, _total = get_backend("cupy").memory()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    name = props["name"]
    return {
        "gpu_memory_bytes": float(free),
        "gpu_name": name.decode() if isinstance(name, bytes) else str(name),
        "gpu_compute_capability": (int(props["major"]), int(props["minor"])),
    }


def device_backend(plan: FitPlan) -> Backend | None:
    """The :class:`~pipeline.engine.backend.Backend` a plan's arithmetic runs on: CuPy's
    for ``plan.device == "cuda"``, None on the CPU (the CPU paths, unchanged)."""
    return get_backend("cupy") if plan.device == "cuda" else None


def row_probes(X: Any, kernel: Any) -> Probes:
    """The plan's probes of the training rows ``X`` as ``kernel`` sees them
    (:class:`~pipeline.engine.placement.Probes`): the preconditioner's residual on a
    seeded subsample (any array, a Dask one is only indexed and read) and, for rows in
    memory, the float32 factor's risk. Nothing is measured here: the plan calls a probe
    only when its figure can change the plan. ``X`` None gives ``Probes()``."""
    if X is None:
        return Probes()
    in_memory = isinstance(X, np.ndarray)
    if kernel is None:
        return Probes(x_in_memory=in_memory)

    def residual(rank: int) -> float | None:
        return spectrum.estimate_residual(X, kernel, rank)

    def float32_risk(shift: float) -> float:
        return spectrum.float32_factor_risk(X, kernel, shift)

    return Probes(in_memory, residual, float32_risk if in_memory else None)


def log_plan(plan: FitPlan, reason: str, *, origin: str, logger: logging.Logger = log) -> None:
    """Log the plan the same way whatever called it (``krr run`` or an estimator)."""
    logger.info(
        "fit plan (%s): %s; chose %r because %s", origin, plan.describe(), plan.solver, reason
    )


def _x_fingerprint(X: Any) -> str | None:
    if not isinstance(X, np.ndarray):
        return None

    return fingerprint_blocks([X])


def execute(plan: FitPlan, X: Any, y: np.ndarray, kernel: Any, **options: Any) -> FitResult:
    """Run ``plan`` on ``X, y`` (the options as :func:`_execute` takes them).

    A float32 factor that ``factor_dtype="auto"`` chose (``plan.factor_dtype_auto``)
    and that fails (not positive definite in float32, or its refinement stops short)
    is redone in float64, with a warning in the log and ``info["factor_dtype_fallback"]``
    naming the failure: "auto" can cost the float32 attempt's time, never the answer.
    In place, the float32 Gram (which held the failed factor) is rebuilt in float64.

    A new fit lifts the cap an earlier interrupt put on the store's waits
    (:func:`~pipeline.storage.waits.cap_store_waits`), as a new run does: the next fit in
    a notebook where Ctrl-C stopped one has the store's own waits.
    """
    cap_store_waits(None)
    with gpu_tasks(plan):
        return _execute_plan(plan, X, y, kernel, **options)


#: the Dask resource a GPU fit's tasks ask for (a worker started with
#: ``--resources GPU=1`` holds it)
GPU_RESOURCE = "GPU"


def _workers_have_gpus() -> bool:
    """Whether the active distributed client has a worker that declares the resource
    :data:`GPU_RESOURCE` (without one, tasks asking for it would wait for ever)."""
    client = active_client()
    if client is None:
        return False
    try:
        workers = client.scheduler_info()["workers"]
    except Exception:  # noqa: BLE001 - no scheduler info (a closing client): no GPU known
        return False
    return any((w.get("resources") or {}).get(GPU_RESOURCE) for w in workers.values())


def gpu_tasks(plan: FitPlan) -> contextlib.AbstractContextManager:
    """The context a fit of ``plan`` runs in: on a GPU (``plan.device == "cuda"``) with
    a distributed client whose workers declare GPUs, the Dask tasks it builds carry
    ``resources={"GPU": 1}`` (``dask.annotate``), so the scheduler places them on those
    workers, one per GPU at a time; otherwise nothing changes (a CPU fit's graphs keep
    their annotations, and a cluster without GPU workers is never asked for one)."""
    if plan.device != "cuda" or not _workers_have_gpus():
        return contextlib.nullcontext()
    return dask.annotate(resources={GPU_RESOURCE: 1})


def _execute_plan(plan: FitPlan, X: Any, y: np.ndarray, kernel: Any, **options: Any) -> FitResult:
    """:func:`execute`'s body (see there)."""
    if not (
        plan.solver == "cholesky"
        and plan.factor_dtype_auto
        and np.dtype(plan.factor_dtype) == np.float32
    ):
        return _execute(plan, X, y, kernel, **options)
    from dataclasses import replace

    try:
        return _execute(plan, X, y, kernel, **options)
    except (NotPositiveDefiniteError, CGConvergenceError, NonFiniteKernelError) as err:
        # (a kernel value beyond float32's range, too: float64 may hold it)
        log.warning(
            "the float32 factor that factor_dtype='auto' chose failed (%s); factoring in "
            "float64 instead",
            err,
        )
        if not plan.options.keep_gram:  # its tiles hold the failed float32 factor now
            options = {**options, "gram": None, "recompute_tile": None, "_rebuild_gram": True}
        res = _execute(replace(plan, factor_dtype="float64"), X, y, kernel, **options)
        res.info["factor_dtype_fallback"] = f"{type(err).__name__}: {err}"
        return res


def _execute(
    plan: FitPlan,
    X: Any,
    y: np.ndarray,
    kernel: Any,
    *,
    gram: Any = None,
    root: str | None = None,
    factor_store: str | None = None,
    factor_name: str = "chol",
    cg_dir: str | None = None,
    cg_adopt: tuple[str, ...] = (),
    x_fingerprint: str | None = None,
    progress: bool = False,
    alpha: Any = None,
    sample_weight: Any = None,
    K: Any = None,
    overwrite_k: bool | None = None,
    jitter: Any = None,
    recompute_tile: Any = None,
    _rebuild_gram: bool = False,
) -> FitResult:
    """Run ``plan`` on ``X, y``.

    Parameters
    ----------
    plan : FitPlan
    X : ndarray or dask array of shape (n, d)
        Training inputs (validated, finite).
    y : ndarray of shape (n,) or (n, outputs)
    kernel : Kernel, spec dict or None
    gram : TiledArray, optional
        A stored Gram to use (Cholesky, stored-matvec CG); built in ``root`` if needed and None.
    root : str, optional
        Store of the Gram, the factor (unless ``factor_store``) and the CG checkpoints
        (unless ``cg_dir``).
    factor_store, factor_name : optional
        Where the Cholesky factor goes.
    cg_dir : str, optional
        CG checkpoint directory; without it and ``root``, CG runs without checkpoints.
    cg_adopt : tuple of str
        Other CG checkpoint directories (read only): the same solve's latest state
        there is resumed when ``cg_dir`` holds none (:func:`resumable_cg`).
    alpha, sample_weight, K, overwrite_k, jitter : optional
        In memory only: the raw (possibly per-target) alpha, sample weights, a
        precomputed kernel matrix (``kernel(X)`` when None), whether the solve may
        overwrite it (default: only when computed here), and the dense solve's jitter.
    recompute_tile : callable (i, j) -> ndarray, optional
        With ``plan.options.keep_gram`` False: rebuilds a Gram tile that an earlier in-place
        factor replaced (default: a :class:`~pipeline.linalg.cholesky_inplace.GramTileRecomputer`
        of ``X`` and ``kernel`` when ``X`` is an in-memory array).
    """
    if plan.solver in ("dense", "primal"):
        return _execute_in_memory(plan, X, y, kernel, alpha, sample_weight, K, overwrite_k, jitter)
    if plan.solver == "nystrom":
        return _execute_nystrom(plan, X, y, kernel, sample_weight, cg_dir or root, progress)

    if np.dtype(getattr(X, "dtype", np.float64)) == np.float32:
        # float32 rows are the user's values, not a precision for the solve: the Gram is
        # evaluated in float64 from them, as CG's products are (a float32 Gram fails a
        # small lambda or solves a rounded K); their fingerprint is the float64 one
        X, x_fingerprint = X.astype(np.float64), None
    n = int(y.shape[0])
    conv = solver_convention(plan.alpha_convention)
    shift = regularisation_shift(plan.alpha, n, conv)
    bs = int(plan.block_size)
    be = device_backend(plan)
    chol_jitter = True if plan.options.jitter else None
    if be is not None and plan.solver == "cholesky":
        if plan.store is None and isinstance(X, np.ndarray) and gram is None:
            # X in memory and no store of the user's: the factor in device memory, in
            # place, each Gram tile computed there; no Gram, no tile written
            res = _execute_dense_device(plan, X, y, kernel, plan.alpha, None, be, chol_jitter)
            return replace(res, solver="cholesky", shift=float(shift))
        # with a store: the one tile column the device must hold, before any work
        cd.check_device_memory(be, n, bs, plan.factor_dtype)
    # a float32 factor's alpha must be refined to double precision: against the kept
    # Gram, or with matrix-free products from X in memory. In place with neither,
    # it would be single precision: refused before any work, never returned
    mf = isinstance(X, np.ndarray) and kernel is not None
    if (
        plan.solver == "cholesky"
        and np.dtype(plan.factor_dtype) == np.float32
        and not plan.options.keep_gram
        and not mf
    ):
        raise ValueError(
            "factor_dtype='float32' with keep_gram=False needs X in memory (a numpy "
            "array) and the kernel, to refine alpha to double precision with "
            "matrix-free products: the Gram it could be refined against is replaced "
            f"by the factor (got X of type {type(X).__name__}). Pass X as a numpy array, "
            "use keep_gram=True, or factor_dtype='float64'."
        )
    # in place with X in memory, the Gram is not stored first: the factor computes each
    # Gram tile from X as it needs it (no Gram stage, no Gram bytes written or read)
    # (only where the factor runs in this process: remote workers would each need X)
    from_x = gram_on_demand(plan.solver, plan.options.keep_gram, mf, True)
    executor = factor_executor(plan.solver, plan.options.factor_scheduler, from_x)
    on_demand = gram_on_demand(plan.solver, plan.options.keep_gram, mf, executor == "threads")
    if plan.needs_gram and gram is None:
        if root is None:
            raise ValueError(f"solver={plan.solver!r} needs a store for the Gram; pass root=")
        gram = build_gram(
            X,
            kernel,
            root,
            bs,
            plan.gram_dtype,
            progress=progress,
            overwrite=_rebuild_gram,  # only the fallback's: the float32 Gram this fit built
            x_fingerprint=x_fingerprint or _x_fingerprint(X),
            kernel_dtype=C.GRAM_ON_DEMAND_KERNEL_DTYPE if on_demand else None,
            defer=on_demand,
        )
    if be is not None and plan.solver == "cholesky":
        # the stored Gram's tiles streamed to the device; the factor's tiles written to
        # the store under the device's fingerprint (a killed fit resumes from them)
        f = tile_cholesky(
            gram, plan.alpha, convention=conv, store=factor_store or root, name=factor_name,
            jitter=chol_jitter, dtype=plan.factor_dtype, progress=progress, overwrite=True,
            check_disk=plan.options.check_disk, backend=be,
        )  # fmt: skip
        coef = np.asarray(f.solve(np.asarray(y, dtype=np.float64)))
        f.free()
        info = {
            "factor_tiles_computed": int(f.info["tiles_computed"]),
            "jitter": f.jitter,
            "device": {k: f.info.get(k) for k in DEVICE_INFO},
        }
        return FitResult(coef, "cholesky", 1, float(shift), plan, info, factor=f)
    if plan.solver == "cholesky":
        if not plan.options.keep_gram:
            if np.dtype(plan.factor_dtype) != np.dtype(gram.dtype):
                raise ValueError(
                    f"keep_gram=False stores the factor in the Gram's own array, so "
                    f"factor_dtype must be the Gram's ({np.dtype(gram.dtype)}), got "
                    f"{plan.factor_dtype!r}; use keep_gram=True for a {plan.factor_dtype} factor"
                )
            if recompute_tile is None and isinstance(X, np.ndarray) and kernel is not None:
                # the evaluation the Gram's array records: the bits a stored tile has
                recompute_tile = GramTileRecomputer.for_gram(gram, X, kernel)
        factor = tile_cholesky(
            gram,
            plan.alpha,
            convention=conv,
            store=(factor_store or root) if plan.options.keep_gram else None,
            name=factor_name,
            keep_gram=plan.options.keep_gram,
            recompute_tile=recompute_tile if not plan.options.keep_gram else None,
            check_disk=plan.options.check_disk,
            jitter=True if plan.options.jitter else None,
            scheduler=executor,
            overwrite=True,
            progress=progress,
            dtype=plan.factor_dtype,
        )
        refine: dict = {}
        # in place, the Gram's array holds the factor now: nothing to refine against
        # a float32 factor is refined with matrix-free products when X is in memory
        # (no rereads of the stored Gram; pipeline.linalg.triangular.refinement_operator)
        coef = cholesky_solve(
            factor,
            y,
            gram=gram if plan.options.keep_gram else None,
            stats=refine,
            X=X if mf else None,
            kernel=kernel if mf else None,
        )
        info = {"factor_tiles_computed": len(factor.computed), "jitter": factor.jitter, **refine}
        if not plan.options.keep_gram:
            info["keep_gram"] = False
        return FitResult(np.asarray(coef), "cholesky", 1, float(shift), plan, info, factor=factor)
    if plan.solver != "cg":
        raise ValueError(f"plan.solver must be dense, primal, cholesky or cg, got {plan.solver!r}")

    if plan.cg_precision == "mixed" and plan.matvec != "recompute":
        raise ValueError(
            f"cg_precision='mixed' recomputes the kernel in float32; plan.matvec must be "
            f"'recompute', got {plan.matvec!r}"
        )
    single_gram = plan.matvec == "stored" and np.dtype(gram.dtype) == np.float32
    if single_gram and not mf:
        raise ValueError(
            "CG on a float32 Gram converges to the solution for the Gram's rounded values; "
            "reaching the float64 one needs X in memory (a numpy array) and the kernel for "
            f"float64 residuals (got X of type {type(X).__name__}). Pass X as a numpy "
            "array, or use a float64 Gram."
        )
    if plan.matvec == "stored":
        op = make_operator("stored", shift, gram=gram, block_size=bs)
    elif be is not None:
        # the kernel's products on the device (X copied there once); the same CG loop,
        # checkpoints and preconditioner (its columns taken from the device)
        op = matvec_ops.DeviceKernelOperator(
            X, kernel, shift, backend=be, kernel_dtype=plan.kernel_dtype
        )  # fmt: skip
    else:
        # the plan's kernel dtype (float64 unless asked), whatever X's dtype: float32 X
        # must not silently give a float32 kernel whose products stall CG above tol
        op = make_operator(
            "matrix-free", shift, X=X, kernel=kernel, block_size=bs, kernel_dtype=plan.kernel_dtype
        )
    o = plan.options  # the knobs as asked: CG's tolerance, limit, preconditioner, seed
    pre = make_preconditioner(
        o.preconditioner, op, rank=min(plan.rank, n), random_state=o.random_state
    )
    ckpt = cg_dir or root

    # the iteration and the relative residual, live (pipeline.engine.progress decides how)
    with cg_progress(enabled=progress, tol=o.tol, max_iter=o.max_iter) as shown:
        if single_gram:
            # CG on the stored float32 Gram inside a float64 refinement whose residuals
            # are matrix-free products from X: the float64 answer, not the rounded Gram's
            high = make_operator("matrix-free", shift, X=X, kernel=kernel, block_size=bs)
            res = mixed_cg_fit(
                high, y, preconditioner=pre, tol=o.tol, max_iter=o.max_iter,
                store=ckpt, callback=shown, low=op,
            )  # fmt: skip
        elif plan.cg_precision == "mixed":
            # float32 kernel products inside, float64 residuals outside; checkpointed per
            # refinement step, and float64 products take over if float32 stagnates
            # (on a device its float32 twin is a device operator too)
            low = None
            if be is not None:
                low = matvec_ops.DeviceKernelOperator(
                    X, kernel, shift, backend=be, kernel_dtype="float32"
                )  # fmt: skip
            res = mixed_cg_fit(
                op, y, preconditioner=pre, tol=o.tol, max_iter=o.max_iter,
                store=ckpt, callback=shown, low=low,
            )  # fmt: skip
        elif ckpt is None:
            res = conjugate_gradient(
                op.matvec, y, preconditioner=pre, tol=o.tol, max_iter=o.max_iter,
                callback=shown,
            )  # fmt: skip
        else:
            res = resumable_cg(
                op,
                y,
                ckpt,
                preconditioner=pre,
                every=o.checkpoint_every,
                tol=o.tol,
                max_iter=o.max_iter,
                callback=shown,
                adopt_from=cg_adopt,
                tiling={"block_size": bs, "matvec": plan.matvec},
            )
    info = {
        "matvec": plan.matvec,
        "cg_precision": plan.cg_precision,
        "converged": bool(res.converged),
        "rel_residual": np.asarray(res.rel_residual).tolist(),
        "history": res.history,
    }
    return FitResult(np.asarray(res.x), "cg", int(res.n_iter), float(shift), plan, info, cg=res)


def _execute_nystrom(
    plan: FitPlan, X: Any, y: np.ndarray, kernel: Any, sample_weight: Any, store: Any,
    progress: bool,
) -> FitResult:  # fmt: skip
    """Nyström KRR by FALKON (:func:`pipeline.linalg.nystrom_solve.nystrom_solve`): the
    sample weights enter the normal equations as they are; λ's ``n_samples`` convention
    takes n = Σ w (as the exact solvers do); the solve (the cost model's method, PCG or
    the direct pass) checkpoints to ``store`` when given. A PCG that stagnates (FALKON's
    preconditioner on near-duplicate centres: K_MM nearly singular) is solved again by
    the direct pass, which maps its blocks by ``T⁻¹`` where the centres' basis rounds
    (scikit-learn's ``Nystroem`` + ``Ridge`` fits these; the PCG alone raised)."""
    o = plan.options
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    shift = float(
        effective_alpha(plan.alpha, int(y.shape[0]), sample_weight=sw,
                        alpha_convention=plan.alpha_convention)[0]
    )  # fmt: skip
    n, d = int(y.shape[0]), int(X.shape[1])
    m = min(int(o.n_centers), n)
    method, why = nystrom_method(n, m, d)
    log.info("%s: %s", why, method)  # both resumable with a store
    kw = dict(
        n_centers=o.n_centers, centers=o.centers, sample_weight=sw, block_size=plan.block_size,
        tol=o.tol, max_iter=o.max_iter, random_state=o.random_state, store=store,
        checkpoint_every=o.checkpoint_every,
    )  # fmt: skip
    try:
        with cg_progress(enabled=progress and method == "pcg", tol=o.tol,
                         max_iter=o.max_iter) as shown:  # fmt: skip
            sol = nystrom_solve(X, y, kernel, shift, callback=shown, method=method, **kw)
    except CGStagnationError as err:
        if method != "pcg":
            raise
        log.warning(
            "Nyström: FALKON's PCG stagnated (%s); solving the M x M system directly "
            "(one pass over X)", str(err).split(". ")[0]
        )  # fmt: skip
        # the PCG's centres (CGStagnationError.centre_indices), not chosen again:
        # RPCholesky's pivots cost a pass over X
        sol = nystrom_solve(
            X, y, kernel, shift, method="direct", centre_indices=err.centre_indices, **kw
        )
        sol.info.update(centers=o.centers, fallback_from="pcg")
    info = {**sol.info, "centres": sol.centres.tolist(), "history": sol.cg.history}
    return FitResult(
        sol.coef, "nystrom", int(sol.cg.n_iter), shift, plan, info, cg=sol.cg, X_fit=sol.X_centres
    )


def fit_nystrom(
    X: Any,
    y: np.ndarray,
    kernel: Kernel,
    plan: FitPlan,
    *,
    sample_weight: Any = None,
    store: Any = None,
    progress: bool = False,
) -> FitResult:
    """Run a ``solver="nystrom"`` plan (:func:`pipeline.plan.fit_plan.plan_fit`), its CG
    checkpointed in ``store`` (a fit directory, :func:`fit_store_path`; created and locked
    while the fit runs) when given, so a killed fit resumes; in memory otherwise."""
    if plan.solver != "nystrom":
        raise ValueError(f"fit_nystrom runs a plan of solver 'nystrom', got {plan.solver!r}")
    if store is None:
        return execute(plan, X, y, kernel, sample_weight=sample_weight, progress=progress)
    with _store_dir(store) as root:
        res = execute(plan, X, y, kernel, sample_weight=sample_weight, root=root,
                      progress=progress)  # fmt: skip
    return replace(res, cg=None)


def _execute_in_memory(
    plan, X, y, kernel, alpha, sample_weight, K, overwrite_k, jitter
) -> FitResult:
    raw = plan.alpha if alpha is None else alpha
    if plan.solver == "primal":
        t = 1 if np.ndim(y) == 1 else y.shape[1]
        lam = effective_alpha(
            raw,
            X.shape[0],
            n_targets=t,
            sample_weight=sample_weight,
            alpha_convention=plan.alpha_convention,
        )
        coef = solve_primal(
            X, y, raw, sample_weight=sample_weight, alpha_convention=plan.alpha_convention
        )
        dual = primal_to_dual(X, y, coef, lam, sample_weight) if np.all(lam > 0) else None
        return FitResult(dual, "primal", 1, float("nan"), plan, primal_coef=coef)
    be = device_backend(plan)
    if be is not None and K is None and isinstance(kernel, Kernel):
        return _execute_dense_device(plan, X, y, kernel, raw, sample_weight, be)
    overwrite = K is None if overwrite_k is None else overwrite_k
    if K is None:  # the fused evaluators (the kernel object's code for kernels they do not know)
        K = kernel_matrix(kernel, X, check=False)
    # an overflowing kernel is refused, as the out-of-core Cholesky and CG refuse it (it
    # gave a NaN model); a caller's own K (precomputed, a callable's) is checked too
    check_finite_kernel(K)
    dual, info = solve_dual(
        K,
        y,
        raw,
        sample_weight=sample_weight,
        alpha_convention=plan.alpha_convention,
        jitter=jitter,
        overwrite_k=overwrite,
        return_info=True,
    )
    return FitResult(dual, "dense", 1, float("nan"), plan, info)


#: what a device factor's ``info`` reports in the fit's ``info["device"]``
DEVICE_INFO = ("backend", "block", "tiles_computed", "tiles_resumed", "seconds", "gflops")


def _execute_dense_device(
    plan: FitPlan, X: Any, y: np.ndarray, kernel: Kernel, raw: Any, sample_weight: Any,
    be: Backend, jitter: Any = None,
) -> FitResult:  # fmt: skip
    """The dense dual on the device, in place (:mod:`pipeline.linalg.cholesky_device`):
    X copied to the device once, each Gram tile computed there
    (:func:`pipeline.engine.device.kernel_block`) as the factor needs it, never K on the
    host. Sample weights scale the tiles by sqrt(w) on both sides (scikit-learn's
    ``W^1/2 K W^1/2``) and ``dual_coef = sqrt(w) beta``, as on the CPU. One shift for
    every target, > 0 (the CPU's least-squares fallback for alpha = 0 has no device
    path). ``jitter``: the tile Cholesky's policy (``solver="cholesky"``'s knob)."""
    X = np.asarray(_dense(X), dtype=np.float64)
    n = int(X.shape[0])
    t = 1 if np.ndim(y) == 1 else y.shape[1]
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    lam = effective_alpha(
        raw, n, n_targets=t, sample_weight=sw, alpha_convention=plan.alpha_convention
    )
    if np.unique(lam).size != 1 or not float(lam[0]) > 0:
        raise ValueError(
            f"device={plan.device!r} solves the dense dual with one alpha > 0 for every "
            f"target, got alpha={raw!r}; use one positive alpha, or device='cpu'"
        )
    shift = float(lam[0])
    Xd = be.asarray(X)
    root = None if sw is None else be.asarray(np.sqrt(sw))
    block = cd.device_block(n, be)
    cd.check_device_memory(be, n, block, "float64")

    def rows(i: int) -> slice:
        return slice(i * block, min(n, (i + 1) * block))

    def tile(i: int, j: int) -> Any:
        a = dev.kernel_block(be, kernel, Xd[rows(i), :], Xd[rows(j), :] if i != j else None)
        if root is not None:  # W^1/2 K W^1/2, tile by tile
            a = a * root[rows(i), None] * root[None, rows(j)]
        return a

    f = cd.device_cholesky(
        be, tile, n, block, shift=shift, jitter=jitter, lam=shift, convention="sklearn"
    )
    rhs = y if sw is None else y * (np.sqrt(sw) if y.ndim == 1 else np.sqrt(sw)[:, None])
    beta = np.asarray(f.solve(np.asarray(rhs, dtype=np.float64))).reshape(y.shape)  # (host)
    if sw is not None:
        beta = beta * (np.sqrt(sw) if y.ndim == 1 else np.sqrt(sw)[:, None])
    f.free()
    info = {
        "factor_tiles_computed": int(f.info["tiles_computed"]),
        "jitter": f.jitter,
        "device": {k: f.info.get(k) for k in DEVICE_INFO},
    }
    return FitResult(beta, "dense", 1, float("nan"), plan, info)


# ---------------------------------------------------------------------------
# the in-memory reference: one call, the ground truth for every other solver
#
# The dual forms K (n² D) and factors it (n³/3); the primal forms Φᵀ Φ (n D²) and
# factors it (D³/3). Only the linear kernel (or explicit features) has a primal, so
# only there is there a choice (:func:`pipeline.plan.fit_plan.in_memory_choice`);
# with α = 0 it is always the dual, whose least-squares fallback is scikit-learn's.


def _dense(X: Any) -> np.ndarray:
    return X.toarray() if sp.issparse(X) else np.asarray(X)


def fit_reference(
    X: Any,
    y: Any,
    kernel: str | Kernel | dict = "rbf",
    alpha: Any = 1.0,
    *,
    sample_weight: Any = None,
    alpha_convention: str = "sklearn",
    solver: str = "auto",
    jitter: float | str | None = None,
    available_memory: int | None = None,
    **kernel_params: Any,
) -> FitResult:
    """Fit exact kernel ridge in memory; the ground truth for every other solver.

    Returns the fit's result, coefficients and solver details (no predict: the one
    fitted-model type, :class:`pipeline.models.artifact.Model`, is built from it by
    :meth:`~pipeline.models.artifact.Model.from_fit`, a layer above).

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n, D)
    y : ndarray of shape (n,) or (n, n_targets)
    kernel : name, spec dict or Kernel
        Built with :func:`pipeline.kernels.make_kernel` (``kernel_params`` forwarded).
    alpha, sample_weight, alpha_convention, jitter
        As in :func:`pipeline.linalg.dense_dual.solve_dual`.
    solver : {"auto", "dense", "primal"}
        ``primal`` needs the linear kernel.
    available_memory : int, optional
        Bytes the fit may use (default: measured); more raises
        :class:`~pipeline.linalg.dense_memory.InsufficientMemoryError`.

    Returns
    -------
    FitResult
        ``solver`` "dense" or "primal"; ``dual_coef`` (None for a primal fit with
        alpha <= 0), and ``primal_coef`` for a primal fit.
    """
    k = make_kernel(kernel, **kernel_params)
    X = X if sp.issparse(X) else np.asarray(X)
    y = np.asarray(y, dtype=np.float64)
    n, d = X.shape
    t = 1 if y.ndim == 1 else y.shape[1]
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    lam = effective_alpha(
        alpha, n, n_targets=t, sample_weight=sw, alpha_convention=alpha_convention
    )
    linear = isinstance(k, Linear)
    if solver not in ("auto", "dense", "primal"):
        raise ValueError(f"solver={solver!r} is not valid here; choose 'auto', 'dense' or 'primal'")
    if solver == "primal" and not linear:
        raise ValueError(f"solver='primal' needs the linear kernel, got {k!r}; use 'dense'")
    # the one fit plan; the reference is in memory by definition (its memory check raises)
    plan, _ = plan_fit(
        n,
        d,
        k,
        Resources(float("inf"), 0.0, in_memory=True),
        solver_choices(solver=solver, alpha=lam, alpha_convention=alpha_convention),
        n_targets=t,
    )
    if plan.solver == "primal":
        check_dense_memory(
            primal_bytes(n, d, t), what=f"the primal solve with D={d}", available=available_memory
        )
        return execute(plan, X, y, k, alpha=alpha, sample_weight=sw)
    check_dense_memory(
        dense_dual_bytes(n, d, t),
        what=f"the dense dual solve with N={n}",
        available=available_memory,
    )
    return execute(
        plan,
        X,
        y,
        k,
        alpha=alpha,
        sample_weight=sw,
        K=kernel_matrix(k, _dense(X), check=False),  # checked by execute
        overwrite_k=True,
        jitter=jitter,
    )


# ---------------------------------------------------------------------------
# the estimator's out-of-core fit (formerly pipeline/out_of_core.py): one function,
# fit_out_of_core, that plans (unless given a plan) and runs execute() in a store
# directory. It holds X (N x D) and alpha (N x outputs) in memory, never an N x N
# array. With an explicit ``store`` every step resumes from its completed tiles (Gram
# tiles, factor tiles, CG checkpoints); with ``store=None`` a temporary directory under
# :func:`pipeline.storage.tempfiles.temp_root` is used and removed afterwards.

#: the logger of the out-of-core fit's lines (the plan it made, a wait for another
#: process's identical fit): its name stays that of the module it came from, which
#: log formats with ``%(name)s`` (``run.log``, ``krr`` off a terminal) print
ooc_log = logging.getLogger("pipeline.out_of_core")


#: what an out-of-core fit produced: the one fit-result type, :class:`FitResult` (its
#: ``factor`` and ``cg`` are None there: they point into a store that may be gone)
OutOfCoreFit = FitResult


#: the lock file in a fit's directory (``store/fit-<fingerprint>/.fit-lock``)
FIT_LOCK_NAME = ".fit-lock"


@contextlib.contextmanager
def _fit_lock(store: str) -> Iterator[None]:
    """Hold an exclusive OS lock (``flock``) on the fit directory ``store`` while inside.

    Two identical fits on one store (same data, parameters, store: the same
    ``fit-<fingerprint>`` directory), started together, raced to create its arrays
    (check-then-create) and one failed about one time in four. Now the second waits
    for the first, then finds its completed tiles and reuses them. Different fits
    have different directories and never wait for each other. The kernel drops the
    lock when its holder dies (a killed fit never blocks the next). On a filesystem
    without locks (``ENOLCK``) the fit runs unlocked, as before. Object-store fits
    (``s3://``) hold a lease instead (:func:`_fit_lease`).
    """
    fd = os.open(os.path.join(store, FIT_LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            ooc_log.info("another process is fitting the same model in %s: waiting for it", store)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


#: seconds between two looks at a fit directory's lease held by another fit
FIT_LEASE_POLL = 1.0


@contextlib.contextmanager
def _fit_lease(store: str) -> Iterator[None]:
    """Hold the lease ``store/.fit-lock`` on an object-store fit directory while inside:
    :func:`_fit_lock`'s exclusion where no ``flock`` exists, with the run lock's lease
    protocol (:class:`pipeline.storage.lease.LeaseLock`: a conditional PUT, renewed while
    the fit lives, expiring when its holder dies). Two identical fits on one ``s3://``
    store used to run unlocked, racing to create the same arrays. A held lease is
    waited for (polled every :data:`FIT_LEASE_POLL` s; a killed holder's lease is taken
    over at once on its host, else when it expires), then the fit finds the first one's
    completed tiles. A store that does not answer raises
    :class:`~pipeline.errors.StoreUnreachable`, as every store wait does.
    """
    lease = LeaseLock(store, name=FIT_LOCK_NAME)
    waiting = False
    while True:
        try:
            lease.acquire()
            break
        except LockHeldError:
            if not waiting:
                ooc_log.info(
                    "another process is fitting the same model in %s: waiting for it", store
                )
                waiting = True
            time.sleep(FIT_LEASE_POLL)
    try:
        yield
    finally:
        lease.release()


@contextlib.contextmanager
def _store_dir(store: Any) -> Iterator[str]:
    if store is not None:
        store = normalize_store(store)  # one spelling for Zarr and fsspec (markers)
        if "://" not in store:
            Path(store).mkdir(parents=True, exist_ok=True)
            with _fit_lock(store):
                yield store
            return
        with _fit_lease(store):
            yield store
        return
    # under $KRR_TMPDIR or {tempfile.gettempdir()}/krr-pipeline; one a killed fit left
    # behind is removed by the next make_temp_store (see pipeline.storage.tempfiles)
    tmp = make_temp_store()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fit_store_path(store: Any, identity: dict[str, Any]) -> str:
    """The subdirectory of ``store`` that holds one fit: ``store/fit-<fingerprint>``.

    ``identity`` is everything that makes this fit's result differ from another's
    (parameters, the kernel's identity, the content of X, y and the sample
    weights). The same fit in the same store gets the same subdirectory, so a
    killed fit resumes from its completed tiles; two different fits (the clones
    of a GridSearchCV, the folds of ``cross_val_score``) get different ones and
    never share or replace each other's arrays. Works for local paths and
    fsspec URLs (``s3://``, ``file://``); nothing is created here.
    """
    name = "fit-" + fingerprint_obj(identity)[:20]
    text = str(store)
    if "://" in text:
        return text.rstrip("/") + "/" + name
    return str(Path(store) / name)


def weighted_problem(
    X: np.ndarray, y: np.ndarray, kernel: Kernel, sample_weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray, Kernel, np.ndarray]:
    """The unweighted problem whose solution gives scikit-learn's weighted one.

    scikit-learn's KernelRidge solves ``(W^1/2 K W^1/2 + lam I) beta = W^1/2 y``
    and returns ``alpha = W^1/2 beta`` (W = diag(sample_weight)). Here sqrt(w) is
    appended to X as one more column and the kernel becomes
    ``FunctionScaled(Warped(kernel, SelectFeatures(0..D-1)), Coordinate(D))``,
    whose matrix is exactly ``W^1/2 K W^1/2``; every out-of-core solver (stored
    Gram, in-place factor, matrix-free CG, preconditioners) then runs unchanged,
    and the Gram's fingerprint covers the weights (they are part of X).

    Returns
    -------
    X_w : ndarray of shape (n, D + 1), float64
    y_w : ndarray like y, ``sqrt(w) * y``
    kernel_w : Kernel
    root_w : ndarray of shape (n,)
        sqrt(w): multiply the solution by it (row-wise) to get the dual coefficients.
    """
    root_w = np.sqrt(np.asarray(sample_weight, dtype=np.float64))
    d = X.shape[1]
    X_w = np.empty((X.shape[0], d + 1), dtype=np.float64)
    X_w[:, :d] = X
    X_w[:, d] = root_w
    y_w = y * (root_w if y.ndim == 1 else root_w[:, None])
    kernel_w = FunctionScaled(Warped(kernel, SelectFeatures(list(range(d)))), Coordinate(d))
    return X_w, y_w, kernel_w, root_w


def fit_out_of_core(
    X: np.ndarray,
    y: np.ndarray,
    kernel: Kernel,
    lam: float,
    *,
    convention: str = "sklearn",
    solver: str = "cholesky",
    store: Any = None,
    block_size: int | None = None,
    progress: bool = True,
    plan: Any = None,
    x_fingerprint: str | None = None,
    **knobs: Any,
) -> FitResult:
    """Solve (K + shift·I) α = y out of core; shift = lam, or n·lam with ``convention="n_samples"``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Validated, finite training inputs.
    y : ndarray of shape (n,) or (n, outputs)
    kernel : Kernel
    lam : float
        λ > 0 (the out-of-core solvers refuse λ <= 0).
    solver : {"cholesky", "cg", "auto"}
    store : path or fsspec URL, optional
        Where the Gram, factor and CG checkpoints live; reusing it resumes.
    plan : FitPlan, optional
        A plan already made (by the estimator's ``solver="auto"``); the options
        above are then taken from it. Otherwise one is made here with
        :func:`pipeline.plan.fit_plan.plan_fit` and logged.
    x_fingerprint : str, optional
        X's content hash when the caller already has it (saves a pass over X).
    **knobs
        The other solver knobs of the option tree (:class:`pipeline.options.SolverOptions`:
        ``tol``, ``max_iter``, ``preconditioner``, ``rank``, ``matvec``,
        ``cg_precision``, ``factor_dtype``, ``keep_gram``, ``random_state``, ...; a
        missing or None value takes the tree's default), as ``KernelRidge`` passes
        them; checked by :func:`pipeline.options.solver_choices` before any work.
    """
    if convention not in ALPHA_CONVENTIONS:
        raise ValueError(
            f"convention must be one of {sorted(ALPHA_CONVENTIONS)}, got {convention!r}"
        )
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(
            f"the out-of-core solvers need alpha > 0, got {lam!r}; use a positive alpha, "
            "or solver='dense' for scikit-learn's alpha=0 least-squares behaviour"
        )
    n, d = X.shape
    if solver not in ("cholesky", "cg", "auto"):
        raise ValueError(f"solver must be 'cholesky', 'cg' or 'auto', got {solver!r}")
    mercer = bool(getattr(kernel, "is_mercer", True))
    if solver == "cg" and not mercer:
        raise IndefiniteKernelError(
            f"solver='cg' needs a positive semi-definite kernel, and {kernel!r} is not one "
            "(is_mercer is False): CG can break down or return wrong coefficients on an "
            "indefinite K + alpha*I. Use solver='cholesky' (it names the shift that fails), "
            "solver='dense', or a Mercer kernel such as 'rbf'."
        )
    choices = solver_choices(
        solver=solver,
        alpha=lam,
        alpha_convention=convention,
        block_size=block_size,
        store=store,
        **knobs,
    )  # (checked here, before the store directory is made)
    with _store_dir(store) as root:
        if plan is None:
            plan, reason = plan_fit(
                n, d, kernel,
                measure_resources(root, in_memory=False, device=knobs.get("device") or "cpu"),
                choices,
                n_targets=1 if y.ndim == 1 else y.shape[1], probes=row_probes(X, kernel),
            )  # fmt: skip
            log_plan(plan, reason, origin="KernelRidge", logger=ooc_log)
        res = execute(plan, X, y, kernel, root=root, progress=progress, x_fingerprint=x_fingerprint)
        # the factor's and CG's objects read the store, a temporary one removed on return
        return replace(res, factor=None, cg=None)
