"""A float32 factor (float64 diagonal tiles) refined to double precision against the Gram."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.linalg
from test_cholesky import rbf_matrix, rel, write_gram

from pipeline.linalg.cholesky import tile_cholesky
from pipeline.linalg.triangular import cholesky_solve


@pytest.mark.parametrize("n, block_size", [(203, 64), (150, 150), (301, 37)])
def test_float32_factor_then_refined_alpha_matches_float64(tmp_path, n, block_size):
    K = rbf_matrix(n, seed=2)
    gram = write_gram(tmp_path, K, block_size)
    lam = 1e-3
    f = tile_cholesky(gram, lam, dtype=np.float32, progress=False)
    assert np.dtype(f.L.dtype) == np.float32
    ref_L = scipy.linalg.cholesky(K + lam * np.eye(n), lower=True)
    err_l = rel(f.L.zarr("r")[:].astype(np.float64), ref_L)
    assert 1e-9 < err_l < 1e-3  # single precision: clearly not a float64 factor
    y = np.random.default_rng(0).standard_normal((n, 2))
    want = scipy.linalg.solve(K + lam * np.eye(n), y, assume_a="pos")
    stats: dict = {}
    got = cholesky_solve(f, y, gram=gram, stats=stats)
    assert rel(got, want) < 1e-10
    assert stats["rel_residual"] <= 1e-11 and stats["refine_iterations"] >= 1
    with pytest.warns(UserWarning, match="single precision"):
        rough = cholesky_solve(f, y)
    assert 1e-12 < rel(rough, want) < 1e-2


def test_ill_conditioned_system_is_refined_by_preconditioned_cg(tmp_path):
    """Condition 2e7 (lambda=1e-5): plain refinement would shrink the residual only
    about 2x per step; CG preconditioned by the float32 factor gets there quickly."""
    n = 240
    K = rbf_matrix(n, d=2, gamma=0.05, seed=4)
    gram = write_gram(tmp_path, K, 64)
    lam = 1e-5
    f = tile_cholesky(gram, lam, dtype=np.float32, progress=False)
    y = np.random.default_rng(1).standard_normal(n)
    stats: dict = {}
    got = cholesky_solve(f, y, gram=gram, refine_tol=1e-9, stats=stats)
    A = K + lam * np.eye(n)
    assert np.linalg.norm(y - A @ got) / np.linalg.norm(y) <= 1e-9
    assert stats["refine_iterations"] <= 20
    want = scipy.linalg.solve(A, y, assume_a="pos")
    assert rel(got, want) < 1e-6  # condition 2e7 times the residual


def test_float32_factor_has_its_own_fingerprint(tmp_path):
    K = rbf_matrix(120)
    gram = write_gram(tmp_path, K, 50)
    a = tile_cholesky(gram, 1e-3, name="c64", progress=False)
    b = tile_cholesky(gram, 1e-3, name="c32", dtype="float32", progress=False)
    assert a.L.fingerprint != b.L.fingerprint
    with pytest.raises(ValueError, match="float64 or float32"):
        tile_cholesky(gram, 1e-3, name="c16", dtype="float16", progress=False)


def test_estimator_float32_factor_matches_sklearn(tmp_path):
    from sklearn.kernel_ridge import KernelRidge as SkKR

    from pipeline import KernelRidge

    rng = np.random.default_rng(5)
    X = rng.standard_normal((230, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(230)
    kw = dict(alpha=1e-3, kernel="rbf", gamma=0.3)
    ours = KernelRidge(
        **kw, solver="cholesky", block_size=64, store=tmp_path / "s", factor_dtype="float32"
    ).fit(X, y)
    ref = SkKR(**kw).fit(X, y)
    Xt = rng.standard_normal((40, 4))
    np.testing.assert_allclose(ours.predict(Xt), ref.predict(Xt), rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match="factor_dtype"):
        KernelRidge(**kw, solver="cholesky", factor_dtype="half").fit(X, y)


def test_refinement_that_stops_short_raises_instead_of_returning_alpha(tmp_path):
    """No exit 0 with a wrong number: a float32 factor's refinement that cannot reach
    its tolerance within max_iter is an error, not a warning and a quiet alpha."""
    from pipeline.linalg.cg import CGConvergenceError
    from pipeline.linalg.triangular import refine_solution

    n = 240
    K = rbf_matrix(n, d=2, gamma=0.05, seed=4)
    gram = write_gram(tmp_path, K, 64)
    f = tile_cholesky(gram, 1e-5, dtype=np.float32, progress=False)
    y = np.random.default_rng(1).standard_normal(n)
    alpha0 = np.zeros(n)
    with pytest.raises(CGConvergenceError, match="did not converge"):
        refine_solution(f, gram, 1e-5, y, alpha0, tol=1e-15, max_iter=1)


@pytest.mark.parametrize("scheduler", ["threads", "dask"])
def test_float32_diagonal_tiles_factor_in_one_reused_float64_scratch(
    tmp_path, monkeypatch, scheduler
):
    """Each float32 diagonal tile is factored in float64 in a scratch tile that the
    previous diagonal tile gave back (pipeline.storage.buffers), not in new memory: one
    new scratch per tile shape. The factor is the float64 POTRF of each diagonal tile
    cast to float32, as before."""
    from pipeline.storage import buffers

    n, b = 5 * 64 + 29, 64  # five full diagonal tiles and a ragged one
    # a float32 Gram (as in place): no float64 read buffer takes the scratch in between
    K = rbf_matrix(n, seed=7).astype(np.float32).astype(np.float64)
    gram = write_gram(tmp_path, K.astype(np.float32), b)
    new: list[tuple] = []
    real_take = buffers.take

    def take(shape, dtype, first_touch=None):
        key = (tuple(int(s) for s in shape), np.dtype(dtype).str)
        scratch = sys._getframe(1).f_code.co_name == "_float64_scratch"  # not a Gram read
        if scratch and not buffers._FREE.get(key):
            new.append(key[0])
        return real_take(shape, dtype, first_touch)

    monkeypatch.setattr(buffers, "take", take)
    buffers.release()  # none waiting from an earlier factorisation in this process
    lam = 1e-3
    f = tile_cholesky(gram, lam, dtype=np.float32, scheduler=scheduler, progress=False)
    assert sorted(new) == [(29, 29), (b, b)]
    # the first diagonal tile: K + lam*I in float32, its float64 POTRF rounded to float32
    a = K[:b, :b].astype(np.float32)
    a[np.diag_indices_from(a)] += lam
    want = scipy.linalg.cholesky(a.astype(np.float64), lower=True).astype(np.float32)
    np.testing.assert_array_equal(np.tril(f.L.read_tile(0, 0)), want)


def test_float32_factor_with_jitter_keeps_the_tile_it_retries(tmp_path):
    """A rank-deficient Gram, lambda 0, float32 factor: every failed diagonal POTRF is
    retried from the tile as it was (the float64 scratch is overwritten by the failed
    attempt), and L Lᵀ is K plus the recorded block-diagonal jitter to float32 rounding."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 3))
    K = X @ X.T
    gram = write_gram(tmp_path, K, 40)
    f = tile_cholesky(gram, 0.0, dtype=np.float32, jitter=1e-6, progress=False)
    assert f.jitter
    L = np.tril(f.L.zarr("r")[:].astype(np.float64))
    D = np.zeros_like(K)
    for key, eps in f.jitter.items():
        j = int(key.split(".")[0])
        s = slice(40 * j, min(150, 40 * (j + 1)))
        D[s, s] += eps * np.eye(s.stop - s.start)
    assert rel(L @ L.T, K + D) < 1e-5
