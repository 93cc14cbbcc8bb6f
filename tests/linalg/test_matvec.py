"""Both kernel operators against a dense (K + shift I) @ V."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pipeline.kernels import RBF, Laplacian
from pipeline.linalg.matvec import (
    MatrixFreeKernelOperator,
    StoredKernelOperator,
    make_operator,
)
from pipeline.storage import open_tiled_array


def write_gram(store, K: np.ndarray, block_size: int, fingerprint: str = "test-gram"):
    """Store the lower tiles of a dense symmetric K as array 'gram' (upper tiles left empty)."""
    n = K.shape[0]
    g = open_tiled_array(str(store), "gram", (n, n), block_size, K.dtype, fingerprint)
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def _max_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(203, 4))
    kernel = RBF(gamma=0.3)
    return X, kernel, kernel(X)


@pytest.mark.parametrize("block_size", [64, 50, 203, 400])
@pytest.mark.parametrize("ncols", [None, 1, 3])
def test_both_operators_match_dense(tmp_path, problem, block_size, ncols):
    X, kernel, K = problem
    n = K.shape[0]
    shift = 0.37
    rng = np.random.default_rng(1)
    V = rng.normal(size=(n,) if ncols is None else (n, ncols))
    expected = K @ V + shift * V
    gram = write_gram(tmp_path, K, block_size)
    stored = StoredKernelOperator(gram, shift)
    free = MatrixFreeKernelOperator(X, kernel, shift, block_size=block_size)
    for op in (stored, free):
        out = op.matvec(V)
        assert out.shape == V.shape
        assert _max_rel(out, expected) <= 1e-12, type(op).__name__
    # the operator is also usable as a callable and with @
    assert _max_rel(free(V), expected) <= 1e-12
    assert _max_rel(stored @ V, expected) <= 1e-12


def test_stored_operator_reads_only_lower_tiles(tmp_path, problem):
    X, kernel, K = problem
    gram = write_gram(tmp_path, K, 64)
    # poison the upper tiles: a correct operator never reads them
    z = gram.zarr("r+")
    for i, j in gram.grid.tiles():
        if j > i:
            z[gram.grid.row_slice(i), gram.grid.col_slice(j)] = np.nan
    op = StoredKernelOperator(gram, 1.0)
    v = np.random.default_rng(2).normal(size=K.shape[0])
    assert _max_rel(op.matvec(v), K @ v + v) <= 1e-12
    idx = [0, 70, 202, 5, 150]
    np.testing.assert_allclose(op.columns(idx), K[:, idx], rtol=0, atol=1e-15)
    np.testing.assert_allclose(op.submatrix(idx), K[np.ix_(idx, idx)], rtol=0, atol=1e-15)
    np.testing.assert_allclose(op.diagonal(), np.diag(K), rtol=0, atol=1e-15)


def test_stored_columns_read_each_tile_once(tmp_path, problem, monkeypatch):
    """RPCholesky asks for columns every round: each needed lower tile is read once."""
    from pipeline.storage import TiledArray

    X, kernel, K = problem
    gram = write_gram(tmp_path, K, 64)
    op = StoredKernelOperator(gram, 1.0)
    reads: list[tuple[int, int]] = []
    orig = TiledArray.read_tile

    def counting(self, i, j=0, verify=True):
        reads.append((i, j))
        return orig(self, i, j, verify)

    monkeypatch.setattr(TiledArray, "read_tile", counting)
    idx = [202, 0, 70, 70, 5, 150]  # unsorted, a duplicate, several tiles, the ragged one
    np.testing.assert_allclose(op.columns(idx), K[:, idx], rtol=0, atol=1e-15)
    assert sorted(reads) == sorted(set(reads)) == sorted(gram.grid.lower_tiles())
    reads.clear()
    np.testing.assert_allclose(op.submatrix(idx), K[np.ix_(idx, idx)], rtol=0, atol=1e-15)
    blocks = sorted({i // 64 for i in idx})
    assert sorted(reads) == [(i, c) for i in blocks for c in blocks if c <= i]


def test_matrix_free_pieces_match_dense(problem):
    X, _, _ = problem
    kernel = Laplacian(gamma=0.5)  # a non-RBF kernel, non-constant columns
    K = kernel(X)
    op = MatrixFreeKernelOperator(X, kernel, 1e-3, block_size=60)
    idx = [202, 0, 61, 61]
    np.testing.assert_allclose(op.columns(idx), K[:, idx], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(op.submatrix(idx), K[np.ix_(idx, idx)], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(op.diagonal(), np.diag(K))
    V = np.random.default_rng(3).normal(size=(K.shape[0], 2))
    assert _max_rel(op.matvec(V), K @ V + 1e-3 * V) <= 1e-12


def test_incomplete_gram_is_refused(tmp_path, problem):
    _, _, K = problem
    n = K.shape[0]
    g = open_tiled_array(str(tmp_path), "gram", (n, n), 64, K.dtype, "fp")
    g.write_tile(0, 0, K[:64, :64])
    with pytest.raises(ValueError, match="incomplete"):
        StoredKernelOperator(g, 1.0)


def test_fingerprints_and_with_shift(tmp_path, problem):
    X, kernel, K = problem
    a = MatrixFreeKernelOperator(X, kernel, 0.1, block_size=64)
    b = MatrixFreeKernelOperator(X, kernel, 0.1, block_size=100)
    assert a.fingerprint == b.fingerprint  # independent of the tiling
    c = a.with_shift(0.2)
    assert c.fingerprint != a.fingerprint and c.shift == 0.2 and a.shift == 0.1
    v = np.ones(K.shape[0])
    assert _max_rel(c.matvec(v), K @ v + 0.2 * v) <= 1e-12
    d = MatrixFreeKernelOperator(X, RBF(gamma=0.31), 0.1)
    assert d.fingerprint != a.fingerprint
    gram = write_gram(tmp_path, K, 64)
    s = make_operator("stored", 0.1, gram=gram)
    assert s.fingerprint != s.with_shift(0.3).fingerprint


@pytest.mark.parametrize("shift", [0.0, -1.0, np.nan, np.inf, "a"])
def test_bad_shift(problem, shift):
    X, kernel, _ = problem
    with pytest.raises(ValueError, match="shift"):
        MatrixFreeKernelOperator(X, kernel, shift)


def test_bad_inputs(problem):
    X, kernel, _ = problem
    op = MatrixFreeKernelOperator(X, kernel, 1.0, block_size=64)
    with pytest.raises(ValueError, match="length 203"):
        op.matvec(np.ones(10))
    with pytest.raises(ValueError, match="indices"):
        op.columns([0, 203])
    Xbad = X.copy()
    Xbad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        MatrixFreeKernelOperator(Xbad, kernel, 1.0)
    with pytest.raises(ValueError, match="matvec mode"):
        make_operator("dense", 1.0, X=X, kernel=kernel)
    with pytest.raises(ValueError, match="gram="):
        make_operator("stored", 1.0)


@pytest.mark.slow
def test_matvec_under_a_distributed_client(tmp_path, problem, monkeypatch):
    from pipeline import constants as C
    from pipeline.engine.parallel import dask_client

    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 0)  # on the workers, not here
    X, kernel, K = problem
    gram = write_gram(tmp_path, K, 64)
    V = np.random.default_rng(4).normal(size=(K.shape[0], 2))
    expected = K @ V + 0.5 * V
    # picklable operators: what a process-based cluster would ship to its workers
    for op in (StoredKernelOperator(gram, 0.5), MatrixFreeKernelOperator(X, kernel, 0.5)):
        back = pickle.loads(pickle.dumps(op))
        assert _max_rel(back.matvec(V), expected) <= 1e-12
    with dask_client(n_workers=2, memory_limit="1GiB", processes=False):
        for op in (
            StoredKernelOperator(gram, 0.5),
            MatrixFreeKernelOperator(X, kernel, 0.5, block_size=64),
        ):
            assert _max_rel(op.matvec(V), expected) <= 1e-12
