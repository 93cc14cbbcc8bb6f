"""``pipeline.blas_guard.gram_t``: the package's large ``gᵀ g`` in SYRK panels.

numpy's bundled OpenBLAS segfaults in a 2-thread SYRK past an order that falls as the
inner dimension grows (order 16,384 at k = 2,048 on an AVX-512 Xeon, session 38;
``constants.SYRK_PANEL``). Reproducing the crash needs gigabytes and that CPU, so these
tests pin what the panels must keep: the same bits up to the panel, the same matrix (to
rounding, exactly symmetric) past it, and fingerprints that change only past it.
"""

from __future__ import annotations

import numpy as np
import pytest

import pipeline.constants as C
from pipeline import blas_guard
from pipeline.blas_guard import gram_t, gram_t_identity
from pipeline.kernels import RBF, Linear, Scaled, make_kernel
from pipeline.linalg.gram import gram_fingerprint
from pipeline.linalg.nystrom_solve import nystrom_solve


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_up_to_the_panel_it_is_one_syrk_bit_for_bit(dtype):
    g = np.random.default_rng(0).standard_normal((70, 300)).astype(dtype)
    np.testing.assert_array_equal(gram_t(g), g.T @ g)
    np.testing.assert_array_equal(gram_t(g, panel=300), g.T @ g)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m, panel", [(300, 100), (301, 100), (250, 64)])  # ragged panels too
def test_past_the_panel_the_same_matrix_exactly_symmetric(dtype, m, panel):
    g = np.random.default_rng(1).standard_normal((70, m)).astype(dtype)
    got = gram_t(g, panel=panel)
    ref = g.astype(np.float64).T @ g.astype(np.float64)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, got.T)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    # a transposed view: FALKON's T Tᵀ is gram_t(T.T)
    T = np.triu(np.random.default_rng(2).standard_normal((m, m))).astype(dtype)
    np.testing.assert_array_equal(gram_t(T.T), T @ T.T)
    np.testing.assert_allclose(gram_t(T.T, panel=panel), T @ T.T, rtol=0, atol=tol * m)


def test_the_fingerprint_names_the_panel_only_past_it(monkeypatch):
    assert gram_t_identity(C.SYRK_PANEL) == {}
    assert gram_t_identity(C.SYRK_PANEL + 1) == {"syrk_panel": C.SYRK_PANEL}
    # a Nyström solve with more centres than the panel: its sums go through the panels,
    # and its solution is the one-SYRK solution's
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 3))
    y = np.sin(X[:, 0])
    one = nystrom_solve(X, y, "rbf", 1e-2, n_centers=120, method="direct", cache_bytes=0)
    monkeypatch.setattr(C, "SYRK_PANEL", 50)
    calls = []
    real = blas_guard.gram_t

    def spy(g, panel=None):
        calls.append(g.shape[1])
        return real(g, panel)

    monkeypatch.setattr("pipeline.linalg.nystrom_solve.gram_t", spy)
    panelled = nystrom_solve(X, y, "rbf", 1e-2, n_centers=120, method="direct", cache_bytes=0)
    assert calls and set(calls) == {120}
    # (β itself is ill-determined: K_MM's condition number is 3e8; the fit is not)
    k = make_kernel("rbf")
    before, after = k(X, one.X_centres) @ one.coef, k(X, panelled.X_centres) @ panelled.coef
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()


def test_the_kernels_own_whole_matrix_products_take_the_panels(monkeypatch):
    # the generic path of a kernel (X Xᵀ, squared distances): the same bits up to the
    # panel, the same matrix past it
    X = np.random.default_rng(4).standard_normal((300, 40))
    kernels = (Linear(), RBF(gamma=0.05))
    before = [np.asarray(k(X)) for k in kernels]
    monkeypatch.setattr(C, "SYRK_PANEL", 300)
    for k, b in zip(kernels, before, strict=True):
        np.testing.assert_array_equal(np.asarray(k(X)), b)
    monkeypatch.setattr(C, "SYRK_PANEL", 64)
    for k, b in zip(kernels, before, strict=True):
        got = np.asarray(k(X))
        if isinstance(k, Linear):  # (the distances' |x|² + |y|² is added in row order)
            np.testing.assert_array_equal(got, got.T)
        np.testing.assert_allclose(got, b, rtol=0, atol=1e-12 * np.abs(b).max())


def test_a_gram_of_the_kernels_own_tiles_names_the_panel_past_it():
    fused, generic = RBF(gamma=0.1), Scaled(RBF(gamma=0.1), 2.0)
    large = C.SYRK_PANEL + 1
    fp = gram_fingerprint
    for k in (fused, generic):  # up to the panel: the recipe as it was
        assert fp("x", k, C.SYRK_PANEL, "float64") == _without_panel(fp, "x", k, C.SYRK_PANEL)
    # past it only the generic evaluation moves (the fused tiles never make one SYRK)
    assert fp("x", generic, large, "float64") != _without_panel(fp, "x", generic, large)
    assert fp("x", fused, large, "float64") == _without_panel(fp, "x", fused, large)


def _without_panel(fp, x, kernel, block):
    """The fingerprint ``fp`` gives when nothing is past the panel."""
    import pipeline.linalg.gram as gram_mod

    real = gram_mod.gram_t_identity
    gram_mod.gram_t_identity = lambda m: {}
    try:
        return fp(x, kernel, block, "float64")
    finally:
        gram_mod.gram_t_identity = real
