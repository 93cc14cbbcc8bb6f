"""GIL-free BLAS-3 tile kernels: SciPy's own BLAS, called through ``ctypes``.

``scipy.linalg.blas`` (f2py) holds the GIL for the whole ``gemm``/``syrk``/``trsm``
call, so tile threads calling it run one at a time. SciPy also exports the same BLAS routines as C function
pointers (``scipy.linalg.cython_blas.__pyx_capi__``); a ``ctypes`` foreign call
releases the GIL for its duration, so these wrappers let tile threads overlap.
They run in place, with the SciPy-bundled BLAS (its threads follow threadpoolctl).

All functions take C-ordered float32/float64 tiles (unit stride along rows;
row strides may be larger, e.g. views into a panel) and describe them to the
column-major BLAS as their transposes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import numpy as np

# SciPy's BLAS and LAPACK load with this module, never inside a tile: threadpoolctl
# limits only the libraries loaded when a limit is entered (engine.parallel.blas_threads),
# so an OpenBLAS first loaded by a tile task would run at full width beside the other
# tile threads (oversubscribed: the quick tile Cholesky took 1.3x as long when
# pipeline.errors stopped importing scikit-learn, which had loaded SciPy early).
import scipy.linalg.cython_blas  # noqa: F401
import scipy.linalg.cython_lapack  # noqa: F401

import pipeline.constants as C
from pipeline.engine.parallel import native_lock
from pipeline.storage import buffers

__all__ = [
    "blas_lock",
    "first_touch_between_calls",
    "fixed_width",
    "gemm_nt_sub",
    "numpy_blas_single_threaded",
    "output_tile",
    "potrf_lower",
    "serialized",
    "syrk_lower_sub",
    "trsm_right_lower_t",
]

_P = ctypes.c_void_p

#: when set (inside :func:`serialized`), every call here holds it: one BLAS call at a time
_SERIAL: threading.Lock | None = None


@contextlib.contextmanager
def serialized() -> Iterator[None]:
    """Run the BLAS calls of this module one at a time, each with every BLAS thread.

    For tile threads whose BLAS uses all cores ("wide" tasks): the calls queue on
    a lock, so the cores never run two multi-threaded BLAS calls at once, while
    the tile threads' Python-side work (reads, copies, checksums) overlaps the
    BLAS call in progress. Results do not depend on it.
    """
    global _SERIAL
    prev, _SERIAL = _SERIAL, threading.Lock()
    try:
        yield
    finally:
        _SERIAL = prev


#: one multi-threaded BLAS call at a time per process (calls under :func:`fixed_width` > 1)
_WIDE_LOCK = threading.Lock()
_WIDTH = threading.local()


class _ThreadCount:
    """Get/set one BLAS library's process-wide thread count from any Python thread.

    threadpoolctl ignores ``set_num_threads`` of a pthreads OpenBLAS from any thread
    but the first one that used it (its "controlling thread"), silently, so tile
    threads call OpenBLAS's own ``openblas_set_num_threads`` instead.
    """

    def __init__(self, controller: Any) -> None:
        self.filepath = str(getattr(controller, "filepath", ""))
        self.get = controller.get_num_threads
        self.set = controller.set_num_threads
        if getattr(controller, "internal_api", "") == "openblas":
            lib = ctypes.CDLL(controller.filepath)
            for pre in ("scipy_", ""):
                for suf in ("", "64_", "_64"):
                    g = getattr(lib, f"{pre}openblas_get_num_threads{suf}", None)
                    s = getattr(lib, f"{pre}openblas_set_num_threads{suf}", None)
                    if g is not None and s is not None:
                        g.restype, g.argtypes = ctypes.c_int, []
                        s.restype, s.argtypes = None, [ctypes.c_int]
                        self.get, self.set = g, s
                        return


@cache
def _blas_controllers() -> tuple[_ThreadCount, ...]:
    import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS before listing)
    from threadpoolctl import ThreadpoolController

    with native_lock:  # (a scan: see pipeline.engine.parallel.native_lock)
        ctl = ThreadpoolController().select(user_api="blas").lib_controllers
    return tuple(_ThreadCount(c) for c in ctl)


@contextlib.contextmanager
def fixed_width(n_threads: int | None, host_lock: bool = False) -> Iterator[None]:
    """Run every BLAS call of this module (and :func:`blas_lock` sections) made by the
    calling thread inside the block with exactly ``n_threads`` BLAS threads.

    Multi-threaded OpenBLAS rounds differently from single-threaded (GEMM, TRSM and
    POTRF of a 2500-tile differ in the last bits between 1 and 2 threads), so a tile
    task that fixes its BLAS width computes the same bits whatever executor, tile
    thread count or other work runs it. Calls wider than one thread hold a
    process-wide lock (one wide call at a time: no oversubscription) and restore
    the previous thread count afterwards; one-thread calls run concurrently and leave
    the count at 1 (so do not run tasks of two different widths in one process at
    once). ``None`` leaves calls as they are.

    ``host_lock``: wide calls also hold a lock shared by every process of this
    host (:func:`_host_lock`), for Dask workers that are separate processes on
    one machine: two of them running all-core BLAS calls at once would
    oversubscribe the cores (OpenBLAS threads then spin-wait on each other).
    """
    prev = getattr(_WIDTH, "n", None), getattr(_WIDTH, "host", False)
    _WIDTH.n = None if n_threads is None else max(1, int(n_threads))
    _WIDTH.host = bool(host_lock)
    try:
        yield
    finally:
        _WIDTH.n, _WIDTH.host = prev


def _package_dirs(module: Any) -> tuple[str, ...]:
    """Where a package's own files and its wheel's bundled libraries live: its package
    directory and the ``<name>.libs`` beside it (auditwheel's layout), with a separator
    at the end so that a path is matched by directory, not by a name's prefix."""
    pkg = os.path.dirname(os.path.realpath(module.__file__))
    libs = os.path.join(os.path.dirname(pkg), os.path.basename(pkg) + ".libs")
    return (pkg + os.sep, libs + os.sep)


def _numpy_own_blas() -> tuple[_ThreadCount, ...]:
    """numpy's BLAS when it is another library than SciPy's (the wheels bundle one
    each: ``numpy.libs`` and ``scipy.libs``); empty when they share one. Told apart by
    where each library's file lies (numpy's package or its ``numpy.libs``), not by a
    name in the path: a virtual environment named after numpy matched both."""
    ctl = _blas_controllers()
    if len({c.filepath for c in ctl}) < 2:
        return ()
    dirs = _package_dirs(np)
    return tuple(c for c in ctl if os.path.realpath(c.filepath).startswith(dirs))


def _tile_blas() -> tuple[_ThreadCount, ...]:
    """The BLAS this module calls (SciPy's): every library but numpy's own."""
    own = _numpy_own_blas()
    return tuple(c for c in _blas_controllers() if c not in own)


@contextlib.contextmanager
def numpy_blas_single_threaded() -> Iterator[None]:
    """numpy's own BLAS at one thread inside the block, where it is not SciPy's.

    The tile kernels here call SciPy's BLAS (all cores, one call at a time). numpy's
    matmul inside a kernel evaluation that runs beside them (a Gram tile computed on
    demand in a read-ahead thread) would start its own BLAS threads on the same cores
    and preempt them; at one thread it only takes the cores' gaps. Restored afterwards.
    GEMM splits its rows and columns over threads, never the sums, so the values do
    not change.
    """
    own = _numpy_own_blas()
    prev = [c.get() for c in own]
    for c in own:
        c.set(1)
    try:
        yield
    finally:
        for c, n in zip(own, prev, strict=True):
            c.set(n)


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """An exclusive ``flock`` on ``$TMPDIR/krr-wide-blas.lock`` (released by the kernel
    if the process dies; the blocking wait releases the GIL)."""
    import fcntl
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), "krr-wide-blas.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _width_section(n: int, lock: Any) -> Iterator[None]:
    # only the library these calls use: numpy's own BLAS keeps its count (one thread
    # while a factor runs, numpy_blas_single_threaded)
    ctl = _tile_blas()
    if n == 1 and lock is None:  # concurrent 1-thread calls: setting 1 is idempotent
        for c in ctl:
            if c.get() != 1:
                c.set(1)
        yield
        return
    host = _host_lock() if getattr(_WIDTH, "host", False) else contextlib.nullcontext()
    with lock if lock is not None else _WIDE_LOCK, host:
        before = [c.get() for c in ctl]
        for c in ctl:
            c.set(n)
        try:
            yield
        finally:
            for c, b in zip(ctl, before, strict=True):
                c.set(b)


