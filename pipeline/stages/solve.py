"""Solve stage: the dual coefficients α of (K + shift·I) α = y.

``cholesky`` factors the stored Gram tile by tile (:func:`pipeline.solvers.tile_cholesky`,
checkpointed per factor tile) and substitutes blockwise. ``cg`` runs
preconditioned conjugate gradients (:func:`pipeline.solvers.cg_checkpoint.resumable_cg`,
checkpointed every ``checkpoint_every`` iterations) on the stored Gram or
matrix-free from X. ``auto`` picks by the number of training rows.

α (``n_train x n_outputs``) is small and is written to ``{stage_dir}/alpha.npy``.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.stages._deps import require
from pipeline.stages.ingest import open_rows
from pipeline.storage import CorruptFileError, bytes_checksum
from pipeline.storage.atomic import atomic_write
from pipeline.storage.location import join_path, read_bytes

log = logging.getLogger("pipeline.stages")

#: ``auto`` uses the out-of-core Cholesky up to this many training rows (a float64
#: Gram of lower tiles is n²/2·8 bytes: 3.6 GB at 30k), and CG above it
AUTO_CHOLESKY_MAX_ROWS = 30_000


def resolve_method(solver: dict[str, Any], n_train: int) -> str:
    """The solver actually used: ``cholesky`` or ``cg`` (``auto`` decided by ``n_train``)."""
    method = solver.get("method", "auto")
    if method == "auto":
        method = "cholesky" if n_train <= AUTO_CHOLESKY_MAX_ROWS else "cg"
    return method


def needs_gram(solver: dict[str, Any], n_train: int) -> bool:
    """Whether the solve reads a stored Gram (so the gram stage must run)."""
    method = resolve_method(solver, n_train)
    return method == "cholesky" or solver.get("matvec") == "stored"


def save_npy_atomic(path: Path, arr: np.ndarray) -> int:
    """Write ``arr`` as ``.npy`` atomically; return the CRC-32C of the file's bytes."""
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    atomic_write(str(path), data, fsync=True)
    return bytes_checksum(data)


def load_npy_verified(path: str, crc32c: int | None) -> np.ndarray:
    """Load an ``.npy`` written by :func:`save_npy_atomic`, checking its CRC-32C.

    Raises
    ------
    CorruptFileError
        The file is missing, or its bytes do not match ``crc32c`` (or no
        checksum was recorded). It is a :class:`~pipeline.storage.CorruptTileError`,
        so ``krr run`` reruns the stage whose directory holds the file.
    """
    expected = -1 if crc32c is None else int(crc32c)
    try:
        data = read_bytes(path)
    except FileNotFoundError as exc:
        raise CorruptFileError(str(path), expected, -1) from exc
    found = bytes_checksum(data)
    if found != expected:
        raise CorruptFileError(str(path), expected, found)
    return np.load(io.BytesIO(data))


def _open_gram(inputs: dict[str, dict[str, Any]]):
    open_gram = require("pipeline.gram", "open_gram", "the solve stage")
    g = inputs.get("gram")
    if not g:
        raise ValueError("the solver needs the stored Gram, but the gram stage did not run")
    return open_gram(g["store"], g.get("name", "gram"))


def _solve_cholesky(
    stage_dir, inputs, y, *, lam, lam_convention, solver
) -> tuple[np.ndarray, dict]:
    tile_cholesky = require("pipeline.solvers", "tile_cholesky", "the cholesky solve")
    cholesky_solve = require("pipeline.solvers", "cholesky_solve", "the cholesky solve")
    gram = _open_gram(inputs)
    factor = tile_cholesky(
        gram,
        lam,
        convention=lam_convention,
        store=str(join_path(stage_dir, "factor.zarr")),
        name="chol",
        jitter=True if solver.get("jitter") else None,
        scheduler=solver.get("factor_scheduler", "auto"),
        overwrite=True,
        dtype=solver.get("factor_dtype", "float64"),
    )
    refine: dict = {}
    alpha = cholesky_solve(factor, y, gram=gram, stats=refine)
    info = {
        "shift": factor.shift,
        "factor_dtype": str(factor.L.dtype),
        **({"refinement": refine} if refine else {}),
        "jitter": factor.jitter,
        "factor": {
            "store": factor.L.store,
            "name": factor.L.name,
            "tiles": factor.L.grid.n_lower_tiles(),
        },
        "factor_tiles_computed": len(factor.computed),
    }
    return alpha, info


class SolveNotConverged(RuntimeError):
    """CG stopped at ``max_iter`` or broke down, and ``solver.allow_unconverged`` is false."""


class IndefiniteKernelError(ValueError):
    """The CG solver was asked for with a kernel that is not known to be PSD."""


