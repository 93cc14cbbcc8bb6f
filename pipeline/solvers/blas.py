"""GIL-free BLAS-3 tile kernels: SciPy's own BLAS, called through ``ctypes``.

``scipy.linalg.blas`` (f2py) holds the GIL for the whole ``gemm``/``syrk``/``trsm``
call, so tile threads calling it run one at a time (measured: two threads ran at
the speed of one). SciPy also exports the same BLAS routines as C function
pointers (``scipy.linalg.cython_blas.__pyx_capi__``); a ``ctypes`` foreign call
releases the GIL for its duration, so these wrappers let tile threads overlap.
They run in place, with the SciPy-bundled BLAS (its threads follow threadpoolctl).

All functions take C-ordered float32/float64 tiles (unit stride along rows;
row strides may be larger, e.g. views into a panel) and describe them to the
column-major BLAS as their transposes.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

__all__ = ["gemm_nt_sub", "syrk_lower_sub", "trsm_right_lower_t"]

_P = ctypes.c_void_p


@cache
def _routine(name: str) -> ctypes._CFuncPtr:
    import scipy.linalg.cython_blas as cb

    cap = cb.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get_ptr(cap, get_name(cap))
    # every Fortran argument is a pointer; CFUNCTYPE calls release the GIL
    n_args = {"gemm": 13, "syrk": 10, "trsm": 11}[name[1:]]
    return ctypes.CFUNCTYPE(None, *([_P] * n_args))(addr)


def _prefix(*arrays: np.ndarray) -> str:
    dt = {a.dtype for a in arrays}
    if dt == {np.dtype(np.float64)}:
        return "d"
    if dt == {np.dtype(np.float32)}:
        return "s"
    raise TypeError(f"tiles must all be float64 or all float32, got {sorted(map(str, dt))}")


def _ld(a: np.ndarray, name: str) -> int:
    """Leading dimension (row stride in elements) of a C-ordered 2-D tile."""
    if a.ndim != 2 or a.strides[1] != a.itemsize or a.strides[0] % a.itemsize:
        raise ValueError(f"{name} must be a 2-D array with unit stride along rows")
    return max(1, a.strides[0] // a.itemsize, a.shape[1])


def _int(v: int) -> ctypes.c_int:
    return ctypes.c_int(int(v))


def _scalar(prefix: str, v: float):
    return (ctypes.c_double if prefix == "d" else ctypes.c_float)(v)


def _ref(x) -> ctypes._Pointer:
    return ctypes.byref(x)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _check_writable(c: np.ndarray) -> None:
    if not c.flags.writeable:
        raise ValueError("the output tile must be writable")


def gemm_nt_sub(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``c -= a @ b.T`` in place (``c`` m x n, ``a`` m x k, ``b`` n x k)."""
    p = _prefix(c, a, b)
    m, n = c.shape
    k = a.shape[1]
    if a.shape != (m, k) or b.shape != (n, k):
        raise ValueError(f"gemm shapes disagree: c {c.shape}, a {a.shape}, b {b.shape}")
    _check_writable(c)
    if m == 0 or n == 0 or k == 0:
        return c
    # column-major view: C^T (n x m) -= B^T^T... i.e. C_F -= B_F^T @ A_F
    one, minus = _scalar(p, 1.0), _scalar(p, -1.0)
    _routine(p + "gemm")(
        ctypes.c_char_p(b"T"),
        ctypes.c_char_p(b"N"),
        _ref(_int(n)),
        _ref(_int(m)),
        _ref(_int(k)),
        _ref(minus),
        _ptr(b),
        _ref(_int(_ld(b, "b"))),
        _ptr(a),
        _ref(_int(_ld(a, "a"))),
        _ref(one),
        _ptr(c),
        _ref(_int(_ld(c, "c"))),
    )
    return c


def syrk_lower_sub(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``c -= a @ a.T`` on the lower triangle of ``c`` in place (upper left alone)."""
    p = _prefix(c, a)
    m, k = a.shape
    if c.shape != (m, m):
        raise ValueError(f"syrk shapes disagree: c {c.shape}, a {a.shape}")
    _check_writable(c)
    if m == 0 or k == 0:
        return c
    # C's lower triangle is C_F's upper one; C_F -= A_F^T @ A_F with A_F = A^T (k x m)
    _routine(p + "syrk")(
        ctypes.c_char_p(b"U"),
        ctypes.c_char_p(b"T"),
        _ref(_int(m)),
        _ref(_int(k)),
        _ref(_scalar(p, -1.0)),
        _ptr(a),
        _ref(_int(_ld(a, "a"))),
        _ref(_scalar(p, 1.0)),
        _ptr(c),
        _ref(_int(_ld(c, "c"))),
    )
    return c


def trsm_right_lower_t(ell: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Solve ``x @ ell.T = a`` for ``x`` in place of ``a`` (``ell`` lower triangular)."""
    p = _prefix(ell, a)
    m, nb = a.shape
    if ell.shape != (nb, nb):
        raise ValueError(f"trsm shapes disagree: ell {ell.shape}, a {a.shape}")
    _check_writable(a)
    if m == 0 or nb == 0:
        return a
    # x ell^T = a  <=>  ell x^T = a^T; column-major: ell = L_F^T with L_F upper,
    # x^T is X_F (nb x m) in a's buffer: solve L_F^T X_F = A_F
    _routine(p + "trsm")(
        ctypes.c_char_p(b"L"),
        ctypes.c_char_p(b"U"),
        ctypes.c_char_p(b"T"),
        ctypes.c_char_p(b"N"),
        _ref(_int(nb)),
        _ref(_int(m)),
        _ref(_scalar(p, 1.0)),
        _ptr(ell),
        _ref(_int(_ld(ell, "ell"))),
        _ptr(a),
        _ref(_int(_ld(a, "a"))),
    )
    return a