def blas_lock() -> contextlib.AbstractContextManager:
    """Context for one BLAS/LAPACK call: the lock of :func:`serialized` while it is
    active, and the calling thread's :func:`fixed_width`; else a no-op context."""
    lock = _SERIAL
    n = getattr(_WIDTH, "n", None)
    if n is not None:
        return _width_section(n, lock)
    return lock if lock is not None else contextlib.nullcontext()


@cache
def _routine(name: str) -> ctypes._CFuncPtr:
    import scipy.linalg.cython_blas as cb
    import scipy.linalg.cython_lapack as cl

    cap = (cl if name[1:] == "potrf" else cb).__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get_ptr(cap, get_name(cap))
    # every Fortran argument is a pointer; CFUNCTYPE calls release the GIL
    n_args = {"gemm": 13, "syrk": 10, "trsm": 11, "potrf": 5}[name[1:]]
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


def _call(prefix: str, name: str, *args: Any) -> None:
    """Call Fortran BLAS ``prefix + name``: every argument by reference (str -> char,
    int -> int, float -> the routine's real type, ndarray -> its data pointer)."""
    real = ctypes.c_double if prefix == "d" else ctypes.c_float
    refs = []
    for a in args:
        if isinstance(a, np.ndarray):
            refs.append(a.ctypes.data)
        elif isinstance(a, str):
            refs.append(ctypes.c_char_p(a.encode()))
        elif isinstance(a, int):
            refs.append(ctypes.byref(ctypes.c_int(a)))
        else:
            refs.append(ctypes.byref(real(a)))
    fn = _routine(prefix + name)
    with blas_lock():
        fn(*refs)  # the arrays stay referenced by ``args`` meanwhile


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
    # column-major: C_F = C^T (n x m); C_F -= B_F^T @ A_F with B_F = B^T, A_F = A^T
    _call(p, "gemm", "T", "N", n, m, k, -1.0, b, _ld(b, "b"), a, _ld(a, "a"), 1.0, c, _ld(c, "c"))
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
    _call(p, "syrk", "U", "T", m, k, -1.0, a, _ld(a, "a"), 1.0, c, _ld(c, "c"))
    return c