def check_cg_kernel(kernel: dict[str, Any]) -> None:
    """Refuse a kernel that is not known to be PSD before a CG solve (as ``auto`` routing does).

    Raises
    ------
    IndefiniteKernelError
        The kernel's ``is_mercer`` is False (e.g. sigmoid).
    """
    from pipeline.kernels import kernel_from_spec

    k = kernel_from_spec(kernel)
    if not getattr(k, "is_mercer", True):
        raise IndefiniteKernelError(
            f"solver 'cg' needs a positive semi-definite kernel, and {k!r} is not one "
            "(is_mercer is False): CG can break down or return a wrong alpha on an indefinite "
            "K + lambda*I. Use solver.method=cholesky (it names the shift that fails) or a "
            "Mercer kernel such as rbf."
        )


def _solve_cg(stage_dir, inputs, y, *, kernel, lam, lam_convention, block_size, solver):
    check_cg_kernel(kernel)
    regularisation_shift = require("pipeline.solvers", "regularisation_shift", "the cg solve")
    make_operator = require("pipeline.solvers.matvec", "make_operator", "the cg solve")
    make_preconditioner = require("pipeline.solvers.precond", "make_preconditioner", "the cg solve")
    resumable_cg = require("pipeline.solvers.cg_checkpoint", "resumable_cg", "the cg solve")
    n = y.shape[0]
    shift = regularisation_shift(lam, n, lam_convention)
    if solver.get("matvec") == "stored":
        op = make_operator("stored", shift, gram=_open_gram(inputs), block_size=block_size)
    else:
        X = open_rows(inputs["ingest"], "X_train")
        op = make_operator("matrix-free", shift, X=X, kernel=kernel, block_size=block_size)
    pre = make_preconditioner(
        solver.get("preconditioner", "nystrom"), op, rank=min(solver.get("rank", 500), n)
    )
    res = resumable_cg(
        op,
        y,
        str(join_path(stage_dir, "cg")),
        preconditioner=pre,
        every=solver.get("checkpoint_every", 10),
        tol=solver.get("tol", 1e-6),
        max_iter=solver.get("max_iter", 1000),
    )
    history_crc = save_npy_atomic(join_path(stage_dir, "cg_history.npy"), np.asarray(res.history))
    if not res.converged and not solver.get("allow_unconverged", False):
        worst = float(np.max(res.rel_residual))
        raise SolveNotConverged(
            f"CG did not converge: relative residual {worst:.3e} > tol {res.tol:.1e} after "
            f"{res.n_iter} iterations (max_iter {res.max_iter}; a breakdown means K + lambda*I "
            "is not numerically positive definite). No alpha was written. Raise "
            "solver.max_iter, use solver.preconditioner=nystrom, loosen solver.tol or raise "
            "lambda; or set solver.allow_unconverged=true to accept this solve."
        )
    info = {
        "shift": float(shift),
        "n_iter": int(res.n_iter),
        "resumed_from": int(res.start_iter),
        "converged": bool(res.converged),
        "rel_residual": np.asarray(res.rel_residual).tolist(),
        "history": str(join_path(stage_dir, "cg_history.npy")),
        "history_crc32c": history_crc,
    }
    return res.x, info


def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    kernel: dict[str, Any],
    lam: float,
    lam_convention: str,
    block_size: int,
    dtype: str,
    solver: dict[str, Any],
) -> dict[str, Any]:
    """Solve for α with the configured solver; write ``alpha.npy``."""
    del dtype  # part of the fingerprint through the Gram; the solve itself is float64
    ing = inputs["ingest"]
    y = np.asarray(open_rows(ing, "y_train").compute(), dtype=np.float64)
    method = resolve_method(solver, ing["n_train"])
    log.info(
        "solve: method %s (requested %s) for n_train=%d",
        method,
        solver.get("method"),
        ing["n_train"],
    )
    if method == "cholesky":
        alpha, info = _solve_cholesky(
            stage_dir, inputs, y, lam=lam, lam_convention=lam_convention, solver=solver
        )
    else:
        alpha, info = _solve_cg(
            stage_dir, inputs, y, kernel=kernel, lam=lam, lam_convention=lam_convention,
            block_size=block_size, solver=solver,
        )  # fmt: skip
    alpha = np.asarray(alpha, dtype=np.float64).reshape(y.shape)
    path = join_path(stage_dir, "alpha.npy")
    crc = save_npy_atomic(path, alpha)
    return {
        "method": method,
        "alpha": str(path),
        "alpha_crc32c": crc,
        "lam": lam,
        "lam_convention": lam_convention,
        **info,
    }


def load_alpha(outputs: dict[str, Any]) -> np.ndarray:
    """α from the solve stage's outputs, checked against the CRC-32C recorded there.

    Raises
    ------
    CorruptFileError
        ``alpha.npy`` is missing, damaged, or has no recorded checksum; ``krr
        run`` then reruns the solve stage.
    """
    return load_npy_verified(outputs["alpha"], outputs.get("alpha_crc32c"))
