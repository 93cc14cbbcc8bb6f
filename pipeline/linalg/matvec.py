"""Blockwise kernel operators: ``V -> (K + shift·I) V`` without holding K in memory.

Two operators share one interface (:class:`KernelOperator`):

- :class:`StoredKernelOperator` streams the lower tiles of a stored Gram (array
  ``"gram"``, tiles ``(i, j)`` with ``j <= i``) and uses each off-diagonal tile
  twice, for ``K_ij v_j`` and ``K_ijᵀ v_i``;
- :class:`MatrixFreeKernelOperator` recomputes each lower kernel tile from X on
  the fly, again using it twice, through the fused engine
  (:func:`pipeline.engine.kernel_matvec`: cache-sized pieces, the tile is never
  formed). Memory is O(N·D + a few tiles) and no store is needed.

Every pass is a specification on the tile engine (:mod:`pipeline.engine.passes`):
the lower tile set, a source (:class:`~pipeline.engine.passes.StoredSource` or
:class:`~pipeline.engine.passes.KernelSource`) and a consumer (products summed
per row block in a fixed order, gathered columns, the diagonal). The graphs run
through :func:`pipeline.engine.parallel.compute`, so they use whatever scheduler the
caller opened. Besides ``matvec``, both operators expose ``diagonal``,
``columns`` and ``submatrix`` (for Jacobi and Nyström preconditioners).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.engine import device, task_threads
from pipeline.engine import passes as engine
from pipeline.engine.evaluators import evaluation_identity
from pipeline.kernels import Kernel, kernel_fingerprint, make_kernel
from pipeline.storage import (
    IncompleteArrayError,
    TiledArray,
    TileGrid,
    fingerprint_blocks,
    fingerprint_obj,
)

__all__ = [
    "DeviceKernelOperator",
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


def _rows_in_memory(X: Any) -> np.ndarray:
    """X as a finite, non-empty 2-D host array (a Dask array is computed once)."""
    if hasattr(X, "compute") and not isinstance(X, np.ndarray):
        X = X.compute()
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] < 1:
        raise ValueError(f"X must be a non-empty 2-D array (n_samples, n_features), got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinite values; clean or impute them first")
    return X


def _kernel_dtype(kernel_dtype: Any, X: np.ndarray) -> str:
    """The products' kernel dtype: as given, else float32 iff X is float32."""
    if kernel_dtype is None:
        kernel_dtype = "float32" if X.dtype == np.float32 else "float64"
    if str(kernel_dtype) not in ("float64", "float32"):
        raise ValueError(f"kernel_dtype must be 'float64' or 'float32', got {kernel_dtype!r}")
    return str(kernel_dtype)


