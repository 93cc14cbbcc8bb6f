"""Blockwise forward/back substitution with the stored factor (pipeline.solvers.triangular)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from pipeline.kernels import RBF
from pipeline.solvers import (
    back_substitution,
    cholesky_solve,
    forward_substitution,
    tile_cholesky,
)
from pipeline.storage import fingerprint_obj, open_tiled_array


def rbf_matrix(n: int, d: int = 4, gamma: float = 0.3, seed: int = 0) -> np.ndarray:
    return RBF(gamma=gamma)(np.random.default_rng(seed).standard_normal((n, d)))


def write_gram(store, K: np.ndarray, block_size: int):
    n = K.shape[0]
    g = open_tiled_array(str(store), "gram", (n, n), block_size, K.dtype, fingerprint_obj([n]))
    for i, j in g.grid.lower_tiles():
        g.write_tile(i, j, K[g.grid.row_slice(i), g.grid.col_slice(j)])
    return g


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("n, block_size", [(211, 64), (150, 50), (77, 100), (260, 33)])
@pytest.mark.parametrize("convention", ["sklearn", "n"])
@pytest.mark.parametrize("n_outputs", [None, 1, 3])
def test_solve_matches_reference_dual_solve(tmp_path, n, block_size, convention, n_outputs):
    K = rbf_matrix(n, seed=n)
    rng = np.random.default_rng(1)
    y = rng.standard_normal(n if n_outputs is None else (n, n_outputs))
    lam = 1e-3 if convention == "sklearn" else 1e-5
    shift = lam if convention == "sklearn" else n * lam
    f = tile_cholesky(write_gram(tmp_path, K, block_size), lam, convention=convention)
    alpha = cholesky_solve(f, y)
    ref = scipy.linalg.solve(K + shift * np.eye(n), y, assume_a="pos")
    assert alpha.shape == y.shape and alpha.dtype == np.float64
    assert rel(alpha, ref) < 1e-10


def test_forward_and_back_are_the_triangular_solves(tmp_path):
    n, b = 180, 47
    K = rbf_matrix(n)
    f = tile_cholesky(write_gram(tmp_path, K, b), 1e-2)
    L = scipy.linalg.cholesky(K + 1e-2 * np.eye(n), lower=True)
    y = np.random.default_rng(0).standard_normal((n, 2))
    z = forward_substitution(f, y)
    assert rel(z, scipy.linalg.solve_triangular(L, y, lower=True)) < 1e-10
    a = back_substitution(f.L, z)  # a bare TiledArray works too
    assert rel(a, scipy.linalg.solve_triangular(L.T, z, lower=False)) < 1e-10
    np.testing.assert_array_equal(y, np.random.default_rng(0).standard_normal((n, 2)))


def test_alpha_written_to_zarr(tmp_path):
    import zarr

    n, b = 130, 40
    K = rbf_matrix(n)
    f = tile_cholesky(write_gram(tmp_path, K, b), 1e-2)
    y = np.random.default_rng(2).standard_normal((n, 4))
    alpha = cholesky_solve(f, y, name="alpha")
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert arr.shape == (n, 4) and arr.chunks == (b, 4)
    np.testing.assert_array_equal(arr[:], alpha)
    fp = arr.attrs["fingerprint"]
    assert fp != f.L.fingerprint
    cholesky_solve(f, 2 * y, name="alpha")  # other targets: other fingerprint, replaced
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert arr.attrs["fingerprint"] != fp
    np.testing.assert_allclose(arr[:], 2 * alpha, rtol=1e-12)


def test_one_d_y_stored_as_column(tmp_path):
    import zarr

    n = 90
    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(n), 32), 1e-2)
    y = np.linspace(-1, 1, n)
    alpha = cholesky_solve(f, y, name="alpha")
    arr = zarr.open_array(store=str(tmp_path), path="alpha", mode="r")
    assert alpha.shape == (n,) and arr.shape == (n, 1)
    np.testing.assert_array_equal(arr[:, 0], alpha)


@pytest.mark.parametrize(
    "y, match",
    [
        (np.ones(59), "y has 59 rows but the factor is 60 x 60"),
        (np.ones((60, 2, 2)), "1-D or 2-D"),
        (np.r_[np.ones(59), np.nan], "NaN"),
    ],
)
def test_bad_y(tmp_path, y, match):
    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(60), 25), 1e-2)
    with pytest.raises(ValueError, match=match):
        cholesky_solve(f, y)


def test_solve_releases_the_factor_tile_cache(tmp_path):
    import pipeline.solvers.cholesky as chol

    f = tile_cholesky(write_gram(tmp_path, rbf_matrix(100), 30), 1e-2)
    keys = [k for k in chol._CACHE._d if k[:3] == (f.L.store, f.L.name, f.L.fingerprint)]
    assert keys, "the factorisation leaves its tiles cached for the solve"
    alpha = cholesky_solve(f, np.ones(100))
    assert not [k for k in chol._CACHE._d if k[:3] == (f.L.store, f.L.name, f.L.fingerprint)]
    # without the cache the tiles come from Zarr: same answer
    np.testing.assert_array_equal(cholesky_solve(f, np.ones(100)), alpha)


def test_tile_cache_budget_is_respected():
    from pipeline.solvers.cholesky import _TileCache

    c = _TileCache(budget=3 * 800)
    for k in range(5):
        c.put(("s", k), np.zeros(100))  # 800 bytes each
    assert c.nbytes <= 3 * 800 and c.get(("s", 0)) is None and c.get(("s", 4)) is not None
    c.drop(("s",))
    assert c.nbytes == 0
