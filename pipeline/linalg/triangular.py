"""Blockwise forward and back substitution with a stored tile factor ``L``, and the
refinement of a low-precision factor's solution.

``cholesky_solve`` solves ``(K + shift*I) alpha = y`` as ``L z = y`` then
``L.T alpha = z``. Each pass is a tile DAG on the engine's executor
(:func:`pipeline.engine.dag.run_dag`) that reads each factor tile once, prefetched,
and chains each row's updates in a fixed order: the same bits on any number of
threads. ``y`` may hold several right-hand sides; ``alpha`` is ``N x outputs``.

A float32 factor solves to about single precision; refinement (float64 CG
preconditioned by the factor, :func:`refine_with_operator`) reaches double precision in
a few steps, each one product by ``K + shift I`` and one pass over the factor.
:func:`refinement_operator` takes the matrix-free product from X (no disk) when X and
the kernel are given, else the stored Gram (``4 N^2`` bytes read per step).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
from scipy.linalg import blas as sblas

import pipeline.errors as errors
from pipeline.constants import SWEEP_LANE_COLUMNS
from pipeline.engine import where
from pipeline.engine.blas import process_threads
from pipeline.engine.dag import run_dag, serial_order, upward_ranks
from pipeline.engine.tile_io import TileIO
from pipeline.float_range import pow2_exponents
from pipeline.linalg.cg import CGConvergenceError, conjugate_gradient
from pipeline.linalg.cholesky import CholeskyFactor
from pipeline.linalg.cholesky_cache import _read_factor_tile, release_tile_cache
from pipeline.linalg.matvec import MatrixFreeKernelOperator, StoredKernelOperator
from pipeline.storage import TiledArray, fingerprint_blocks, fingerprint_obj, open_tiled_array


def _sweep_blas():
    """BLAS threads of the sweeps' products and small TRSMs: one per tile task."""

    return process_threads(SWEEP_BLAS_THREADS)


#: BLAS threads of each forward/back sweep task (tile-times-panel products: memory-bound
#: for one right-hand side; for wide panels the lanes run in parallel instead)
SWEEP_BLAS_THREADS = 1


Key = tuple[int, int, int]  # (lane, tile row, tile column)


class _SharedTiles:
    """Factor tiles read once (through TileIO) and handed to every lane that uses them;
    a tile is dropped when its last lane took it."""

    def __init__(self, io: TileIO, uses: dict[tuple[int, int], int]) -> None:
        self._io, self._uses = io, dict(uses)
        self._held: dict[tuple[int, int], Future] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> np.ndarray:
        with self._lock:
            fut = self._held.get(key)
            first = fut is None
            if first:
                fut = self._held[key] = Future()
        if first:
            try:
                fut.set_result(self._io.read(key))
            except BaseException as e:
                fut.set_exception(e)
        tile = fut.result()
        with self._lock:
            self._uses[key] -= 1
            if not self._uses[key]:
                del self._held[key]
        return tile


