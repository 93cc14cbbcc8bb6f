"""The ``exp`` of the fused evaluators: vectorised, and the same bits everywhere.

The RBF, Matérn and Laplacian tiles spend most of their time in ``exp`` once the GEMM
has made the exponent. NumPy's float64 ``exp`` is vectorised only on CPUs with
AVX-512; elsewhere it calls the C library's scalar ``exp`` (6.4 to 7.0 ns an entry on
an AVX2 EPYC, against 2.3 ns for float32). And its bits depend on the CPU and the C
library, so the same tile had other bits on another machine.

:func:`exp_inplace` computes ``exp`` in place with one algorithm, written out here and
compiled by numba (loops of plain arithmetic, which LLVM vectorises on any SIMD width):

- range reduction ``x = k·ln 2 + r``, ``|r| ≤ ln 2 / 2``: ``k`` by the round-to-nearest
  shift ``1.5·2⁵²``, ``r`` by Cody and Waite's two-part ``ln 2`` (its high part has
  trailing zero bits, so ``k·LN2_HI`` is exact);
- ``exp(r)`` by its Taylor polynomial of degree 13 in Horner form (truncation error
  below 2e-16 relative on the range);
- ``2^k`` built from its bits; for ``|x| > 700`` the scaling is split in two exact
  steps (``2^±100`` into the polynomial first), so subnormal results are rounded once
  and overflow gives ``inf``.

Every multiply-add is an explicit fused multiply-add (``llvm.fma``), never left to the
compiler's choice of contraction, and no step is reassociated: each entry's bits are a
fixed function of its input, whatever the SIMD width (scalar remainder included), the
CPU or the LLVM version. On a CPU without FMA instructions the same bits come from a
slower software FMA.

Accuracy: within 1 ulp of the correctly rounded ``exp`` over ``[-745, 709.7]``
(94 % of entries equal to glibc's); ``nan`` stays ``nan``, ``-inf`` gives 0 and
``+inf`` gives ``inf``. Speed: docs/PERFORMANCE.md#the-engines-float64-exp.

**float32** runs the same algorithm at single width (8 lanes on AVX2): a 15-bit
``LN2_HI``, the shift ``1.5·2²³``, the Taylor polynomial of degree 7 (truncation below
6e-9 relative), the scaling split by ``2^±32`` beyond ``|x| > 80``. Speed and
accuracy: docs/PERFORMANCE.md#the-engines-float32-exp.

:data:`EXP_ID` (float64) and :data:`EXP32_ID` (float32) name the algorithm in the fingerprints of stored results whose bits it
makes (:func:`pipeline.engine.evaluators.evaluation_identity`): a store written with
NumPy's ``exp`` is recomputed, never mixed with these bits.

numba is imported on the first call, not with the package.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from pipeline.engine.compiled import njit, warms_up
from pipeline.engine.parallel import native_lock

__all__ = ["EXP32_ID", "EXP_ID", "exp_inplace"]

#: the algorithm's name in fingerprints: change it whenever a bit of the output can change
EXP_ID = "fma-taylor13-v1"
#: the float32 width's name (degree 7): the same rule
EXP32_ID = "fma-taylor7-f32-v1"

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # 32 significant bits: k·_LN2_HI is exact for |k| < 2²¹
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0  # 1.5·2⁵²: fma(x, log2 e, SHIFT) - SHIFT rounds x·log2 e to an integer
_SHIFT_BITS = int(np.array(_SHIFT).view(np.int64))
_TAYLOR = tuple(1.0 / math.factorial(i) for i in range(14))
_CHUNK = 1024  # entries per pass: the chunk and its scale factors stay in L1

_TWO_M100 = 2.0**-100
_TWO_100 = 2.0**100

_compiled: dict[np.dtype, Callable[[np.ndarray], None]] | None = None


def _fma(a: float, b: float, c: float) -> float:
    """``a·b + c`` rounded once; replaced by ``llvm.fma.f64`` in :func:`_build`."""
    raise NotImplementedError  # pragma: no cover - never called uncompiled


def _poly_loop(a: np.ndarray, t: np.ndarray) -> None:  # pragma: no cover - compiled
    """``a[i]`` <- ``exp(r)`` (times ``2^±100`` where ``|x| > 700``); ``t[i]`` <- SHIFT + k."""
    c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13 = _TAYLOR[2:14]
    for i in range(a.size):
        x = a[i]
        xc = -750.0 if x < -750.0 else x  # nan passes both clamps
        xc = 710.0 if xc > 710.0 else xc
        kf = _fma(xc, _LOG2E, _SHIFT) - _SHIFT
        r = _fma(-kf, _LN2_LO, _fma(-kf, _LN2_HI, xc))
        p = _fma(c13, r, c12)
        p = _fma(p, r, c11)
        p = _fma(p, r, c10)
        p = _fma(p, r, c9)
        p = _fma(p, r, c8)
        p = _fma(p, r, c7)
        p = _fma(p, r, c6)
        p = _fma(p, r, c5)
        p = _fma(p, r, c4)
        p = _fma(p, r, c3)
        p = _fma(p, r, c2)
        p = _fma(p, r, 1.0)
        p = _fma(p, r, 1.0)
        low = x < -700.0
        high = x > 700.0
        adj = -100.0 if low else (100.0 if high else 0.0)
        t[i] = (kf - adj) + _SHIFT
        a[i] = p * (_TWO_M100 if low else (_TWO_100 if high else 1.0))


def _bits_loop(t: np.ndarray) -> None:  # pragma: no cover - compiled
    """``t[i]`` holds the bits of SHIFT + k, which are SHIFT's plus k: make them ``2^k``'s."""
    for i in range(t.size):
        t[i] = (t[i] - _SHIFT_BITS + 1023) << 52


def _scale_loop(a: np.ndarray, s: np.ndarray) -> None:  # pragma: no cover - compiled
    for i in range(a.size):
        a[i] *= s[i]


# -- float32: the same algorithm at single width ------------------------------------------
# Cody-Waite with a 15-bit LN2_HI (k·LN2_HI32 exact for |k| < 2⁹), the shift 1.5·2²³, the
# Taylor polynomial of degree 7 (truncation below 6e-9 relative: a tenth of float32's
# ulp), the scaling split by 2^±32 beyond |x| > 80; typed constants, so that numba keeps
# every step in float32
_LOG2E32 = np.float32(_LOG2E)
_LN2_HI32 = np.float32(0.693145751953125)
_LN2_LO32 = np.float32(1.4286068203094173e-06)
_SHIFT32 = np.float32(12582912.0)  # 1.5·2²³
_SHIFT32_BITS = int(np.array(_SHIFT32).view(np.int32))
_TAYLOR32 = tuple(np.float32(c) for c in _TAYLOR[:8])
_LO32, _HI32 = np.float32(-104.0), np.float32(89.0)
_EDGE32 = np.float32(80.0)
_ADJ32 = np.float32(32.0)
_ZERO32, _ONE32 = np.float32(0.0), np.float32(1.0)
_TWO_M32 = np.float32(2.0**-32)
_TWO_32 = np.float32(2.0**32)


def _fma32(a: float, b: float, c: float) -> float:
    """``a·b + c`` in float32 rounded once; replaced by ``llvm.fma.f32`` in :func:`_build`."""
    raise NotImplementedError  # pragma: no cover - never called uncompiled


def _poly_loop32(a: np.ndarray, t: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`_poly_loop` for float32."""
    c2, c3, c4, c5, c6, c7 = _TAYLOR32[2:8]
    for i in range(a.size):
        x = a[i]
        xc = _LO32 if x < _LO32 else x  # nan passes both clamps
        xc = _HI32 if xc > _HI32 else xc
        kf = _fma32(xc, _LOG2E32, _SHIFT32) - _SHIFT32
        r = _fma32(-kf, _LN2_LO32, _fma32(-kf, _LN2_HI32, xc))
        p = _fma32(c7, r, c6)
        p = _fma32(p, r, c5)
        p = _fma32(p, r, c4)
        p = _fma32(p, r, c3)
        p = _fma32(p, r, c2)
        p = _fma32(p, r, _ONE32)
        p = _fma32(p, r, _ONE32)
        low = x < -_EDGE32
        high = x > _EDGE32
        adj = -_ADJ32 if low else (_ADJ32 if high else _ZERO32)
        t[i] = (kf - adj) + _SHIFT32
        a[i] = p * (_TWO_M32 if low else (_TWO_32 if high else _ONE32))


