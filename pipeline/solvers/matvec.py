"""Blockwise kernel operators: ``V -> (K + shift·I) V`` without holding K in memory.

Two operators share one interface (:class:`KernelOperator`):

- :class:`StoredKernelOperator` streams the lower tiles of a stored Gram (array
  ``"gram"``, tiles ``(i, j)`` with ``j <= i``) and uses each off-diagonal tile
  twice, for ``K_ij v_j`` and ``K_ijᵀ v_i``;
- :class:`MatrixFreeKernelOperator` recomputes each lower kernel tile from X on
  the fly, again using it twice, through the fused engine
  (:func:`pipeline.tiles.kernel_matvec`: cache-sized pieces, the tile is never
  formed). Memory is O(N·D + a few tiles) and no store is needed.

Each product is one Dask graph: a task per lower tile returns its one or two
partial products, and one task per row block sums them. The graph runs through
:func:`pipeline.parallel.compute`, so it uses whatever scheduler the caller
opened. Besides ``matvec``, both operators expose ``diagonal``, ``columns`` and
``submatrix`` (for Jacobi and Nyström preconditioners), each also blockwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import dask
import numpy as np
from dask.delayed import Delayed

from pipeline.kernels import Kernel, kernel_fingerprint, make_kernel
from pipeline.parallel import compute
from pipeline.storage import (
    IncompleteArrayError,
    TiledArray,
    TileGrid,
    fingerprint_blocks,
    fingerprint_obj,
)
from pipeline.tiles import kernel_matvec, task_threads

__all__ = [
    "KernelOperator",
    "MatrixFreeKernelOperator",
    "StoredKernelOperator",
    "check_shift",
    "make_operator",
]


def check_shift(shift: float) -> float:
    """Validate the diagonal shift (λ or nλ): a positive finite number."""
    try:
        value = float(shift)
    except (TypeError, ValueError):
        raise ValueError(
            f"shift (lambda) must be a positive finite number, got {shift!r}"
        ) from None
    if not np.isfinite(value) or value <= 0:
        raise ValueError(
            f"shift (lambda, or n*lambda) must be a positive finite number, got {shift!r}; "
            "kernel ridge regression needs a strictly positive ridge"
        )
    return value


def _sum_parts(tiles: list[tuple], which: list[int]) -> np.ndarray:
    """Sum the partial products picked from tile results (``which``: 0 or 1 each)."""
    out = tiles[0][which[0]].copy()
    for t, w in zip(tiles[1:], which[1:]):
        out += t[w]
    return out


def _concat(blocks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(blocks)


def _tile_products(
    tile: np.ndarray, vi: np.ndarray, vj: np.ndarray, diagonal: bool, shift: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(K_ij v_j, K_ijᵀ v_i)``; for a diagonal tile ``((K_ii + shift I) v_i, None)``."""
    if diagonal:
        out = tile @ vj
        out += shift * vj
        return out, None
    return tile @ vj, tile.T @ vi