def _lanes(n_cols: int, first_row: np.ndarray | None, g: Any, start_block: int, r0: int):
    """Column lanes ``(columns, first tile row)``: ``SWEEP_LANE_COLUMNS`` columns each
    (a fixed width, so the bits do not depend on the machine's cores); a lane starts at
    the tile row of its first possibly nonzero row (all rows above are zero)."""
    w = max(1, int(SWEEP_LANE_COLUMNS))
    out = []
    for c0 in range(0, n_cols, w):
        cols = slice(c0, min(n_cols, c0 + w))
        start = start_block
        if first_row is not None:
            start = max(start_block, int(first_row[cols].min() + r0) // g.block_size)
        out.append((cols, start))
    return out


def _run_sweep(
    L: TiledArray,
    keys: list[Key],
    deps: Callable[[Key], list[Key]],
    step: Callable[[Key, np.ndarray], None],
    name: str,
) -> int:
    """Run ``step(key, factor tile (i, k))`` for every ``(lane, i, k)`` on the engine's
    DAG executor, longest path first; returns the number of factor tiles read.

    Factor tiles are read ahead through TileIO in the one-thread order, once each,
    and shared by the lanes.
    """
    rank = upward_ranks(keys, deps, lambda t: 2.0 if t[1] != t[2] else 1.0)
    order = list(dict.fromkeys(t[1:] for t in serial_order(keys, deps, rank)))
    uses: dict[tuple[int, int], int] = {}
    for t in keys:
        uses[t[1:]] = uses.get(t[1:], 0) + 1
    io = TileIO(lambda k: _read_factor_tile(L, *k), order, depth=3, max_pending=0)
    with io, _sweep_blas():
        tiles = _SharedTiles(io, uses)
        run_dag(
            keys,
            deps,
            lambda t: step(t, tiles.get(t[1:])),
            rank=rank,
            n_threads=where.sweep_threads(),
            name=name,
        )
    return len(uses)


def _trsm_lower(lii: np.ndarray, b: np.ndarray, trans: bool) -> np.ndarray:
    """Solve ``lii x = b`` (or ``lii.T x = b``), lii lower, b 2-D; returns x (F order)."""
    trsm = sblas.get_blas_funcs("trsm", (lii, b))
    # lii is C-contiguous: lii.T is F-contiguous upper U with U.T = lii
    return trsm(1.0, lii.T, np.asfortranarray(b), side=0, lower=0, trans_a=0 if trans else 1)


def _as_factor(factor: CholeskyFactor | TiledArray) -> TiledArray:
    L = factor.L if isinstance(factor, CholeskyFactor) else factor
    if not isinstance(L, TiledArray) or len(L.shape) != 2 or L.shape[0] != L.shape[1]:
        raise ValueError(f"factor must be a CholeskyFactor or a square TiledArray, got {factor!r}")
    return L


def _as_rhs(y: Any, n: int) -> tuple[np.ndarray, bool]:
    y = np.asarray(y)
    if y.ndim not in (1, 2):
        raise ValueError(f"y must be 1-D or 2-D (n_samples[, n_outputs]), got shape {y.shape}")
    if y.shape[0] != n:
        raise ValueError(
            f"y has {y.shape[0]} rows but the factor is {n} x {n}: y must have one row per "
            "training sample, in the order the Gram was built"
        )
    if not np.all(np.isfinite(y)):
        raise ValueError("y contains NaN or infinity; remove or impute those targets")
    one_d = y.ndim == 1
    return np.array(y.reshape(n, -1), dtype=np.float64, order="C"), one_d


def forward_sweep(
    L: TiledArray,
    z: np.ndarray,
    start_block: int = 0,
    first_row: np.ndarray | None = None,
    stats: dict | None = None,
) -> np.ndarray:
    """Solve ``L x = z`` in place, from tile row ``start_block`` on.

    ``z`` (C order, 2-D) holds the rows from ``start_block``'s first row on (the
    right-hand side is zero above them). ``first_row`` (optional, one per column of
    ``z``): the first row of each column that may be nonzero, so that a lane starts at
    its own first tile row (the LOO panels' identity columns).
    ``stats["factor_tile_reads"]``, if given, counts the factor tiles read.

    Per lane of ``SWEEP_LANE_COLUMNS`` columns, task ``(lane, i, k)``, ``k < i``,
    subtracts ``L_ik x_k`` after ``(lane, i, k - 1)`` (increasing ``k``, as a serial
    sweep); task ``(lane, i, i)`` then solves ``L_ii x_i = z_i``.
    """
    g = L.grid
    T = g.n_row_blocks
    if T <= start_block or z.shape[1] == 0:
        return z
    r0 = g.row_slice(start_block).start
    lanes = _lanes(z.shape[1], first_row, g, start_block, r0)

    def rows(i: int) -> slice:
        s = g.row_slice(i)
        return slice(s.start - r0, s.stop - r0)

    def deps(t: Key) -> list[Key]:
        c, i, k = t
        return ([(c, i, k - 1)] if k > lanes[c][1] else []) + ([(c, k, k)] if k < i else [])

    def step(t: Key, tile: np.ndarray) -> None:
        c, i, k = t
        cols = lanes[c][0]
        if k < i:
            zi = z[rows(i), cols]
            zi -= tile @ z[rows(k), cols]
        else:
            z[rows(i), cols] = _trsm_lower(tile, z[rows(i), cols], trans=False)

    keys = [
        (c, i, k)
        for i in range(start_block, T)
        for k in range(start_block, i + 1)
        for c, (_, s0) in enumerate(lanes)
        if k >= s0
    ]
    reads = _run_sweep(L, keys, deps, step, "forward")
    if stats is not None:
        stats["factor_tile_reads"] = stats.get("factor_tile_reads", 0) + reads
    return z


def forward_substitution(factor: CholeskyFactor | TiledArray, y: Any) -> np.ndarray:
    """Solve ``L z = y`` blockwise (row by row of tiles). Returns ``z`` shaped like ``y``."""
    L = _as_factor(factor)
    z, one_d = _as_rhs(y, L.shape[0])
    forward_sweep(L, z)
    return z[:, 0] if one_d else z


def back_sweep(L: TiledArray, a: np.ndarray) -> np.ndarray:
    """Solve ``L.T x = a`` in place, last tile row first, in ``a``'s precision.

    Per lane of columns (as :func:`forward_sweep`), task ``(lane, i, i)`` solves
    ``L_iiᵀ x_i = a_i`` after ``(lane, i + 1, i)``; task ``(lane, i, k)``, ``k < i``,
    subtracts ``L_ikᵀ x_i`` from ``a_k`` after ``(lane, i + 1, k)`` (decreasing ``i``,
    as a serial sweep).
    """
    g = L.grid
    T = g.n_row_blocks
    if not T or a.shape[1] == 0:
        return a
    lanes = _lanes(a.shape[1], None, g, 0, 0)

    def deps(t: Key) -> list[Key]:
        c, i, k = t
        return ([(c, i, i)] if k < i else []) + ([(c, i + 1, k)] if i + 1 < T else [])

    def step(t: Key, tile: np.ndarray) -> None:
        c, i, k = t
        cols = lanes[c][0]
        if k < i:
            ak = a[g.row_slice(k), cols]
            ak -= tile.T @ a[g.row_slice(i), cols]
        else:
            a[g.row_slice(i), cols] = _trsm_lower(tile, a[g.row_slice(i), cols], trans=True)

    keys = [
        (c, i, k) for i in reversed(range(T)) for k in [i, *range(i)] for c in range(len(lanes))
    ]
    _run_sweep(L, keys, deps, step, "back")
    return a


def back_substitution(factor: CholeskyFactor | TiledArray, z: Any) -> np.ndarray:
    """Solve ``L.T alpha = z`` blockwise, reading L's tiles row by row (last row first)."""
    L = _as_factor(factor)
    a, one_d = _as_rhs(z, L.shape[0])
    back_sweep(L, a)
    return a[:, 0] if one_d else a


class FactorPreconditioner:
    """``(L L.T)⁻¹`` applied blockwise in the factor's own precision: a stored factor
    (float32 or float64) as a CG preconditioner.

    A float32 factor's sweeps run in float32 (upcasting each tile would cost more than
    the arithmetic); CG keeps residuals, iterates and products in float64.
    """

    def __init__(self, factor: CholeskyFactor | TiledArray) -> None:
        self.L = _as_factor(factor)

    def apply(self, R: np.ndarray) -> np.ndarray:
        L = self.L
        dt = np.dtype(L.dtype)
        if dt == np.float64:
            return back_substitution(L, forward_substitution(L, R))
        R = np.asarray(R)
        one_d = R.ndim == 1
        z = np.array(R.reshape(L.shape[0], -1), dtype=dt, order="C")
        with _sweep_blas():
            self._sweeps(z)
        out = z.astype(np.float64)
        return out[:, 0] if one_d else out

    def _sweeps(self, z: np.ndarray) -> None:
        # the solvers' one forward and back sweep, in z's precision (float32 here)
        forward_sweep(self.L, z)
        back_sweep(self.L, z)


#: the old name of :class:`FactorPreconditioner` (it was the native-precision
#: subclass of a float64-only one; the float64 form had no other user)
NativeFactorPreconditioner = FactorPreconditioner


def refine_solution(
    factor: CholeskyFactor | TiledArray,
    gram: TiledArray,
    shift: float,
    y: np.ndarray,
    alpha: np.ndarray,
    *,
    tol: float = 1e-11,
    max_iter: int = 100,
    stats: dict | None = None,
) -> np.ndarray:
    """Refine ``alpha`` against the stored float64 Gram: ``(K + shift I) alpha = y``.

    Float64 CG preconditioned by the low-precision factor, started from its solution:
    it converges at least as fast as plain iterative refinement, and keeps converging
    where that stalls. Each iteration costs one pass over the Gram and one over the
    factor.
    """
    op = StoredKernelOperator(gram, shift)
    return refine_with_operator(factor, op, y, alpha, tol=tol, max_iter=max_iter, stats=stats)


def cholesky_solve(
    factor: CholeskyFactor | TiledArray,
    y: Any,
    *,
    store: str | None = None,
    name: str | None = None,
    release_cache: bool = True,
    gram: TiledArray | None = None,
    refine_tol: float = 1e-11,
    stats: dict | None = None,
    X: Any = None,
    kernel: Any = None,
) -> np.ndarray:
    """Solve ``(K + shift*I) alpha = y`` with the stored factor (``L L.T = K + shift*I``).

    Parameters
    ----------
    factor : CholeskyFactor or TiledArray
        From :func:`pipeline.linalg.cholesky.tile_cholesky`.
    y : array-like of shape (n_samples,) or (n_samples, n_outputs)
    store, name : str, optional
        If ``name`` is given, also write ``alpha`` (as ``n x outputs``) to that
        array in ``store`` (default: the factor's store), with a fingerprint
        chained to the factor's and ``y``'s content.
    release_cache : bool
        Drop this factor's tiles from the process's tile cache afterwards.
    gram : TiledArray, optional
        The stored Gram the factor was made from. With a float32 factor (or a
        float32 Gram), alpha is refined to ``refine_tol``: against this Gram, or
        with float64 products from ``X`` when given (:func:`refine_solution`).
        Without either, a float32 factor's alpha has single-precision accuracy
        (a warning says so); refined against a float32 Gram, it solves the
        Gram's rounded values (a warning says so too).
    refine_tol : float
        Relative residual ``‖y - (K + shift I) alpha‖ / ‖y‖`` the refinement reaches.
    stats : dict, optional
        Filled with the refinement's steps and final relative residual.
    X, kernel : optional
        The training inputs (in memory) and kernel: the refinement's products are
        then matrix-free (:func:`refinement_operator`), not rereads of the Gram.

    Returns
    -------
    alpha : ndarray, float64, shaped like ``y``
    """
    L = _as_factor(factor)
    # a float32 factor, or one of a float32 Gram, solves a single-precision system
    single_gram = gram is not None and np.dtype(gram.dtype) == np.float32
    single = single_gram or np.dtype(L.dtype) == np.float32
    matrix_free = X is not None and kernel is not None
    if single_gram and not matrix_free:
        warnings.warn(
            "refining against a float32 Gram reaches the solution for the Gram's rounded "
            "values, not the float64 kernel's; pass X= and kernel= to refine with "
            "float64 products from X",
            stacklevel=2,
        )
    try:
        if single and (gram is not None or matrix_free):
            shift = factor.shift if isinstance(factor, CholeskyFactor) else None
            if shift is None:
                raise ValueError("refining against the Gram needs the CholeskyFactor (its shift)")
            y64, one_d = _as_rhs(y, L.shape[0])
            # the first solve in float32 too (no per-tile upcast), then CG in float64
            alpha = FactorPreconditioner(L).apply(y64)
            alpha = alpha[:, 0] if one_d else alpha
            op = refinement_operator(shift, X=X, kernel=kernel, gram=gram, block_size=L.block_size)
            alpha = refine_with_operator(L, op, y, alpha, tol=refine_tol, stats=stats)
        else:
            alpha = back_substitution(L, forward_substitution(L, y))
        if single and gram is None and not matrix_free:
            warnings.warn(
                "a float32 factor solves to about single precision; pass gram= to refine "
                "alpha to double precision",
                stacklevel=2,
            )
    finally:
        if release_cache:
            release_tile_cache(L)
    if name is not None:
        a2 = alpha.reshape(L.shape[0], -1)
        fp = fingerprint_obj(
            {"what": "dual-coef", "factor": L.fingerprint, "y": fingerprint_blocks([_y_2d(y)])}
        )
        out = open_tiled_array(
            store or L.store,
            name,
            a2.shape,
            L.block_size,
            np.float64,
            fp,
            overwrite=True,
            chunk_cols=a2.shape[1],
        )
        for i in range(L.grid.n_row_blocks):
            out.write_tile(i, 0, a2[L.grid.row_slice(i)])
    return alpha


def _y_2d(y: Any) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64)
    return y.reshape(y.shape[0], -1)