def _bits_loop32(t: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`_bits_loop` for float32: the bits of SHIFT32 + k made ``2^k``'s."""
    for i in range(t.size):
        t[i] = (t[i] - _SHIFT32_BITS + 127) << 23


def _exp_chunks32(a: np.ndarray) -> None:  # pragma: no cover - compiled
    """:func:`_exp_chunks` for float32."""
    n = a.size
    bits = np.empty(_CHUNK, np.int32)
    scale = bits.view(np.float32)
    for c0 in range(0, n, _CHUNK):
        m = min(n, c0 + _CHUNK) - c0
        blk = a[c0 : c0 + m]
        _poly32(blk, scale[:m])
        _bits32(bits[:m])
        _scale(blk, scale[:m])


def _exp_chunks(a: np.ndarray) -> None:  # pragma: no cover - compiled
    """``a[...] = exp(a)`` for a 1-D contiguous float64 array, ``_CHUNK`` entries at a time.

    Three compiled loops per chunk, each of plain arithmetic on distinct arrays, so that
    LLVM vectorises each (one loop over all three steps, with the scale factors' two
    views of one buffer, was not vectorised: 6.8 ns an entry).
    """
    n = a.size
    bits = np.empty(_CHUNK, np.int64)
    scale = bits.view(np.float64)
    for c0 in range(0, n, _CHUNK):
        m = min(n, c0 + _CHUNK) - c0
        blk = a[c0 : c0 + m]
        _poly(blk, scale[:m])
        _bits(bits[:m])
        _scale(blk, scale[:m])


# the compiled loops, set by _build (numba resolves these globals when it compiles
# _exp_chunks and _exp_chunks32)
_poly = _bits = _scale = _poly32 = _bits32 = None


def _build() -> Callable[[np.ndarray], None]:
    """Import numba and compile :func:`_exp_chunks` (or load it from numba's cache on
    disk, next to this module), as :func:`pipeline.engine.compiled.njit` compiles."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    def fma_of(ty: object, ir_ty: object, name: str) -> object:
        @intrinsic
        def fma(typingctx: object, a: object, b: object, c: object) -> object:
            sig = ty(ty, ty, ty)

            def codegen(
                context: object, builder: object, signature: object, args: object
            ) -> object:
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir_ty, [ir_ty] * 3), name
                )
                return builder.call(fn, args)

            return sig, codegen

        return fma

    global _fma, _fma32, _poly, _bits, _scale, _poly32, _bits32

    _fma = fma_of(types.float64, ir.DoubleType(), "llvm.fma.f64")
    _fma32 = fma_of(types.float32, ir.FloatType(), "llvm.fma.f32")
    _poly, _bits, _scale = njit(_poly_loop), njit(_bits_loop), njit(_scale_loop)
    _poly32, _bits32 = njit(_poly_loop32), njit(_bits_loop32)
    return {np.dtype(np.float64): njit(_exp_chunks), np.dtype(np.float32): njit(_exp_chunks32)}


def _kernel(dtype: np.dtype) -> Callable[[np.ndarray], None]:
    """The compiled ``exp`` of one dtype (float32 or float64), built on first use."""
    global _compiled
    if _compiled is None:
        with native_lock:  # numba's import loads native libraries: never beside a scan
            if _compiled is None:
                _compiled = _build()
    return _compiled[np.dtype(dtype)]


def exp_inplace(E: np.ndarray) -> np.ndarray:
    """``E[...] = exp(E)``, in place; returns ``E``.

    float64 and float32: the compiled kernel of that width (the GIL is released), on a
    contiguous copy when ``E`` is a strided view, so an entry's bits never depend on the
    array's layout. Other dtypes: ``np.exp``.
    """
    if E.dtype not in (np.float64, np.float32):
        return np.exp(E, out=E)
    if E.size:
        if E.flags.c_contiguous:
            _kernel(E.dtype)(E.reshape(-1))
        else:
            tmp = np.ascontiguousarray(E)
            _kernel(E.dtype)(tmp.reshape(-1))
            E[...] = tmp
    return E


@warms_up
def _warm_up() -> None:
    """Compile the ``exp`` of both widths (:func:`pipeline.engine.compiled.warm_up`)."""
    for dtype in (np.float64, np.float32):
        exp_inplace(np.linspace(-100.0, 100.0, 64, dtype=dtype))
