"""The tile grid: one ``block_size`` for Dask chunks, Zarr chunks and solver blocks; and
the copy of a tile between a host matrix and a tile buffer (:func:`copy_tile`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

#: columns per step of :func:`copy_tile` (a step of a 4,096-row tile: 2 MiB each side)
COPY_STRIPE = 64


def copy_tile(dst: np.ndarray, src: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
    """``dst[...] = src`` (only where ``where``, a boolean mask of the shape, is True), a
    stripe of :data:`COPY_STRIPE` of ``dst``'s columns (rows when F-ordered) at a time;
    returns ``dst``.

    Between C and F order (a tile of the F-ordered matrix of the in-memory Cholesky into
    the driver's C-ordered buffer, and back) NumPy's one copy crosses the whole tile per
    row or column; stripes whose rows stay in cache are several times faster
    (docs/PERFORMANCE.md#kin40ks-hard-case-at-12288-rows-our-exact-fits-against-scipys-and-scikit-learns). The stripes run along the destination's
    rows: into an F-ordered ``dst`` the copy is made as ``dst.T = src.T``. The values are
    copied, not computed: the same bits either way."""
    if dst.ndim == 2 and dst.strides[0] < dst.strides[1]:  # F-like: stripe its columns
        copy_tile(dst.T, src.T, None if where is None else where.T)
        return dst
    for c in range(0, src.shape[1], COPY_STRIPE):
        cols = slice(c, c + COPY_STRIPE)
        if where is None:
            dst[:, cols] = src[:, cols]
        else:
            np.copyto(dst[:, cols], src[:, cols], where=where[:, cols])
    return dst


@dataclass(frozen=True)
class TileGrid:
    """Square tiling of an ``n_rows x n_cols`` matrix; the last tile may be ragged.

    Parameters
    ----------
    n_rows, n_cols : int
        Matrix shape.
    block_size : int
        Edge of a full tile.
    """

    n_rows: int
    n_cols: int
    block_size: int

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.n_rows < 0 or self.n_cols < 0:
            raise ValueError(f"shape must be non-negative, got ({self.n_rows}, {self.n_cols})")

    @property
    def n_row_blocks(self) -> int:
        return -(-self.n_rows // self.block_size)

    @property
    def n_col_blocks(self) -> int:
        return -(-self.n_cols // self.block_size)

    def row_slice(self, i: int) -> slice:
        b = self.block_size
        return slice(i * b, min((i + 1) * b, self.n_rows))

    def col_slice(self, j: int) -> slice:
        b = self.block_size
        return slice(j * b, min((j + 1) * b, self.n_cols))

    def row_chunks(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in map(self.row_slice, range(self.n_row_blocks)))

    def col_chunks(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in map(self.col_slice, range(self.n_col_blocks)))

    def tiles(self) -> Iterator[tuple[int, int]]:
        """All tiles ``(i, j)`` in row-major order."""
        for i in range(self.n_row_blocks):
            for j in range(self.n_col_blocks):
                yield i, j

    def lower_tiles(self) -> Iterator[tuple[int, int]]:
        """Tiles with ``j <= i`` (the stored half of a symmetric matrix)."""
        for i in range(self.n_row_blocks):
            for j in range(min(i + 1, self.n_col_blocks)):
                yield i, j

    def n_lower_tiles(self) -> int:
        n = self.n_row_blocks
        return n * (n + 1) // 2
