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
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.kernels import Kernel

log = logging.getLogger(__name__)

#: default tile edge of the out-of-core solvers (a 2048² float64 tile is 32 MiB)
DEFAULT_BLOCK_SIZE = 2048
#: estimator convention names -> solver convention names
CONVENTIONS = {"sklearn": "sklearn", "n_samples": "n"}


@dataclass
class OutOfCoreFit:
    """What an out-of-core fit produced."""

    dual_coef: np.ndarray
    solver: str
    n_iter: int
    shift: float
    info: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _store_dir(store: Any) -> Iterator[str]:
    if store is not None:
        if isinstance(store, Path) or "://" not in str(store):
            Path(store).mkdir(parents=True, exist_ok=True)
        yield str(store)
        return
    from pipeline.storage.tempfiles import make_temp_store

    # under $KRR_TMPDIR or {tempfile.gettempdir()}/krr-pipeline; one a killed fit left
    # behind is removed by the next make_temp_store (see pipeline.storage.tempfiles)
    tmp = make_temp_store()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _disk_free(store: str) -> float:
    if "://" in store:
        return float("inf")
    return float(shutil.disk_usage(store).free)


def choose_out_of_core_solver(n: int, d: int, store: str) -> tuple[str, str]:
    """``"cholesky"`` or ``"cg"`` by N, free disk and free memory; returns (name, reason)."""
    from pipeline.reference.memory import available_memory
    from pipeline.solvers.choose import choose_solver

    return choose_solver(n, d, _disk_free(store), float(available_memory()))


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
    factor_dtype: str = "float64",
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
    factor_dtype : {"float64", "float32"}
        Cholesky only: precision of the stored factor; with float32, alpha is
        refined against the stored Gram (:func:`pipeline.solvers.cholesky_solve`).
    """
    from pipeline.solvers.cholesky import regularisation_shift

    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {sorted(CONVENTIONS)}, got {convention!r}")
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(
            f"the out-of-core solvers need alpha > 0, got {lam!r}; use a positive alpha, "
            "or solver='dense' for scikit-learn's alpha=0 least-squares behaviour"
        )
    n, d = X.shape
    bs = int(block_size or min(DEFAULT_BLOCK_SIZE, n))
    conv = CONVENTIONS[convention]
    shift = regularisation_shift(lam, n, conv)
    mercer = bool(getattr(kernel, "is_mercer", True))
    if solver == "cg" and not mercer:
        raise ValueError(
            f"solver='cg' needs a positive semi-definite kernel, and {kernel!r} is not one "
            "(is_mercer is False): CG can break down or return wrong coefficients on an "
            "indefinite K + alpha*I. Use solver='cholesky' (it names the shift that fails), "
            "solver='dense', or a Mercer kernel such as 'rbf'."
        )
    with _store_dir(store) as root:
        if solver == "auto":
            solver, reason = choose_out_of_core_solver(n, d, root)
            if solver == "cg" and not mercer:  # as KernelRidgeCV's auto routing does
                solver, reason = "cholesky", f"{reason}; but the kernel is not known to be PSD"
            log.info("solver='auto' chose %r: %s", solver, reason)
        if solver == "cholesky":
            return _fit_cholesky(X, y, kernel, lam, conv, root, bs, shift, progress, factor_dtype)
        if solver == "cg":
            return _fit_cg(
                X,
                y,
                kernel,
                shift,
                root,
                bs,
                tol,
                max_iter,
                preconditioner,
                rank,
                matvec,
                random_state,
                progress,
            )
        raise ValueError(f"solver must be 'cholesky', 'cg' or 'auto', got {solver!r}")


def _x_fingerprint(X: np.ndarray) -> str:
    """X's content hash; X was validated by the estimator, so build_gram's pass is skipped."""
    from pipeline.storage import fingerprint_blocks

    return fingerprint_blocks([X])


def _fit_cholesky(
    X, y, kernel, lam, conv, root, bs, shift, progress, factor_dtype="float64"
) -> OutOfCoreFit:
    from pipeline.gram import build_gram
    from pipeline.solvers import cholesky_solve, tile_cholesky

    gram = build_gram(X, kernel, root, bs, progress=progress, x_fingerprint=_x_fingerprint(X))
    factor = tile_cholesky(
        gram, lam, convention=conv, store=root, progress=progress, dtype=factor_dtype
    )
    refine: dict = {}
    alpha = cholesky_solve(factor, y, gram=gram, stats=refine)
    info = {"factor_tiles_computed": len(factor.computed), "jitter": factor.jitter, **refine}
    return OutOfCoreFit(np.asarray(alpha), "cholesky", 1, shift, info)


def _fit_cg(
    X, y, kernel, shift, root, bs, tol, max_iter, preconditioner, rank, matvec, seed, progress
) -> OutOfCoreFit:
    from pipeline.solvers.cg_checkpoint import resumable_cg
    from pipeline.solvers.choose import choose_matvec_mode
    from pipeline.solvers.matvec import make_operator
    from pipeline.solvers.precond import make_preconditioner

    n, d = X.shape
    if matvec == "auto":
        mode, reason = choose_matvec_mode(n, d, _disk_free(root))
        log.info("matvec='auto' chose %r: %s", mode, reason)
    else:
        mode = "matrix-free" if matvec == "recompute" else "stored"
    if mode == "stored":
        from pipeline.gram import build_gram

        gram = build_gram(X, kernel, root, bs, progress=progress, x_fingerprint=_x_fingerprint(X))
        op = make_operator("stored", shift, gram=gram)
    else:
        op = make_operator("matrix-free", shift, X=X, kernel=kernel, block_size=bs)
    r = int(rank or min(n, 500))
    precond = make_preconditioner(
        preconditioner, op, rank=min(r, n), random_state=0 if seed is None else seed
    )
    result = resumable_cg(op, y, root, preconditioner=precond, tol=tol, max_iter=max_iter)
    info = {
        "matvec": mode,
        "converged": bool(result.converged),
        "rel_residual": np.asarray(result.rel_residual).tolist(),
        "history": result.history,
    }
    return OutOfCoreFit(np.asarray(result.x), "cg", int(result.n_iter), shift, info)
