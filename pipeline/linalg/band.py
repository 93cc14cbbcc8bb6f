"""One orthogonal band reduction serving every shift: ``(K + s I)⁻¹ Y`` for many ``s``.

``K = Q B Qᵀ`` with ``B`` symmetric banded (bandwidth ``kd``) and ``Q`` orthogonal
(LAPACK ``dsytrd_sy2sb``: blocked Householder, BLAS-3, about ``4/3 m³`` flops).
Then ``K + s I = Q (B + s I) Qᵀ`` for every shift ``s``, so each further shift
costs a band Cholesky (``m kd²`` flops) and two applications of ``Q`` to the
right-hand sides (``dormqr``), not a new ``m³/3`` factorisation. This is the
direct method for many shifts; it is backward stable like a Cholesky solve.

``dsytrd_sy2sb`` is LAPACK ≥ 3.7 but not in SciPy's wrappers, so it is called
through ``ctypes`` in the LAPACK that SciPy bundles (its OpenBLAS). A ``ctypes``
call releases the GIL, so reductions in several threads overlap. Where that
library or symbol cannot be found, :func:`band_available` is False and callers
use another solver.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy.linalg import lapack

from pipeline.errors import NotPositiveDefiniteError

__all__ = ["BandReduction", "band_available", "band_reduce", "default_bandwidth"]

#: bandwidth of the reduction (docs/PERFORMANCE.md#model-selection)
DEFAULT_KD = 192

_P = ctypes.c_void_p
_LEN = ctypes.c_size_t  # gfortran's hidden length of a CHARACTER argument


def _scipy_lapack_paths() -> list[str]:
    import scipy
    import scipy.linalg  # noqa: F401  (loads the library with its libgfortran: ctypes reuses it)

    root = os.path.dirname(os.path.dirname(scipy.__file__))
    pats = ("scipy.libs/libscipy_openblas*.so*", "scipy/.dylibs/libscipy_openblas*.dylib")
    pats += ("scipy.libs/libopenblas*.so*",)  # SciPy < 1.14 names it libopenblasp-r0-*.so
    return sorted(p for pat in pats for p in glob.glob(os.path.join(root, pat)))


@cache
def _routine(name: str, n_ptr: int, n_len: int) -> ctypes._CFuncPtr | None:
    """Fortran LAPACK ``name`` (LP64) from SciPy's bundled library, or None."""
    for path in _scipy_lapack_paths():
        if "openblas64" in os.path.basename(path):  # ILP64 (numpy's), other integer size
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in (f"scipy_{name}_", f"{name}_"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.argtypes = [_P] * n_ptr + [_LEN] * n_len
                fn.restype = None
                return fn
    return None


def _sy2sb() -> ctypes._CFuncPtr | None:
    return _routine("dsytrd_sy2sb", 11, 1)


def _ormqr() -> ctypes._CFuncPtr | None:
    return _routine("dormqr", 13, 2)


def band_available() -> bool:
    """Whether SciPy's LAPACK exposes ``dsytrd_sy2sb`` and ``dormqr`` here."""
    return _sy2sb() is not None and _ormqr() is not None


def default_bandwidth(m: int) -> int:
    """The reduction's bandwidth for an m x m matrix."""
    return int(max(1, min(DEFAULT_KD, m - 1)))


def _int(v: int) -> ctypes.c_int:
    return ctypes.c_int(int(v))


def _with_workspace(call: Callable[[np.ndarray, int], None], info: ctypes.c_int, name: str) -> None:
    """LAPACK's two-step call: a workspace query (lwork=-1), then the real call."""
    work = np.zeros(1)
    call(work, -1)
    work = np.zeros(max(1, int(work[0])))
    call(work, work.size)
    if info.value != 0:  # pragma: no cover - an argument error, a bug
        raise RuntimeError(f"{name} failed with info={info.value}")


@dataclass
class BandReduction:
    """``K = Q B Qᵀ``: ``band`` is B in LAPACK lower band storage ((kd+1) x m),
    ``A`` and ``tau`` hold the Householder vectors of ``Q`` (LAPACK's layout)."""

    A: np.ndarray
    band: np.ndarray
    tau: np.ndarray
    kd: int

    @property
    def m(self) -> int:
        return int(self.A.shape[0])

    def _apply(self, C: np.ndarray, trans: bytes) -> np.ndarray:
        """``Qᵀ C`` (trans=b"T") or ``Q C`` (b"N") in place; C is F-ordered (m, k).

        ``Q = diag(I_kd, Q̃)`` where ``Q̃`` is the Q of a QR factorisation stored in
        ``A[kd:, :m-kd]`` (``dsytrd_sy2sb``'s layout), so ``dormqr`` works on the
        trailing rows, reading ``A`` in place through a pointer offset.
        """
        m, kd, k = self.m, self.kd, C.shape[1]
        r = m - kd
        if r <= 0 or k == 0:
            return C
        info = ctypes.c_int(0)

        def call(w: np.ndarray, lwork: int) -> None:
            _ormqr()(
                b"L", trans, ctypes.byref(_int(r)), ctypes.byref(_int(k)), ctypes.byref(_int(r)),
                self.A.ctypes.data + 8 * kd, ctypes.byref(_int(m)), self.tau.ctypes.data,
                C.ctypes.data + 8 * kd, ctypes.byref(_int(m)), w.ctypes.data,
                ctypes.byref(_int(lwork)), ctypes.byref(info), 1, 1,
            )  # fmt: skip

        _with_workspace(call, info, "dormqr")
        return C

    def solve(self, Y: np.ndarray, shifts: list[float] | np.ndarray) -> np.ndarray:
        """``(K + s I)⁻¹ Y`` for every shift ``s``: an array (len(shifts), m, t).

        Raises
        ------
        NotPositiveDefiniteError
            If ``K + s I`` is not positive definite for some shift (naming it; a ValueError).
        """
        Y2 = np.asarray(Y, dtype=np.float64).reshape(self.m, -1)
        t = Y2.shape[1]
        Z0 = self._apply(np.array(Y2, order="F"), b"T")
        Z = np.empty((self.m, len(shifts) * t), order="F")
        for i, s in enumerate(shifts):
            ab = self.band.copy()
            ab[0] += float(s)
            c, info = lapack.dpbtrf(ab, lower=1, overwrite_ab=1)
            if info != 0:
                raise NotPositiveDefiniteError.of_shift(
                    float(s),
                    f"K + {float(s):g} I is not positive definite (band Cholesky failed at "
                    f"row {info}); use a larger alpha or a positive semi-definite kernel",
                )
            x, info = lapack.dpbtrs(c, Z0, lower=1)
            Z[:, i * t : (i + 1) * t] = x
        X = self._apply(Z, b"N")
        return np.ascontiguousarray(X.reshape(self.m, len(shifts), t).transpose(1, 0, 2))


def band_reduce(K: np.ndarray, kd: int | None = None, *, overwrite: bool = False) -> BandReduction:
    """Orthogonal band reduction ``K = Q B Qᵀ`` of a symmetric matrix (lower triangle read).

    Parameters
    ----------
    K : ndarray (m, m), float64, symmetric
        With ``overwrite=True`` and F- or C-contiguous storage, reduced in place
        (a C-ordered symmetric K is read as its own transpose).
    kd : int, optional
        Bandwidth (default :func:`default_bandwidth`).

    Returns
    -------
    BandReduction
    """
    fn = _sy2sb()
    if fn is None or _ormqr() is None:
        raise RuntimeError(
            "band reduction needs LAPACK dsytrd_sy2sb from SciPy's bundled OpenBLAS, which "
            "was not found; use solver='eigen' or 'dense'"
        )
    K = np.asarray(K)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"band_reduce needs a square matrix, got shape {K.shape}")
    m = K.shape[0]
    kd = default_bandwidth(m) if kd is None else int(kd)
    if not 1 <= kd:
        raise ValueError(f"bandwidth kd must be >= 1, got {kd}")
    kd = min(kd, max(1, m - 1))
    if overwrite and K.dtype == np.float64 and K.flags.f_contiguous:
        A = K
    elif overwrite and K.dtype == np.float64 and K.flags.c_contiguous:
        A = K.T  # symmetric: the transpose is the same matrix, F-ordered
    else:
        A = np.array(K, dtype=np.float64, order="F")
    band = np.zeros((kd + 1, m), order="F")
    tau = np.zeros(max(1, m - kd))
    info = ctypes.c_int(0)

    def call(w: np.ndarray, lwork: int) -> None:
        fn(
            b"L", ctypes.byref(_int(m)), ctypes.byref(_int(kd)), A.ctypes.data,
            ctypes.byref(_int(m)), band.ctypes.data, ctypes.byref(_int(kd + 1)),
            tau.ctypes.data, w.ctypes.data, ctypes.byref(_int(lwork)), ctypes.byref(info), 1,
        )  # fmt: skip

    _with_workspace(call, info, "dsytrd_sy2sb")
    return BandReduction(A=A, band=band, tau=tau, kd=kd)
