"""float32 X must not silently give CG a float32 kernel (it stalled above tol)."""

from __future__ import annotations

import numpy as np

from pipeline import KernelRidge


def test_cg_with_float32_x_converges_like_float64(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((150, 4))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(150)
    kw = dict(kernel="rbf", gamma=0.5, alpha=1e-3, solver="cg", tol=1e-10, block_size=64)
    ref = KernelRidge(**kw, store=str(tmp_path / "a")).fit(X, y)
    f32 = KernelRidge(**kw, store=str(tmp_path / "b")).fit(X.astype(np.float32), y)
    # the float32 input is exactly representable in float64: same system, same answer
    ref2 = KernelRidge(**kw, store=str(tmp_path / "c")).fit(X.astype(np.float32).astype(float), y)
    np.testing.assert_allclose(f32.dual_coef_, ref2.dual_coef_, rtol=1e-8, atol=1e-8)
    assert ref.fit_info_ is not None
