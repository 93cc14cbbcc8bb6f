"""Float32 rows out of core: the kernel is evaluated in float64 from their values.

``KernelRidge(solver="cholesky", store=...)`` built the Gram of float32 rows in float32
(the kernels' own rule) and stored it as float64: at a small alpha the factor then
failed (not positive definite) where the same values as float64 factor fine, and at a
larger one it solved a rounded K. CG's products were already float64. Now every
out-of-core path gives, bit for bit, the fit of the same values as float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge


@pytest.mark.parametrize(
    "kw",
    [
        {"solver": "cholesky"},
        {"solver": "cholesky", "keep_gram": False},
        {"solver": "cg", "tol": 1e-10},
    ],
)
def test_float32_rows_fit_as_their_float64_values(tmp_path, kw):
    rng = np.random.default_rng(0)
    X32 = rng.uniform(size=(600, 2)).astype(np.float32)
    y = np.sin(6 * X32[:, 0].astype(np.float64))
    common = dict(alpha=1e-6, kernel="rbf", gamma=1.0, block_size=250, **kw)
    exact = KernelRidge(**common, store=str(tmp_path / "f64")).fit(X32.astype(np.float64), y)
    got = KernelRidge(**common, store=str(tmp_path / "f32")).fit(X32, y)
    np.testing.assert_array_equal(got.dual_coef_, exact.dual_coef_)