# -- refinement of a low-precision factor's solution --------------------------------------
def refinement_operator(
    shift: float,
    *,
    X: Any = None,
    kernel: Any = None,
    gram: Any = None,
    block_size: int | None = None,
) -> Any:
    """The product ``K + shift I`` refinement uses: matrix-free from ``X`` when
    ``X`` and ``kernel`` are given (no disk), else the stored ``gram``."""
    if X is not None and kernel is not None:
        bs = block_size or (gram.block_size if gram is not None else 2048)
        return MatrixFreeKernelOperator(
            np.asarray(X, dtype=np.float64), kernel, shift, block_size=bs
        )
    if gram is not None:
        return StoredKernelOperator(gram, shift)
    raise ValueError(
        "refinement needs the product K + shift*I: pass X= and kernel= (matrix-free, "
        "fastest) or gram= (the stored Gram)"
    )


def refine_with_operator(
    factor: Any,
    op: Any,
    y: np.ndarray,
    alpha: np.ndarray,
    *,
    tol: float = 1e-11,
    max_iter: int = 100,
    stats: dict | None = None,
    max_steps: int = 8,
) -> np.ndarray:
    """Refine ``alpha`` to ``‖y - op(alpha)‖ / ‖y‖ <= tol`` by iterative refinement.

    Each step computes the true float64 residual ``r = y - op(alpha)`` and solves
    ``op d = r`` by CG preconditioned by ``factor`` to a relative
    ``0.1 * tol * ‖y‖ / ‖r‖`` (between 1e-8 and 1e-2), then adds ``d``. Restarting
    from the true residual keeps CG's recursive-residual drift (about ``κ ε`` of its
    starting residual) relative to a residual already small, so the floor is the
    product's own rounding.

    A residual that stalls above ``tol`` but at or below float64's rounding
    floor for the product (``ε ‖(K + shift I)|alpha|‖ / ‖y‖``, see
    :func:`_at_rounding_floor`) is accepted: ``stats["refine_rounding_floor"]``
    then records that floor, and ``stats["rel_residual"]`` the residual reached.

    Raises
    ------
    CGConvergenceError
        ``tol`` not reached within ``max_steps`` steps or ``max_iter`` CG
        iterations in all, or a step that fails to reduce the residual while it
        is above float64's rounding floor: a refinement that stops short is an
        error, never a quiet alpha.
    """
    stats = stats if stats is not None else {}
    y2 = np.asarray(y, dtype=np.float64).reshape(np.shape(y)[0], -1)
    # a column far from 1 is refined as 2**k y (exact; k = 0 keeps ordinary y's bits),
    # so that ‖y‖ cannot underflow
    k = pow2_exponents(np.max(np.abs(y2), axis=0, initial=0.0))
    y2 = np.ldexp(y2, k)
    x = np.ldexp(np.array(alpha, dtype=np.float64).reshape(y2.shape), k)
    y_norm = np.linalg.norm(y2, axis=0)
    y_norm[y_norm == 0] = 1.0
    pre = FactorPreconditioner(factor)
    if np.any(k != 0):  # a float32 first solve of such a y itself gave 0 or inf: redo it
        x[:, k != 0] = pre.apply(y2[:, k != 0])
    its = steps = 0
    history = []
    while True:
        r = y2 - np.asarray(op.matvec(x), dtype=np.float64).reshape(y2.shape)
        rel = np.linalg.norm(r, axis=0) / y_norm
        history.append(float(np.max(rel)))
        if np.all(rel <= tol):
            break
        stalled = len(history) > 1 and history[-1] > 0.5 * history[-2]
        if stalled and _at_rounding_floor(op, x, rel, tol, y_norm, stats):
            break  # as close as float64 products can tell: a float64 solve gets no closer
        if steps >= max_steps or its >= max_iter or stalled:
            raise CGConvergenceError(
                f"refinement of the factor's solution did not converge: relative residual "
                f"{history[-1]:.3e} > tol {tol:.1e} after {steps} steps and {its} CG "
                f"iterations (residuals {', '.join(f'{h:.1e}' for h in history)}): the "
                "system is too ill-conditioned for this tol in float64. Loosen tol, use a "
                "larger lambda, or a float64 factor (factor_dtype='float64')."
            )
        todo = rel > tol
        inner = float(np.clip(0.1 * tol / np.max(rel[todo]), 1e-8, 1e-2))
        rhs = np.where(todo, r, 0.0)  # a converged column stays as it is
        # an inner solve short of its tol is judged by the next true residual
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.CGConvergenceWarning)
            res = conjugate_gradient(  # the loop's next true residual confirms it
                op.matvec,
                rhs,
                preconditioner=pre,
                tol=inner,
                max_iter=max(1, max_iter - its),
                confirm=False,
            )
        x += res.x.reshape(x.shape)
        its += int(res.n_iter)
        steps += 1
    stats["refine_iterations"] = its
    stats["refine_steps"] = steps
    stats["rel_residual"] = history[-1]
    stats["refine_history"] = history
    stats["refine_operator"] = type(op).__name__
    return np.ldexp(x, -k).reshape(np.shape(alpha))