def potrf_lower(a: np.ndarray) -> int:
    """Cholesky factor of the symmetric tile whose lower triangle ``a`` holds, in place,
    GIL-free (LAPACK ``potrf`` of SciPy's library, as SciPy's own wrapper calls it).

    On return (info 0) ``a``'s lower triangle holds ``L`` with ``L @ L.T = A`` and its
    strict upper triangle is zero. Returns LAPACK's ``info`` (> 0: the leading minor
    of that order is not positive definite; ``a`` is then partly overwritten).
    """
    p = _prefix(a)
    n = a.shape[0]
    if a.ndim != 2 or a.shape != (n, n) or not a.flags.c_contiguous:
        raise ValueError(f"potrf needs a square C-contiguous tile, got shape {a.shape}")
    _check_writable(a)
    if n == 0:
        return 0
    info = ctypes.c_int(0)
    fn = _routine(p + "potrf")
    # a's lower triangle is the upper one of the column-major a.T: U^T U = A, U^T = L
    with blas_lock():
        fn(
            ctypes.c_char_p(b"U"),
            ctypes.byref(ctypes.c_int(n)),
            a.ctypes.data,
            ctypes.byref(ctypes.c_int(n)),
            ctypes.byref(info),
        )
    if info.value == 0:
        for i in range(n - 1):  # LAPACK leaves the other triangle as it was
            a[i, i + 1 :] = 0
    return int(info.value)


