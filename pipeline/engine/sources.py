"""Tile sources of the tile engine (:mod:`pipeline.engine.passes`).

A source produces the pieces of tile ``(i, j)`` a consumer asks for, from the
finished inputs of the task (row blocks ``xi``, ``xj``, or nothing for a
stored array): a whole tile (``tile``), the products ``K_ij V_j`` and
``K_ijᵀ V_i`` (``products``, a symmetric lower tile produced once and used
twice), ``K_ij A_j`` (``product``), selected entries (``pieces``) and the
diagonal (``diag``). Every method is a pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.engine.evaluators import is_fused
from pipeline.engine.fused import kernel_matvec, kernel_tile
from pipeline.kernels import Kernel, make_kernel

__all__ = ["CallableSource", "KernelSource", "StoredSource"]


class KernelSource:
    """Tiles ``K(X_i, Z_j)`` evaluated from input blocks by the fused evaluators.

    Parameters
    ----------
    kernel : Kernel, str or spec dict
    kernel_dtype : {"float64", "float32"}
        Evaluation dtype (sums longer than a sub-block are float64 either way).
    symmetric : bool
        ``Z`` is ``X``: a diagonal tile is evaluated as ``K(X_i, X_i)``
        (lower half, mirrored: exactly symmetric).
    n_threads : int
        Threads inside one tile task (the result does not depend on it).
    block_shape : (int, int), optional
        Sub-block shape of the fused evaluation (default: per kernel).
    tile_eval : {"fused", "kernel"}
        How a whole tile (:meth:`tile`, the store consumer) is evaluated: by
        the fused evaluators (a kernel they do not know: by the kernel object
        per sub-block, :mod:`pipeline.engine.evaluators`), or by the kernel
        object itself (``kernel(X_i)`` / ``kernel(X_i, Z_j)`` in the inputs'
        dtype: bitwise the tiles of the Gram stores written before issue #43,
        for recomputing theirs). Products and pieces are always fused.
    """

    def __init__(
        self,
        kernel: Kernel | str | dict,
        *,
        kernel_dtype: str = "float64",
        symmetric: bool = True,
        n_threads: int = 1,
        block_shape: tuple[int, int] | None = None,
        tile_eval: str = "fused",
    ) -> None:
        if tile_eval not in ("fused", "kernel"):
            raise ValueError(f"tile_eval must be 'fused' or 'kernel', got {tile_eval!r}")
        self.kernel = make_kernel(kernel)
        self.block_shape = block_shape
        self.tile_eval = tile_eval
        self.kernel_dtype = str(kernel_dtype)
        self.symmetric = symmetric
        self.n_threads = int(n_threads)
        self.needs_inputs = True

    def _kw(self) -> dict[str, Any]:
        return {
            "kernel_dtype": self.kernel_dtype,
            "n_threads": self.n_threads,
            "block_shape": self.block_shape,
        }

    def tile(
        self, i: int, j: int, xi: Any, xj: Any, dtype: Any = np.float64, out: Any = None
    ) -> np.ndarray:
        """Tile ``(i, j)`` in ``dtype``; written into ``out`` (C-contiguous, that shape
        and dtype) when given, e.g. a reused buffer (the bits do not depend on it)."""
        xi = np.asarray(xi)
        same = self.symmetric and i == j
        if self.tile_eval == "kernel":
            t = self.kernel(xi) if same else self.kernel(xi, np.asarray(xj))
            if out is None:
                return np.asarray(t, dtype=dtype)
            np.copyto(out, t, casting="unsafe")
            return out
        if out is None:
            shape = (xi.shape[0], xi.shape[0] if same else np.asarray(xj).shape[0])
            out = np.empty(shape, dtype)
        return kernel_tile(self.kernel, xi, None if same else xj, out, **self._kw())

    def products(self, i, j, xi, xj, vi, vj, shift=0.0):
        if self.symmetric and i == j:
            a = np.zeros_like(vj)
            kernel_matvec(self.kernel, xi, None, vj, a, **self._kw())
            if shift:
                a += shift * vj
            return a, None
        a = np.zeros((np.asarray(xi).shape[0], vj.shape[1]))
        b = np.zeros((np.asarray(xj).shape[0], vi.shape[1]))
        kernel_matvec(self.kernel, xi, xj, vj, a, True, Vi=vi, out_t=b, **self._kw())
        return a, b

    def product(self, i, j, xi, xj, aj):
        out = np.zeros((np.asarray(xi).shape[0], aj.shape[1]))
        same = self.symmetric and i == j
        kernel_matvec(self.kernel, xi, None if same else xj, aj, out, **self._kw())
        return out

    def pieces(self, i, j, xi, xj, rows_i, cols_j, rows_j, cols_i):
        """``K_ij[rows_i][:, cols_j]`` and ``K_ji[rows_j][:, cols_i]`` (None: skip)."""
        xi, xj = np.asarray(xi), np.asarray(xj)
        a = None if rows_i is None else self.piece(xi[rows_i], xj[cols_j])
        b = None if rows_j is None else self.piece(xj[rows_j], xi[cols_i])
        return a, b

    def piece(self, xr: np.ndarray, xc: np.ndarray) -> np.ndarray:
        """``K(xr, xc)`` in float64: fused in float64 (the kernel object for kernels
        the evaluators do not know)."""
        if not is_fused(self.kernel):
            return np.asarray(self.kernel(xr, xc), dtype=np.float64)
        out = np.empty((xr.shape[0], xc.shape[0]))
        kw = {**self._kw(), "kernel_dtype": "float64"}
        return kernel_tile(self.kernel, xr, xc, out, **kw)

    def diag(self, i, xi, xj):
        return np.asarray(self.kernel.diag(np.asarray(xi)), dtype=np.float64)


class StoredSource:
    """Tiles read from a stored tiled array (verified against their checksums).

    ``symmetric=True``: the array holds the lower tiles of a symmetric matrix
    and tile ``(i, j)`` with ``j > i`` is ``(j, i)`` transposed.
    """

    needs_inputs = False

    def __init__(self, array: Any, *, symmetric: bool = True) -> None:
        self.array = array
        self.symmetric = symmetric

    def tile(self, i, j, xi=None, xj=None, dtype=np.float64):
        a = self.array
        t = a.read_tile(j, i).T if self.symmetric and j > i else a.read_tile(i, j)
        return np.asarray(t, dtype=dtype)

    def products(self, i, j, xi, xj, vi, vj, shift=0.0):
        t = self.tile(i, j)
        a = t @ vj
        if i == j and self.symmetric:
            if shift:
                a += shift * vj
            return a, None
        return a, t.T @ vi

    def product(self, i, j, xi, xj, aj):
        return self.tile(i, j) @ aj

    def pieces(self, i, j, xi, xj, rows_i, cols_j, rows_j, cols_i):
        """Read tile ``(i, j)`` once; its piece and its transpose's (None: skip)."""
        t = self.array.read_tile(i, j)
        a = None if rows_i is None else t[rows_i][:, cols_j]
        b = None if rows_j is None else t[cols_i][:, rows_j].T
        return (
            None if a is None else np.asarray(a, dtype=np.float64),
            None if b is None else np.asarray(b, dtype=np.float64),
        )

    def diag(self, i, xi, xj):
        return np.diagonal(self.array.read_tile(i, i)).astype(np.float64)


class CallableSource:
    """Tiles ``kernel_fn(X_i)``: a callable giving a row block against every
    column (one column block); for estimators whose kernel is any callable
    (sparse inputs included)."""

    needs_inputs = True
    symmetric = False

    def __init__(self, kernel_fn: Callable[[Any], Any]) -> None:
        self.kernel_fn = kernel_fn

    def product(self, i, j, xi, xj, aj):
        return np.asarray(self.kernel_fn(xi)) @ aj