def _at_rounding_floor(
    op: Any, x: np.ndarray, rel: np.ndarray, tol: float, y_norm: np.ndarray, stats: dict
) -> bool:
    """Whether every column short of ``tol`` has stalled at float64's rounding floor.

    A product ``(K + shift I) x`` computed in float64 is off by up to about
    ``ε ‖(K + shift I) |x|‖`` (summation rounding; ``|K|`` is ``K`` for the
    non-negative kernels such as RBF and Laplacian, and a lower bound
    otherwise, so the test errs towards refusing). Where the true residual has
    stopped falling at or below that, no float64 computation can tell the
    iterate from the exact solution. Costs one product, only when stalled.
    """
    eps = float(np.finfo(np.float64).eps)
    abs_prod = np.asarray(op.matvec(np.abs(x)), dtype=np.float64).reshape(x.shape)
    floor = eps * np.linalg.norm(abs_prod, axis=0) / y_norm
    short = rel > tol
    if not np.all(rel[short] <= floor[short]):
        return False
    stats["refine_rounding_floor"] = float(np.max(floor[short]))
    return True


def solve_refined(
    factor: Any,
    y: Any,
    *,
    X: Any = None,
    kernel: Any = None,
    gram: Any = None,
    tol: float = 1e-11,
    max_iter: int = 100,
    stats: dict | None = None,
) -> np.ndarray:
    """Solve with a (float32 or float64) stored factor, refined with the fastest product.

    Parameters
    ----------
    factor : CholeskyFactor
        From :func:`pipeline.linalg.cholesky.tile_cholesky` (its ``shift`` is used).
    y : array-like of shape (n,) or (n, m)
    X, kernel : optional
        Training inputs and kernel: refinement products are then matrix-free.
    gram : TiledArray, optional
        The stored Gram (used when X is not given).
    tol : float
        Relative residual to reach.
    stats : dict, optional
        Filled with ``refine_iterations``, ``rel_residual``, ``refine_operator``,
        ``solve_s``, ``refine_s``.

    Returns
    -------
    alpha : ndarray, float64, shaped like ``y``
    """
    stats = stats if stats is not None else {}
    L = _as_factor(factor)
    t0 = time.perf_counter()
    try:
        if np.dtype(L.dtype) == np.float32:  # solves in float32: no per-tile upcast
            alpha = FactorPreconditioner(L).apply(np.asarray(y, dtype=np.float64))
        else:
            alpha = back_substitution(L, forward_substitution(L, y))
        stats["solve_s"] = time.perf_counter() - t0
        if np.dtype(L.dtype) == np.float32 or X is not None or gram is not None:
            op = refinement_operator(factor.shift, X=X, kernel=kernel, gram=gram)
            t1 = time.perf_counter()
            alpha = refine_with_operator(L, op, y, alpha, tol=tol, max_iter=max_iter, stats=stats)
            stats["refine_s"] = time.perf_counter() - t1
    finally:
        release_tile_cache(L)
    return alpha