def output_tile(a: np.ndarray, dtype: Any, reuse: bool = True) -> np.ndarray:
    """The tile a call here may overwrite: ``a`` itself when ``reuse`` and it is a
    writable C-contiguous tile of ``dtype``, else a C-ordered copy in ``dtype``."""
    dtype = np.dtype(dtype)
    if reuse and a.flags.c_contiguous and a.flags.writeable and a.dtype == dtype:
        return a
    return np.array(a, dtype=dtype, order="C")


def potrf_lower_float64(a: np.ndarray, overwrite: bool = False) -> tuple[np.ndarray, int]:
    """:func:`potrf_lower` in float64: ``(L, info)``, on ``a`` itself when ``overwrite``
    and it is a writable C-contiguous float64 tile, else on a float64 copy."""
    c = output_tile(a, np.float64, reuse=overwrite)
    return c, int(potrf_lower(c))


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
    _call(p, "trsm", "L", "U", "T", "N", nb, m, 1.0, ell, _ld(ell, "ell"), a, _ld(a, "a"))
    return a


def first_touch_between_calls(
    n_threads: int | None = None,
) -> Callable[[np.ndarray], None] | None:
    """A ``first_touch`` for tile reads beside wide BLAS calls
    (:func:`pipeline.storage.buffers.take`), or None where it would not help.

    Faulting in a new read buffer is most of a tile read's CPU
    (docs/PERFORMANCE.md#known-traps); done by a reader thread beside an all-core BLAS
    call, it stalls that call on every core. The hook waits for the lock that wide
    calls hold, then faults the pages in on ``n_threads`` threads; the read (a copy)
    runs outside the lock. Results do not depend on it.

    ``n_threads``: the wide calls' width (default: the calling thread's
    :func:`fixed_width`). None for one-thread calls (they run beside each other, not
    one at a time), when calls also queue with other processes (``host_lock``), or
    when :data:`~pipeline.constants.FIRST_TOUCH_MIN_BYTES` is 0.
    """
    n = getattr(_WIDTH, "n", None) if n_threads is None else int(n_threads)
    if not n or n <= 1 or getattr(_WIDTH, "host", False) or C.FIRST_TOUCH_MIN_BYTES <= 0:
        return None
    width, least = int(n), int(C.FIRST_TOUCH_MIN_BYTES)

    def first_touch(arr: np.ndarray) -> None:
        if arr.nbytes < least:
            return
        with _SERIAL if _SERIAL is not None else _WIDE_LOCK:  # the lock of the calls now
            buffers.touch(arr, width)

    return first_touch


@contextlib.contextmanager
def process_threads(n_threads: int) -> Iterator[None]:
    """Set every loaded BLAS's process-wide thread count inside the block, from any
    Python thread (threadpoolctl only obeys its first caller), then restore it.

    For memory-bound sweeps (GEMV-like products, TRSM with a few right-hand sides):
    one BLAS thread streams a tile about as fast as two, and never waits on a
    descheduled partner thread.
    """
    ctl = _blas_controllers()
    before = [c.get() for c in ctl]
    for c in ctl:
        c.set(max(1, int(n_threads)))
    try:
        yield
    finally:
        for c, b in zip(ctl, before, strict=True):
            c.set(b)