class KernelOperator:
    """Interface of a symmetric positive definite operator ``A = K + shift·I``.

    Subclasses implement ``_tile_task`` (a delayed producing the tile products
    of lower tile ``(i, j)``), ``diagonal``, ``columns`` and ``submatrix``.

    Attributes
    ----------
    n : int
        Order of K.
    shift : float
        The value added to K's diagonal (λ or nλ, as the caller chooses).
    grid : TileGrid
        The tiling the products are computed in.
    """

    n: int
    shift: float
    grid: TileGrid
    progress: bool = False

    # -- the product ---------------------------------------------------------
    def _tile_task(self, i: int, j: int, vi: Any, vj: Any) -> Any:
        raise NotImplementedError

    def matvec(self, V: np.ndarray) -> np.ndarray:
        """Return ``(K + shift·I) @ V`` for ``V`` of shape ``(n,)`` or ``(n, m)``."""
        V = np.asarray(V)
        one_d = V.ndim == 1
        if V.ndim not in (1, 2) or V.shape[0] != self.n:
            raise ValueError(
                f"matvec needs a vector of length {self.n} or an array ({self.n}, m), "
                f"got shape {V.shape}"
            )
        V2 = np.ascontiguousarray(V.reshape(self.n, -1), dtype=np.float64)
        g = self.grid
        tok = uuid.uuid4().hex[:12]
        # a plain task graph (cheaper to build than one delayed call per tile)
        dsk: dict[Any, Any] = {}
        vk = []
        for i in range(g.n_row_blocks):
            dsk[(f"v-{tok}", i)] = V2[g.row_slice(i)]
            vk.append((f"v-{tok}", i))
        dsk.update(self._constants())
        parts: list[list[Any]] = [[] for _ in range(g.n_row_blocks)]
        which: list[list[int]] = [[] for _ in range(g.n_row_blocks)]
        for i, j in g.lower_tiles():
            key = (f"tile-{tok}", i, j)
            dsk[key] = self._tile_task(i, j, vk[i], vk[j])
            parts[i].append(key)
            which[i].append(0)
            if i != j:
                parts[j].append(key)
                which[j].append(1)
        rows = []
        for i in range(g.n_row_blocks):
            dsk[(f"row-{tok}", i)] = (_sum_parts, parts[i], which[i])
            rows.append((f"row-{tok}", i))
        dsk[f"out-{tok}"] = (_concat, rows)
        (out,) = compute(
            Delayed(f"out-{tok}", dsk),
            progress=self.progress,
            desc="kernel matvec",
            optimize_graph=False,
        )
        return out[:, 0] if one_d else out

    def _constants(self) -> dict[Any, Any]:
        """Graph entries shared by every product (e.g. the blocks of X)."""
        return {}

    __call__ = matvec

    def __matmul__(self, V: np.ndarray) -> np.ndarray:
        return self.matvec(V)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    # -- pieces of K for preconditioners --------------------------------------
    def diagonal(self) -> np.ndarray:
        """Diagonal of K (without the shift), shape ``(n,)``."""
        raise NotImplementedError

    def columns(self, idx: Sequence[int]) -> np.ndarray:
        """Columns ``K[:, idx]``, shape ``(n, len(idx))``."""
        raise NotImplementedError

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        """``K[idx][:, idx]`` (without the shift)."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """Hash of what the operator computes (K's source, tiling-independent, and shift)."""
        raise NotImplementedError

    def with_shift(self, shift: float) -> KernelOperator:
        """A copy of this operator with another diagonal shift."""
        raise NotImplementedError


# ---------------------------------------------------------------------------
# stored Gram
# ---------------------------------------------------------------------------
def _stored_tile_products(
    gram: TiledArray, i: int, j: int, vi: np.ndarray, vj: np.ndarray, shift: float
) -> tuple[np.ndarray, np.ndarray | None]:
    tile = np.asarray(gram.read_tile(i, j), dtype=np.float64)
    return _tile_products(tile, vi, vj, i == j, shift)


def _stored_diag(gram: TiledArray, i: int) -> np.ndarray:
    return np.diagonal(gram.read_tile(i, i)).astype(np.float64)


def _stored_tile_pieces(
    gram: TiledArray,
    i: int,
    c: int,
    rows_i: np.ndarray | None,
    cols_c: np.ndarray | None,
    rows_c: np.ndarray | None,
    cols_i: np.ndarray | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Read lower tile ``(i, c)`` once; return ``K[rows_i, cols_c]`` from it and, off
    the diagonal, ``K[rows_c, cols_i]`` from its transpose (local indices; None: skip)."""
    t = gram.read_tile(i, c)
    a = t[rows_i][:, cols_c] if rows_i is not None and cols_c is not None else None
    b = t[cols_i][:, rows_c].T if i != c and rows_c is not None and cols_i is not None else None
    return a, b


def _stored_block(gram: TiledArray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``K[rows][:, cols]`` from the stored lower tiles, each needed tile read once."""
    g = gram.grid
    bs = g.block_size
    out = np.empty((rows.size, cols.size), dtype=np.float64)
    rb, cb = rows // bs, cols // bs
    rsel = {int(r): np.flatnonzero(rb == r) for r in np.unique(rb)}
    csel = {int(c): np.flatnonzero(cb == c) for c in np.unique(cb)}
    tasks, places = [], []
    for i in range(g.n_row_blocks):
        for c in range(i + 1):
            # tile (i, c) serves rows of block i x columns of block c, and (transposed)
            # rows of block c x columns of block i
            want_a = i in rsel and c in csel
            want_b = i != c and c in rsel and i in csel
            if not (want_a or want_b):
                continue
            ri = rows[rsel[i]] - i * bs if want_a else None
            cc = cols[csel[c]] - c * bs if want_a else None
            rc = rows[rsel[c]] - c * bs if want_b else None
            ci = cols[csel[i]] - i * bs if want_b else None
            tasks.append(dask.delayed(_stored_tile_pieces, pure=True)(gram, i, c, ri, cc, rc, ci))
            places.append((i, c))
    for (i, c), (a, b) in zip(places, compute(*tasks, progress=False), strict=True):
        if a is not None:
            out[np.ix_(rsel[i], csel[c])] = a
        if b is not None:
            out[np.ix_(rsel[c], csel[i])] = b
    return out


class StoredKernelOperator(KernelOperator):
    """``K + shift·I`` with K read tile by tile from a stored lower-tiled Gram.

    Parameters
    ----------
    gram : TiledArray
        Handle of the stored Gram (lower tiles ``j <= i`` hold K; upper tiles
        are never read).
    shift : float
        Added to the diagonal (λ or nλ). Must be > 0.
    check_complete : bool
        Verify that every lower tile has its completion marker.
    progress : bool
        Show a progress bar for each product (only on a TTY).
    """

    def __init__(
        self,
        gram: TiledArray,
        shift: float,
        *,
        check_complete: bool = True,
        progress: bool = False,
    ) -> None:
        if len(gram.shape) != 2 or gram.shape[0] != gram.shape[1]:
            raise ValueError(f"the stored Gram must be square, got shape {gram.shape}")
        self.gram = gram
        self.n = int(gram.shape[0])
        self.shift = check_shift(shift)
        self.grid = gram.grid
        self.progress = progress
        if check_complete:
            missing = set(self.grid.lower_tiles()) - gram.markers.done()
            if missing:
                raise IncompleteArrayError(
                    gram.store,
                    gram.name,
                    missing,
                    self.grid.n_lower_tiles(),
                    message=f"the stored Gram {gram.name!r} in {gram.store!r} is incomplete: "
                    f"{len(missing)} of {self.grid.n_lower_tiles()} lower tiles lack a "
                    f"completion marker (e.g. {sorted(missing)[:3]}); finish building it first",
                )

    def _tile_task(self, i, j, vi, vj):
        return (_stored_tile_products, self.gram, i, j, vi, vj, self.shift)

    def diagonal(self) -> np.ndarray:
        tasks = [
            dask.delayed(_stored_diag, pure=True)(self.gram, i)
            for i in range(self.grid.n_row_blocks)
        ]
        return np.concatenate(compute(*tasks, progress=False))

    def columns(self, idx: Sequence[int]) -> np.ndarray:
        idx = _check_idx(idx, self.n)
        return _stored_block(self.gram, np.arange(self.n), idx)

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        idx = _check_idx(idx, self.n)
        return _stored_block(self.gram, idx, idx)

    @property
    def fingerprint(self) -> str:
        return fingerprint_obj({"gram": self.gram.fingerprint, "n": self.n, "shift": self.shift})

    def with_shift(self, shift: float) -> StoredKernelOperator:
        return StoredKernelOperator(self.gram, shift, check_complete=False, progress=self.progress)

    def __repr__(self) -> str:
        return (
            f"StoredKernelOperator(store={self.gram.store!r}, n={self.n}, "
            f"block_size={self.grid.block_size}, shift={self.shift!r})"
        )


# ---------------------------------------------------------------------------
# matrix-free
# ---------------------------------------------------------------------------
def _free_tile_products(
    kernel: Kernel,
    Xi: np.ndarray,
    Xj: np.ndarray,
    vi: np.ndarray,
    vj: np.ndarray,
    diagonal: bool,
    shift: float,
    kernel_dtype: str = "float64",
    n_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The products of lower tile ``(i, j)`` by the fused engine (:mod:`pipeline.tiles`):
    the tile is evaluated in cache-sized pieces and never formed."""
    kw = {"kernel_dtype": kernel_dtype, "n_threads": n_threads}
    if diagonal:
        out = np.zeros_like(vj)
        kernel_matvec(kernel, Xi, None, vj, out, **kw)
        out += shift * vj
        return out, None
    a = np.zeros((Xi.shape[0], vj.shape[1]))
    b = np.zeros((Xj.shape[0], vi.shape[1]))
    kernel_matvec(kernel, Xi, Xj, vj, a, True, Vi=vi, out_t=b, **kw)
    return a, b


def _free_columns(kernel: Kernel, Xi: np.ndarray, Xc: np.ndarray) -> np.ndarray:
    return np.asarray(kernel(Xi, Xc), dtype=np.float64)


class MatrixFreeKernelOperator(KernelOperator):
    """``K + shift·I`` with the kernel tiles recomputed from X at every product.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Training inputs (held in memory: O(N·D)). A Dask array is computed once.
    kernel : Kernel, str or spec dict
        The kernel (see :func:`pipeline.kernels.make_kernel`).
    shift : float
        Added to the diagonal (λ or nλ). Must be > 0.
    block_size : int
        Tile edge: one task evaluates at most ``block_size²`` kernel entries.
    progress : bool
        Show a progress bar for each product (only on a TTY).
    kernel_dtype : {"float64", "float32"}, optional
        dtype the kernel values are computed in (sums longer than one
        sub-block are float64 either way; see :mod:`pipeline.tiles.fused`).
        Default: float32 iff ``X`` is float32, the kernels' own rule.
    n_threads : int, optional
        Threads inside each tile task. Default
        (:func:`pipeline.tiles.task_threads`): cores divided by the tile tasks
        the scheduler runs at once, so 1 whenever there are at least as many
        tiles as cores. The result does not depend on it, bit for bit.
    """

    def __init__(
        self,
        X: Any,
        kernel: Kernel | str | dict,
        shift: float,
        *,
        block_size: int = 2048,
        progress: bool = False,
        kernel_dtype: str | None = None,
        n_threads: int | None = None,
    ) -> None:
        if hasattr(X, "compute") and not isinstance(X, np.ndarray):
            X = X.compute()
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[0] < 1:
            raise ValueError(
                f"X must be a non-empty 2-D array (n_samples, n_features), got {X.shape}"
            )
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or infinite values; clean or impute them first")
        if int(block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.X = X
        self.kernel = make_kernel(kernel)
        self.n = int(X.shape[0])
        self.shift = check_shift(shift)
        self.grid = TileGrid(self.n, self.n, int(block_size))
        self.progress = progress
        if kernel_dtype is None:
            kernel_dtype = "float32" if X.dtype == np.float32 else "float64"
        if str(kernel_dtype) not in ("float64", "float32"):
            raise ValueError(f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}")
        self.kernel_dtype = str(kernel_dtype)
        if n_threads is not None and int(n_threads) < 1:
            raise ValueError(f"n_threads must be >= 1 or None, got {n_threads!r}")
        self.n_threads = n_threads
        self._nt = 1
        self._xb = None
        self._x_fp: str | None = None

    def _constants(self) -> dict[Any, Any]:
        self._nt = int(self.n_threads or task_threads(self.grid.n_lower_tiles()))
        if self._xb is None:
            tok = uuid.uuid4().hex[:12]
            self._xb = {
                (f"X-{tok}", i): self.X[self.grid.row_slice(i)]
                for i in range(self.grid.n_row_blocks)
            }
            self._xkeys = list(self._xb)
        return self._xb

    def _tile_task(self, i, j, vi, vj):
        xk = self._xkeys
        return (
            _free_tile_products, self.kernel, xk[i], xk[j], vi, vj, i == j, self.shift,
            self.kernel_dtype, self._nt,
        )  # fmt: skip

    def diagonal(self) -> np.ndarray:
        return np.asarray(self.kernel.diag(self.X), dtype=np.float64)

    def columns(self, idx: Sequence[int]) -> np.ndarray:
        idx = _check_idx(idx, self.n)
        Xc = self.X[idx]
        g = self.grid
        # pure=False: unique keys without hashing X's blocks on every call (RPCholesky
        # asks for columns every round)
        tasks = [
            dask.delayed(_free_columns, pure=False)(self.kernel, self.X[g.row_slice(i)], Xc)
            for i in range(g.n_row_blocks)
        ]
        return np.concatenate(compute(*tasks, progress=self.progress, desc="kernel columns"))

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        idx = _check_idx(idx, self.n)
        Xs = self.X[idx]
        return np.asarray(self.kernel(Xs, Xs), dtype=np.float64)

    @property
    def fingerprint(self) -> str:
        if self._x_fp is None:
            g = self.grid
            self._x_fp = fingerprint_blocks(self.X[g.row_slice(i)] for i in range(g.n_row_blocks))
        what = {
            "X": self._x_fp,
            "kernel": kernel_fingerprint(self.kernel),
            "n": self.n,
            "shift": self.shift,
        }
        if self.kernel_dtype != "float64":  # float64 fingerprints stay as before
            what["kernel_dtype"] = self.kernel_dtype
        return fingerprint_obj(what)

    def with_shift(self, shift: float) -> MatrixFreeKernelOperator:
        op = MatrixFreeKernelOperator.__new__(MatrixFreeKernelOperator)
        op.__dict__.update(self.__dict__)
        op.shift = check_shift(shift)
        return op

    def __repr__(self) -> str:
        return (
            f"MatrixFreeKernelOperator(n={self.n}, n_features={self.X.shape[1]}, "
            f"kernel={self.kernel!r}, block_size={self.grid.block_size}, shift={self.shift!r})"
        )


def _check_idx(idx: Sequence[int], n: int) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64).ravel()
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(
            f"column indices must lie in [0, {n}), got range [{idx.min()}, {idx.max()}]"
        )
    return idx


def make_operator(
    mode: str,
    shift: float,
    *,
    gram: TiledArray | None = None,
    X: Any = None,
    kernel: Kernel | str | dict | None = None,
    block_size: int = 2048,
    progress: bool = False,
) -> KernelOperator:
    """Build the operator for ``mode`` ``"stored"`` (needs ``gram``) or ``"matrix-free"``
    (needs ``X`` and ``kernel``)."""
    if mode == "stored":
        if gram is None:
            raise ValueError("mode='stored' needs gram= (the TiledArray of the stored Gram)")
        return StoredKernelOperator(gram, shift, progress=progress)
    if mode in ("matrix-free", "matrix_free", "free"):
        if X is None or kernel is None:
            raise ValueError("mode='matrix-free' needs X= and kernel=")
        return MatrixFreeKernelOperator(X, kernel, shift, block_size=block_size, progress=progress)
    raise ValueError(f"unknown matvec mode {mode!r}; use 'stored' or 'matrix-free'")
