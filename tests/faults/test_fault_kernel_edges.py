"""Kernel and tile-engine edges found by the session-26 review (each fails on the old code)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.kernels import RBF, Linear, Scaled, Sum, Warped


def test_a_float32_gram_that_overflows_is_refused(tmp_path):
    from pipeline.linalg.gram import build_gram

    X = np.random.default_rng(13).standard_normal((60, 3)) * 1e20  # K ~ 1e40: float64 only
    for kd in (None, "float64"):
        from pipeline.linalg.cholesky_options import NonFiniteKernelError

        with pytest.raises(NonFiniteKernelError, match="overflows float32 storage"):
            build_gram(X, Linear(), str(tmp_path / f"g{kd}"), 25, dtype="float32",
                       kernel_dtype=kd, progress=False)  # fmt: skip


def test_float64_evaluation_of_float32_rows_is_float64_for_composites():
    from pipeline.engine import kernel_tile

    X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    ref = RBF(gamma=0.5)(X.astype(np.float64))
    for k in (Scaled(RBF(gamma=0.5), 1.0), Sum(RBF(gamma=0.5), Scaled(RBF(gamma=0.5), 0.0))):
        out = np.empty((50, 50))
        kernel_tile(k, X, None, out, kernel_dtype="float64")
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13)


def test_a_refused_nested_set_params_changes_nothing():
    k = Sum(RBF(gamma=1.0), RBF(gamma=1.0))
    with pytest.raises(ValueError, match="gamma"):
        k.set_params(k1__gamma=0.5, k2__gamma=-1.0)
    assert k.k1.gamma == 1.0 and k.k2.gamma == 1.0
    s = Scaled(RBF(gamma=1.0), 1.0)
    with pytest.raises(ValueError, match="gamma"):
        s.set_params(weight=5.0, kernel__gamma=-3.0)
    assert s.weight == 1.0 and s.kernel.gamma == 1.0


def test_check_mercer_does_not_depend_on_the_kernels_scale():
    from pipeline.kernels import check_mercer, make_kernel

    X = np.random.default_rng(1).standard_normal((80, 3))
    for w in (1.0, 1e-12):
        rep = check_mercer(Scaled(make_kernel("sigmoid"), w), X)
        assert not rep.psd, w
        assert check_mercer(Scaled(RBF(), w), X).psd, w


def test_auto_with_a_store_fits_a_callable_warped_kernel_in_memory(tmp_path):
    from pipeline import KernelRidge

    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((200, 3)), rng.standard_normal(200)
    m = KernelRidge(kernel=Warped(RBF(), lambda Z: 2 * Z), store=str(tmp_path / "s")).fit(X, y)
    assert m.solver_ == "dense"


def test_a_refused_set_params_keeps_the_users_nested_objects():
    inner = RBF(gamma=0.5)
    k = Sum(Sum(inner, RBF()), RBF())
    with pytest.raises(ValueError, match="gamma"):
        k.set_params(k1__k1__gamma=0.1, k2__gamma=-1.0)
    assert k.k1.k1 is inner and inner.gamma == 0.5  # the user's object, its old value
