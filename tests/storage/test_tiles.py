"""``pipeline.storage.tiles``: the tile grid's ragged last tiles, and :func:`copy_tile`
between the memory orders of a host matrix and a tile buffer."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.storage.tiles import COPY_STRIPE, TileGrid, copy_tile


def test_the_last_tiles_are_ragged():
    g = TileGrid(10, 7, 4)
    assert g.row_chunks() == (4, 4, 2) and g.col_chunks() == (4, 3)
    assert list(g.lower_tiles()) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert g.n_lower_tiles() == 6  # (of the square grid of 3 row blocks)


@pytest.mark.parametrize("shape", [(5, 3), (130, 129), (70, 2 * COPY_STRIPE + 1)])
@pytest.mark.parametrize(("src_order", "dst_order"), [("F", "C"), ("C", "F"), ("C", "C")])
def test_copy_tile_copies_every_entry_across_orders(shape, src_order, dst_order):
    rng = np.random.default_rng(0)
    big = np.asarray(rng.standard_normal((shape[0] + 9, shape[1] + 11)), order=src_order)
    src = big[4 : 4 + shape[0], 3 : 3 + shape[1]]  # a tile of a larger matrix: strided
    dst = np.zeros(shape, order=dst_order)
    assert copy_tile(dst, src) is dst
    np.testing.assert_array_equal(dst, src)
    # into a tile of a larger matrix (the in-memory Cholesky's target): strided too
    host = np.zeros((shape[0] + 5, shape[1] + 6), order=dst_order)
    dst = host[2 : 2 + shape[0], 1 : 1 + shape[1]]
    assert copy_tile(dst, src) is dst
    assert not host[:2].any() and not host[2 + shape[0] :].any() and not host[:, :1].any()
    np.testing.assert_array_equal(dst, src)
    # masked: the lower triangle of a diagonal tile only, the rest kept
    square = src[:, : min(shape)][: min(shape)]
    keep = np.full(square.shape, 7.0, order=dst_order)
    lower = np.tri(square.shape[0], dtype=bool)
    copy_tile(keep, square, lower)
    np.testing.assert_array_equal(keep, np.where(lower, square, 7.0))
