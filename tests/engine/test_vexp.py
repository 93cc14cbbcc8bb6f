"""The engine's exp (pipeline.engine.vexp), float64 and float32: accuracy, special
values, the same bits whatever the layout or the SIMD path, and the pins that tie its
bits to EXP_ID and EXP32_ID."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pipeline.engine.evaluators import evaluation_identity
from pipeline.engine.vexp import EXP32_ID, EXP_ID, exp_inplace
from pipeline.kernels import RBF, Laplacian, Linear, Matern, Polynomial, make_kernel


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(want)


def test_within_one_ulp_of_numpy_over_the_whole_range():
    x = np.linspace(-760.0, 720.0, 400_001)
    got = exp_inplace(x.copy())
    with np.errstate(over="ignore"):
        want = np.exp(x)
    normal = np.isfinite(want) & (want >= np.finfo(np.float64).tiny)
    assert _ulps(got[normal], want[normal]).max() <= 1.0
    # subnormal results: within one unit of the smallest subnormal
    sub = np.isfinite(want) & ~normal
    assert sub.any() and np.abs(got[sub] - want[sub]).max() <= np.spacing(0.0)
    assert np.array_equal(np.isinf(got), np.isinf(want))


def test_within_one_ulp_on_kernel_exponents():
    rng = np.random.default_rng(0)
    x = -rng.exponential(4.0, 200_000)
    got = exp_inplace(x.copy())
    want = np.exp(x)
    assert _ulps(got, want).max() <= 1.0
    assert np.mean(got == want) > 0.8  # mostly the correctly rounded value


def test_special_values():
    x = np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-300, -1e-300, -745.2, -746.0, 709.7,
                  709.8, -708.5, -720.0, 705.0, -705.0, 1.0])  # fmt: skip
    got = exp_inplace(x.copy())
    with np.errstate(over="ignore"):
        want = np.exp(x)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 1024, 1025, 3000])
def test_bits_do_not_depend_on_the_length_or_the_position(n):
    # the SIMD body and the scalar remainder give the same bits, at any offset of a chunk
    rng = np.random.default_rng(n)
    x = -rng.exponential(3.0, n)
    whole = exp_inplace(x.copy())
    one_by_one = np.array([exp_inplace(np.array([v]))[0] for v in x])
    np.testing.assert_array_equal(whole, one_by_one)
    shifted = exp_inplace(np.concatenate([[0.5, 0.25, 0.125], x]))[3:]
    np.testing.assert_array_equal(whole, shifted)


def test_a_strided_view_gets_the_contiguous_bits():
    rng = np.random.default_rng(1)
    A = -rng.exponential(2.0, (64, 96))
    want = exp_inplace(A.copy())
    B = A.copy()
    exp_inplace(B[:, ::2])  # non-contiguous: computed on a copy, written back
    np.testing.assert_array_equal(B[:, ::2], want[:, ::2])
    np.testing.assert_array_equal(B[:, 1::2], A[:, 1::2])  # the rest untouched
    C = np.asfortranarray(A)
    np.testing.assert_array_equal(exp_inplace(C), want)


def _exp32_reference(x: np.ndarray) -> np.ndarray:
    """float32 exp rounded from float64's (correctly rounded but for rare double roundings)."""
    with np.errstate(over="ignore"):
        return np.exp(x.astype(np.float64)).astype(np.float32)


def test_float32_within_one_ulp_over_the_whole_range():
    x = np.linspace(-110.0, 95.0, 400_001, dtype=np.float32)
    got = exp_inplace(x.copy())
    assert got.dtype == np.float32
    want = _exp32_reference(x)
    normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
    assert _ulps(got[normal], want[normal]).max() <= 1.0
    sub = np.isfinite(want) & ~normal
    assert sub.any() and np.abs(got[sub] - want[sub]).max() <= np.spacing(np.float32(0))
    assert np.array_equal(np.isinf(got), np.isinf(want))


def test_float32_within_one_ulp_on_kernel_exponents():
    x = -np.random.default_rng(3).exponential(4.0, 200_000).astype(np.float32)
    got = exp_inplace(x.copy())
    want = _exp32_reference(x)
    assert _ulps(got, want).max() <= 1.0
    assert np.mean(got == want) > 0.8