class KernelOperator:
    """Interface of a symmetric positive definite operator ``A = K + shift·I``.

    Subclasses implement ``_source`` (the engine's tile source) and
    ``_inputs`` (X, for a source evaluated from X), ``fingerprint`` and
    ``with_shift``; ``matvec``, ``diagonal``, ``columns`` and ``submatrix``
    are engine passes.

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
    def _source(self) -> Any:
        raise NotImplementedError

    def _inputs(self) -> Any:
        return None

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
        out = engine.matvec(
            self._source(), self.grid.row_chunks(), V2, self._inputs(),
            shift=self.shift, progress=self.progress,
        )  # fmt: skip
        return out[:, 0] if one_d else out

    __call__ = matvec

    def __matmul__(self, V: np.ndarray) -> np.ndarray:
        return self.matvec(V)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.n)

    # -- pieces of K for preconditioners --------------------------------------
    def diagonal(self) -> np.ndarray:
        """Diagonal of K (without the shift), shape ``(n,)``."""
        return engine.diagonal(self._source(), self.grid.row_chunks(), self._inputs())

    def columns(self, idx: Sequence[int]) -> np.ndarray:
        """Columns ``K[:, idx]``, shape ``(n, len(idx))``; each needed lower tile once."""
        idx = _check_idx(idx, self.n)
        return self._gather(np.arange(self.n), idx, "kernel columns")

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        """``K[idx][:, idx]`` (without the shift)."""
        idx = _check_idx(idx, self.n)
        return self._gather(idx, idx, "kernel submatrix")

    def _gather(self, rows: np.ndarray, cols: np.ndarray, desc: str) -> np.ndarray:
        return engine.gather(
            self._source(), self.grid.row_chunks(), rows, cols, self._inputs(),
            progress=self.progress and desc == "kernel columns",
        )  # fmt: skip

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
            missing = set(engine.pending(gram.markers, self.grid.lower_tiles()))
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

    def _source(self) -> engine.StoredSource:
        return engine.StoredSource(self.gram)

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
        sub-block are float64 either way; see :mod:`pipeline.engine.fused`).
        Default: float32 iff ``X`` is float32, the kernels' own rule.
    n_threads : int, optional
        Threads inside each tile task. Default
        (:func:`pipeline.engine.task_threads`): cores divided by the tile tasks
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
        X = _rows_in_memory(X)
        if int(block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size!r}")
        self.X = X
        self.kernel = make_kernel(kernel)
        self.n = int(X.shape[0])
        self.shift = check_shift(shift)
        self.grid = TileGrid(self.n, self.n, int(block_size))
        self.progress = progress
        kernel_dtype = _kernel_dtype(kernel_dtype, X)
        self.kernel_dtype = str(kernel_dtype)
        if n_threads is not None and int(n_threads) < 1:
            raise ValueError(f"n_threads must be >= 1 or None, got {n_threads!r}")
        self.n_threads = n_threads
        self._xb: list[np.ndarray] | None = None
        self._x_fp: str | None = None

    def _source(self) -> engine.KernelSource:
        nt = int(self.n_threads or task_threads(self.grid.n_lower_tiles()))
        return engine.KernelSource(self.kernel, kernel_dtype=self.kernel_dtype, n_threads=nt)

    def _inputs(self) -> Any:
        if self._xb is None:  # the row blocks of X, cut once, reused by every product
            self._xb = [self.X[self.grid.row_slice(i)] for i in range(self.grid.n_row_blocks)]
        return self._xb

    @property
    def fingerprint(self) -> str:
        if self._x_fp is None:
            self._x_fp = _x_fingerprint(self.X, self.grid)
        return fingerprint_obj(_matrix_free_recipe(self))

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


def _x_fingerprint(X: np.ndarray, grid: TileGrid) -> str:
    """Hash of the training inputs X (row blocks of ``grid``; the hash does not depend
    on the blocking)."""
    return fingerprint_blocks(X[grid.row_slice(i)] for i in range(grid.n_row_blocks))


def _matrix_free_recipe(op: Any) -> dict[str, Any]:
    """What a kernel operator computed from X hashes (its ``_x_fp``, ``kernel``, ``n``,
    ``shift``, ``kernel_dtype``): :class:`MatrixFreeKernelOperator`'s fingerprint recipe."""
    what = {
        "X": op._x_fp,
        "kernel": kernel_fingerprint(op.kernel),
        "n": op.n,
        "shift": op.shift,
    }
    if op.kernel_dtype != "float64":  # float64 fingerprints stay as before
        what["kernel_dtype"] = op.kernel_dtype
    what.update(evaluation_identity(op.kernel, op.kernel_dtype))  # the engine's exp
    return what


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
    kernel_dtype: str | None = None,
) -> KernelOperator:
    """Build the operator for ``mode`` ``"stored"`` (needs ``gram``) or ``"matrix-free"``
    (needs ``X`` and ``kernel``; ``kernel_dtype`` as in :class:`MatrixFreeKernelOperator`)."""
    if mode == "stored":
        if gram is None:
            raise ValueError("mode='stored' needs gram= (the TiledArray of the stored Gram)")
        return StoredKernelOperator(gram, shift, progress=progress)
    if mode in ("matrix-free", "matrix_free", "free"):
        if X is None or kernel is None:
            raise ValueError("mode='matrix-free' needs X= and kernel=")
        return MatrixFreeKernelOperator(
            X, kernel, shift, block_size=block_size, progress=progress, kernel_dtype=kernel_dtype
        )
    raise ValueError(f"unknown matvec mode {mode!r}; use 'stored' or 'matrix-free'")


