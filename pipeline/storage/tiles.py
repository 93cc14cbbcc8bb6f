"""The tile grid: one ``block_size`` for Dask chunks, Zarr chunks and solver blocks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


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