def test_float32_special_values():
    x = np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-30, -1e-30, -87.3, -87.4, -100.0,
                  -103.2, -103.3, -104.5, -200.0, 88.7, 88.73, 89.5, 80.5, -80.5, 1.0],
                 dtype=np.float32)  # fmt: skip
    got = exp_inplace(x.copy())
    want = _exp32_reference(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin], want[~fin])  # nan and inf
    assert np.all((got[fin] == want[fin]) | (_ulps(got[fin], want[fin]) <= 1.0)), (got, want)
    assert got[1] == 0.0 and got[2] == np.inf and got[3] == 1.0 and got[4] == 1.0


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1023, 1024, 1025, 3000])
def test_float32_bits_do_not_depend_on_the_length_or_the_position(n):
    x = -np.random.default_rng(n).exponential(3.0, n).astype(np.float32)
    whole = exp_inplace(x.copy())
    one_by_one = np.array([exp_inplace(np.array([v]))[0] for v in x])
    np.testing.assert_array_equal(whole, one_by_one)
    pad = np.array([0.5, 0.25, 0.125], dtype=np.float32)
    np.testing.assert_array_equal(whole, exp_inplace(np.concatenate([pad, x]))[3:])


def test_other_dtypes_and_empty_arrays():
    x = np.linspace(-20, 5, 1001, dtype=np.float16)
    np.testing.assert_array_equal(exp_inplace(x.copy()), np.exp(x))  # np.exp
    assert exp_inplace(np.empty((0, 3))).shape == (0, 3)
    assert exp_inplace(np.empty((0, 3), dtype=np.float32)).shape == (0, 3)


#: sha256 of exp_inplace(np.linspace(-50, 5, 100_001)), recorded with EXP_ID below. If it
#: moves, the stored Grams made with the old bits must not be reused: change EXP_ID (it
#: enters their fingerprints through evaluation_identity), then this pin.
BITS_PIN = ("fma-taylor13-v1", "00455f80d018956343f5bc6583681dc78ce2333fefa971a670125364410c4a22")


#: the same for float32: exp_inplace(np.linspace(-90, 5, 100_001, dtype=float32)), EXP32_ID
BITS32_PIN = (
    "fma-taylor7-f32-v1",
    "0356bf8cebe88fd7bf280636baf8ab5a952ab441c4074fe2d5b4f4377fb3de2e",
)


def test_the_bits_are_pinned_to_exp_id():
    got = hashlib.sha256(exp_inplace(np.linspace(-50.0, 5.0, 100_001)).tobytes()).hexdigest()
    assert (EXP_ID, got) == BITS_PIN
    x32 = np.linspace(-90.0, 5.0, 100_001, dtype=np.float32)
    got32 = hashlib.sha256(exp_inplace(x32).tobytes()).hexdigest()
    assert (EXP32_ID, got32) == BITS32_PIN


def test_evaluation_identity_names_the_exp_where_it_makes_the_bits():
    for k in (RBF(gamma=0.5), Matern(nu=1.5), Laplacian(gamma=0.3), RBF(length_scale=[1.0, 2.0])):
        assert evaluation_identity(k, "float64") == {"exp": EXP_ID}
        assert evaluation_identity(k, np.float64) == {"exp": EXP_ID}
        assert evaluation_identity(k, "float32") == {"exp": EXP32_ID}
    for k in (Linear(), Polynomial(degree=2), make_kernel("rbf") + make_kernel("linear")):
        assert evaluation_identity(k, "float64") == {}  # no exp, or the generic path
        assert evaluation_identity(k, "float32") == {}
    assert evaluation_identity("precomputed", "float64") == {}


def test_compiles_without_a_writable_cache_location(monkeypatch):
    """A read-only install: numba refuses cache=True; the kernel is compiled uncached,
    with the same bits."""
    import numba

    from pipeline.engine import vexp

    x = -np.random.default_rng(2).exponential(3.0, 5000)
    want = exp_inplace(x.copy())
    want32 = exp_inplace(x.astype(np.float32))
    real = numba.njit

    def njit(*args, cache=False, **kw):
        if cache:
            raise RuntimeError("cannot cache function: no locator available for file")
        return real(*args, **kw)

    monkeypatch.setattr(numba, "njit", njit)
    monkeypatch.setattr(vexp, "_compiled", None)
    np.testing.assert_array_equal(exp_inplace(x.copy()), want)
    np.testing.assert_array_equal(exp_inplace(x.astype(np.float32)), want32)
    assert vexp._compiled is not None