# ---------------------------------------------------------------------------
# on a device backend (the GPU)
# ---------------------------------------------------------------------------
class DeviceKernelOperator(KernelOperator):
    """``K + shift·I`` on a :class:`~pipeline.engine.backend.Backend` (a GPU through
    CuPy), the kernel blocks recomputed from X at every product
    (:class:`pipeline.engine.device.DeviceKernel`: X uploaded once).

    Host arrays in, host arrays out: CG (:func:`pipeline.linalg.cg.conjugate_gradient`)
    and the Nyström builder (:func:`pipeline.linalg.precond.build_nystrom`: ``n``,
    ``diagonal``, ``columns``, ``submatrix``) run on it unchanged, with the kernel
    work on the device. The one exception: ``columns(idx, on_device=True)`` gives a
    backend array, with which the builder's pivoted Cholesky keeps its factor on the
    device (it finds the device through :attr:`backend`).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Training inputs; a Dask array is computed once.
    kernel : Kernel, str or spec dict
    shift : float
        Added to the diagonal (λ or nλ). Must be > 0.
    backend : Backend or str
        Where the kernel work runs (``"cupy"``; ``"numpy"`` and
        ``"array_api_strict"`` run the same device-generic code on the host).
    kernel_dtype : {"float64", "float32"}, optional
        As in :class:`MatrixFreeKernelOperator` (float32: float32 entries and block
        products, float64 sums). Default: float32 iff ``X`` is float32.
    block_rows : int, optional
        Block edge of the products (default
        :func:`pipeline.engine.device.default_block_rows`: from device memory).
    """

    def __init__(
        self,
        X: Any,
        kernel: Kernel | str | dict,
        shift: float,
        *,
        backend: Any,
        kernel_dtype: str | None = None,
        block_rows: int | None = None,
    ) -> None:
        X = _rows_in_memory(X)
        kernel_dtype = _kernel_dtype(kernel_dtype, X)
        self.X = X
        self.kernel = make_kernel(kernel)
        self.n = int(X.shape[0])
        self.shift = check_shift(shift)
        self.kernel_dtype = str(kernel_dtype)
        self.device_kernel = device.DeviceKernel(
            backend, self.kernel, X, kernel_dtype=self.kernel_dtype, block_rows=block_rows
        )
        self.backend = self.device_kernel.be
        b = self.device_kernel.block_rows or device.default_block_rows(self.backend)
        self.grid = TileGrid(self.n, self.n, int(b))
        self._x_fp: str | None = None

    def matvec(self, V: np.ndarray) -> np.ndarray:
        """Return ``(K + shift·I) @ V`` for ``V`` of shape ``(n,)`` or ``(n, m)``."""
        return self.device_kernel.matvec(V, shift=self.shift)

    __call__ = matvec

    def diagonal(self) -> np.ndarray:
        return self.device_kernel.diagonal()

    def columns(self, idx: Sequence[int], *, on_device: bool = False) -> Any:
        """``K[:, idx]`` (float64): on the host, or with ``on_device`` an array of
        :attr:`backend` (:meth:`pipeline.engine.device.DeviceKernel.columns`)."""
        return self.device_kernel.columns(_check_idx(idx, self.n), on_device=on_device)

    def submatrix(self, idx: Sequence[int]) -> np.ndarray:
        return self.device_kernel.submatrix(_check_idx(idx, self.n))

    @property
    def fingerprint(self) -> str:
        if self._x_fp is None:
            self._x_fp = _x_fingerprint(self.X, self.grid)
        return fingerprint_obj({**_matrix_free_recipe(self), "device": self.backend.name})

    def with_shift(self, shift: float) -> DeviceKernelOperator:
        op = DeviceKernelOperator.__new__(DeviceKernelOperator)
        op.__dict__.update(self.__dict__)  # the uploaded X is shared
        op.shift = check_shift(shift)
        return op

    def __repr__(self) -> str:
        return (
            f"DeviceKernelOperator(n={self.n}, n_features={self.X.shape[1]}, "
            f"kernel={self.kernel!r}, backend={self.backend.name!r}, shift={self.shift!r})"
        )
