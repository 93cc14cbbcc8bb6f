"""Out-of-core fitting for :class:`pipeline.KernelRidge`: Gram in Zarr, tile Cholesky or CG.

One function, :func:`fit_out_of_core`, wires the layers below (gram builder,
tile Cholesky + triangular solves, CG with a stored or matrix-free operator) for
the estimator. It holds X (N x D) and α (N x outputs) in memory, never an N x N
array. With an explicit ``store`` every step resumes from its completed tiles
(Gram tiles, factor tiles, CG checkpoints); with ``store=None`` a temporary
directory under :func:`pipeline.storage.tempfiles.temp_root` is used and removed
afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import IndefiniteKernelError
from pipeline.fit import execute, log_plan, measure_resources, row_probes
from pipeline.kernels import Kernel
from pipeline.options import ALPHA_CONVENTIONS, solver_choices
from pipeline.plan.fit_plan import plan_fit

log = logging.getLogger(__name__)

__all__ = [
    "OutOfCoreFit",
    "fit_out_of_core",
    "fit_store_path",
    "weighted_problem",
]


@dataclass
class OutOfCoreFit:
    """What an out-of-core fit produced."""

    dual_coef: np.ndarray
    solver: str
    n_iter: int
    shift: float
    info: dict[str, Any] = field(default_factory=dict)


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
    (``s3://``) are not locked.
    """
    fd = os.open(os.path.join(store, FIT_LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is fitting the same model in %s: waiting for it", store)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _store_dir(store: Any) -> Iterator[str]:
    if store is not None:
        from pipeline.storage.arrays import normalize_store

        store = normalize_store(store)  # one spelling for Zarr and fsspec (markers)
        if "://" not in store:
            Path(store).mkdir(parents=True, exist_ok=True)
            with _fit_lock(store):
                yield store
            return
        yield store
        return
    from pipeline.storage.tempfiles import make_temp_store

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
    from pipeline.storage import fingerprint_obj

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
    from pipeline.kernels import FunctionScaled, Warped
    from pipeline.kernels.warping import Coordinate, SelectFeatures

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
    tol: float = 1e-6,
    max_iter: int | None = None,
    preconditioner: str = "nystrom",
    rank: int | None = None,
    matvec: str = "auto",
    random_state: int | None = None,
    progress: bool = True,
    cg_precision: str = "auto",
    factor_dtype: str = "float64",
    plan: Any = None,
    keep_gram: bool = True,
    x_fingerprint: str | None = None,
) -> OutOfCoreFit:
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
    matvec : {"auto", "stored", "recompute"}
        CG's operator: stream the stored Gram or recompute kernel tiles.
    cg_precision : {"auto", "float64", "mixed"}
        CG's products: float64, or float32 inside a float64 refinement.
    factor_dtype : {"float64", "float32"}
        Cholesky only: precision of the stored factor; with float32, alpha is
        refined against the stored Gram (:func:`pipeline.linalg.triangular.cholesky_solve`).
    keep_gram : bool
        Cholesky only: False factors in place (the factor replaces the Gram's tiles).
    plan : FitPlan, optional
        A plan already made (by the estimator's ``solver="auto"``); the options
        above are then taken from it. Otherwise one is made here with
        :func:`pipeline.plan.fit_plan.plan_fit` and logged.
    x_fingerprint : str, optional
        X's content hash when the caller already has it (saves a pass over X).
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
    with _store_dir(store) as root:
        if plan is None:
            choices = solver_choices(
                solver=solver,
                alpha=lam,
                alpha_convention=convention,
                block_size=block_size,
                tol=tol,
                max_iter=max_iter,
                preconditioner=preconditioner,
                rank=rank,
                matvec=matvec,
                cg_precision=cg_precision,
                random_state=random_state,
                factor_dtype=factor_dtype,
                keep_gram=keep_gram,
                store=store,
            )
            plan, reason = plan_fit(
                n, d, kernel, measure_resources(root, in_memory=False), choices,
                n_targets=1 if y.ndim == 1 else y.shape[1], probes=row_probes(X, kernel),
            )  # fmt: skip
            log_plan(plan, reason, origin="KernelRidge", logger=log)
        res = execute(plan, X, y, kernel, root=root, progress=progress, x_fingerprint=x_fingerprint)
        return OutOfCoreFit(res.dual_coef, res.solver, res.n_iter, res.shift, res.info)
