"""Tile Cholesky of K + shift*I from the stored Gram's lower tiles (pipeline.linalg.cholesky)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from _tiles import rbf_matrix, rel, write_gram

from pipeline.errors import NotPositiveDefiniteError
from pipeline.linalg.cholesky import (
    JitterPolicy,
    factor_fingerprint,
    load_factor,
    tile_cholesky,
)
from pipeline.storage import StoreMismatchError, open_tiled_array


@pytest.mark.parametrize(
    "n, block_size",
    [(203, 64), (250, 100), (130, 130), (90, 200), (301, 37)],
)
@pytest.mark.parametrize("convention", ["sklearn", "n"])
def test_matches_scipy(tmp_path, n, block_size, convention):
    K = rbf_matrix(n)
    gram = write_gram(tmp_path, K, block_size)
    before = gram.zarr("r")[:]
    lam = 1e-3 if convention == "sklearn" else 1e-5
    f = tile_cholesky(gram, lam, convention=convention, progress=False)
    shift = lam if convention == "sklearn" else n * lam
    assert f.shift == pytest.approx(shift)
    ref = scipy.linalg.cholesky(K + shift * np.eye(n), lower=True)
    L = f.L.zarr("r")[:]
    assert rel(L, ref) < 1e-10  # upper tiles never written (zeros), upper of diag tiles cleaned
    np.testing.assert_array_equal(gram.zarr("r")[:], before)  # the Gram is never modified
    assert set(f.computed) == set(gram.grid.lower_tiles())


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_schedulers_agree(tmp_path, scheduler):
    n, b = 260, 48
    K = rbf_matrix(n, seed=3)
    gram = write_gram(tmp_path, K, b)
    f = tile_cholesky(gram, 1e-2, scheduler=scheduler, name=f"chol-{scheduler}", progress=False)
    ref = scipy.linalg.cholesky(K + 1e-2 * np.eye(n), lower=True)
    assert rel(f.L.zarr("r")[:], ref) < 1e-10
    assert f.L.markers.done() == set(gram.grid.lower_tiles())


def test_float32_gram_factored_in_float64(tmp_path):
    n = 150
    K = rbf_matrix(n, seed=1).astype(np.float32)
    gram = write_gram(tmp_path, K, 64)
    f = tile_cholesky(gram, 1e-2, progress=False)
    assert np.dtype(f.L.dtype) == np.float64
    ref = scipy.linalg.cholesky(K.astype(np.float64) + 1e-2 * np.eye(n), lower=True)
    assert rel(f.L.zarr("r")[:], ref) < 1e-10


def test_fingerprint_chains_to_gram_lambda_convention_jitter(tmp_path):
    K = rbf_matrix(80)
    gram = write_gram(tmp_path, K, 32)
    base = factor_fingerprint(gram, 1e-3, "sklearn", None, np.float64)
    assert base == factor_fingerprint(gram, 1e-3, "sklearn", None, np.float64)
    others = {
        factor_fingerprint(gram, 2e-3, "sklearn", None, np.float64),
        factor_fingerprint(gram, 1e-3, "n", None, np.float64),
        factor_fingerprint(gram, 1e-3, "sklearn", JitterPolicy(), np.float64),
    }
    gram2 = write_gram(tmp_path / "other", K, 32, tag="other-data")
    others.add(factor_fingerprint(gram2, 1e-3, "sklearn", None, np.float64))
    assert base not in others and len(others) == 4
    f = tile_cholesky(gram, 1e-3, progress=False)
    assert f.L.fingerprint == base
    attrs = f.L.zarr("r").attrs
    assert attrs["gram_fingerprint"] == gram.fingerprint and attrs["lambda"] == 1e-3


def test_other_lambda_replaces_or_refuses(tmp_path):
    K = rbf_matrix(100)
    gram = write_gram(tmp_path, K, 40)
    tile_cholesky(gram, 1e-3, progress=False)
    with pytest.raises(StoreMismatchError):
        tile_cholesky(gram, 1e-1, overwrite=False, progress=False)
    f = tile_cholesky(gram, 1e-1, progress=False)  # default: a stale factor is replaced
    assert len(f.computed) == gram.grid.n_lower_tiles()
    ref = scipy.linalg.cholesky(K + 0.1 * np.eye(100), lower=True)
    assert rel(f.L.zarr("r")[:], ref) < 1e-10
    g = load_factor(gram.store, "chol")
    assert g.lam == 0.1 and g.L == f.L


def indefinite_matrix(n: int, r: int) -> np.ndarray:
    """Identity with the indefinite 2x2 block [[1, 2], [2, 1]] on rows r, r+1."""
    A = np.eye(n)
    A[r, r + 1] = A[r + 1, r] = 2.0
    return A


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_not_pd_error_names_tile_pivot_lambda_options(tmp_path, scheduler):
    n, b, r = 100, 30, 65  # rows 65, 66 are in tile 2 (rows 60..89)
    gram = write_gram(tmp_path, indefinite_matrix(n, r), b)
    with pytest.raises(NotPositiveDefiniteError) as ei:
        tile_cholesky(gram, 0.5, convention="sklearn", scheduler=scheduler, progress=False)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.tile == (2, 2) and e.row == r + 1 and e.pivot == r + 1 - 60 + 1
    msg = str(e)
    for part in ["(2, 2)", f"pivot {e.pivot}", "lambda=0.5", "'sklearn'", "jitter", "solver='cg'"]:
        assert part in msg
    # tiles finished before the failure are stored; the failing one has no marker
    f_done = open_tiled_array(
        gram.store,
        "chol",
        (n, n),
        b,
        np.float64,
        factor_fingerprint(gram, 0.5, "sklearn", None, np.float64),
    ).markers.done()
    assert (2, 2) not in f_done and (0, 0) in f_done


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
@pytest.mark.parametrize("where", ["diagonal", "off-diagonal tile", "inside a diagonal tile"])
def test_a_non_finite_kernel_value_is_named_not_factored(tmp_path, scheduler, where):
    # an overflowing kernel (inf in the Gram) gave a NaN factor, and the solve then said
    # "y contains NaN or infinity" (session 25)
    K = rbf_matrix(100)
    r, c = {"diagonal": (70, 70), "off-diagonal tile": (70, 5), "inside a diagonal tile": (70, 65)}[
        where
    ]
    K[r, c] = K[c, r] = np.inf
    gram = write_gram(tmp_path, K, 30)
    with pytest.raises(ValueError, match="non-finite value .* standardise X"):
        tile_cholesky(gram, 0.1, scheduler=scheduler, progress=False)


def test_psd_kernel_with_zero_lambda_is_actionable(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    gram = write_gram(tmp_path, X @ X.T, 50)  # linear kernel: rank 3
    with pytest.raises(NotPositiveDefiniteError, match=r"lambda=0\.0.*larger alpha/lambda"):
        tile_cholesky(gram, 0.0, progress=False)


def test_a_float32_factor_that_loses_definiteness_says_float64_would_do(tmp_path):
    K = rbf_matrix(300, d=2, gamma=0.05)  # smooth: eigenvalues fall far below float32's 6e-8
    gram = write_gram(tmp_path, K, 100)
    tile_cholesky(gram, 1e-9, progress=False, store=str(tmp_path), name="f64")  # float64: fine
    with pytest.raises(NotPositiveDefiniteError, match="factor_dtype='float64'") as ei:
        tile_cholesky(gram, 1e-9, progress=False, store=str(tmp_path), dtype="float32")
    assert ei.value.factor_dtype == "float32" and "The factor is float32" in str(ei.value)
    import pickle

    again = pickle.loads(pickle.dumps(ei.value))  # crosses Dask workers whole
    assert again.factor_dtype == "float32" and str(again) == str(ei.value)


def test_jitter_retries_and_records(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    K = X @ X.T  # PSD, rank 3: every tile after the first needs jitter
    gram = write_gram(tmp_path, K, 50)
    f = tile_cholesky(gram, 0.0, jitter=1e-8, progress=False)
    assert f.jitter, "a rank-3 Gram with lambda=0 must need jitter"
    # L L^T is exactly K + D, D the recorded block-diagonal jitter
    D = np.zeros(120)
    for key, eps in f.jitter.items():
        j = int(key.split(".")[0])
        D[gram.grid.row_slice(j)] = eps
        assert f.L.markers.record((j, j))["jitter"] == eps
    assert f.L.zarr("r").attrs["jitter"] == f.jitter
    L = f.L.zarr("r")[:]
    assert rel(L @ L.T, K + np.diag(D)) < 1e-10
    for key, eps in f.jitter.items():  # try t adds 1e-8 * 10**t * mean(diag(K_jj))
        j = int(key.split(".")[0])
        t = np.log10(eps / (1e-8 * np.mean(np.diag(K)[gram.grid.row_slice(j)])))
        assert abs(t - round(t)) < 1e-9 and 0 <= round(t) < 8


def test_jitter_gives_up_with_record(tmp_path):
    gram = write_gram(tmp_path, indefinite_matrix(40, 5), 16)
    with pytest.raises(NotPositiveDefiniteError, match="Jitter was tried up to") as ei:
        tile_cholesky(gram, 0.0, jitter={"initial": 1e-12, "max_tries": 3}, progress=False)
    assert len(ei.value.jitter_tried) == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lam": -1.0}, "lambda must be"),
        ({"lam": float("nan")}, "lambda must be"),
        ({"lam": 1.0, "convention": "N"}, "convention must be"),
        ({"lam": 1.0, "scheduler": "loop"}, "scheduler must be"),
        ({"lam": 1.0, "jitter": "yes"}, "jitter must be"),
        ({"lam": 1.0, "jitter": {"initial": 0}}, "jitter policy"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    gram = write_gram(tmp_path, rbf_matrix(30), 16)
    lam = kwargs.pop("lam")
    with pytest.raises(ValueError, match=match):
        tile_cholesky(gram, lam, progress=False, **kwargs)


def test_incomplete_gram_is_refused(tmp_path):
    K = rbf_matrix(60)
    g = open_tiled_array(str(tmp_path), "gram", (60, 60), 25, np.float64, "fp-partial")
    g.write_tile(0, 0, K[:25, :25])
    with pytest.raises(ValueError, match="incomplete.*5 of 6 lower tiles"):
        tile_cholesky(g, 1e-3, progress=False)
