"""Float32 inputs: rows, X for CG, and a float32 factor in place.

A float32 factor in place needs X in memory to be refined: refused before any work.
Without a kept Gram or X, its alpha would be single precision; ``execute`` raises a
ValueError that names the fix before the Gram is built (nothing is written).

Float32 rows out of core: the kernel is evaluated in float64 from their values.

``KernelRidge(solver="cholesky", store=...)`` built the Gram of float32 rows in float32
(the kernels' own rule) and stored it as float64: at a small alpha the factor then
failed (not positive definite) where the same values as float64 factor fine, and at a
larger one it solved a rounded K. CG's products were already float64. Now every
out-of-core path gives, bit for bit, the fit of the same values as float64.

Float32 X must not silently give CG a float32 kernel (it stalled above tol).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.fit import execute
from pipeline.kernels import make_kernel
from pipeline.options import SolverOptions
from pipeline.plan.fit_plan import FitPlan


def test_float32_in_place_without_x_in_memory_is_refused_before_any_work(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = rng.normal(size=120)
    plan = FitPlan(
        solver="cholesky", alpha=0.1, block_size=50, factor_dtype="float32",
        options=SolverOptions(keep_gram=False),
    )  # fmt: skip
    root = tmp_path / "store"
    for x_arg, kernel in [(da.from_array(X, chunks=50), make_kernel("rbf")), (X, None)]:
        with pytest.raises(ValueError, match=r"float32.*keep_gram=False needs X in memory"):
            execute(plan, x_arg, y, kernel, root=str(root))
    assert not root.exists()  # refused before the Gram was built


def test_float32_with_a_kept_gram_is_still_allowed(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 3))
    y = rng.normal(size=120)
    k = make_kernel("rbf")
    plan = FitPlan(solver="cholesky", alpha=0.1, block_size=50, factor_dtype="float32")
    res = execute(plan, da.from_array(X, chunks=50), y, k, root=str(tmp_path / "s"))
    exact = np.linalg.solve(k(X) + 0.1 * np.eye(120), y)
    np.testing.assert_allclose(res.dual_coef, exact, rtol=1e-8, atol=1e-10)


def test_cg_on_a_float32_gram_needs_x_in_memory(tmp_path):
    """CG with the stored matvec on a float32 Gram is refined with float64 products
    from X; without X in memory it is refused before the solve (the Gram, the caller's,
    stays as it is)."""
    from pipeline.linalg.gram import build_gram

    rng = np.random.default_rng(2)
    X = rng.normal(size=(120, 3))
    y = rng.normal(size=120)
    k = make_kernel("rbf")
    gram = build_gram(X, k, str(tmp_path / "g"), 50, dtype="float32", progress=False)
    plan = FitPlan(
        solver="cg", alpha=1e-3, block_size=50, matvec="stored", options=SolverOptions(tol=1e-10)
    )
    with pytest.raises(ValueError, match="float32 Gram converges to the solution for the"):
        execute(plan, da.from_array(X, chunks=50), y, k, gram=gram)
    res = execute(plan, X, y, k, gram=gram)
    exact = np.linalg.solve(k(X) + 1e-3 * np.eye(120), y)
    np.testing.assert_allclose(res.dual_coef, exact, rtol=1e-7, atol=1e-9)


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
