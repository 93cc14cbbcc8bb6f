"""The backend seam: the array library a tile's arithmetic runs on.

Every tile operation that can run on an accelerator takes a :class:`Backend`: its
array namespace ``xp`` (the array API, through ``array_api_compat``, as scikit-learn
does) and the few calls the array API does not have or does not make fast (the
Cholesky of a tile with LAPACK's ``info``, a triangular solve, a GEMM that updates a
tile in place). Three backends:

- ``"numpy"``: the host (the default everywhere; the CPU paths keep their own fused,
  cache-blocked code, :mod:`pipeline.engine.fused`, and use this backend only where a
  device-generic algorithm runs on the host, e.g. in tests);
- ``"cupy"``: an NVIDIA GPU, through CuPy (the optional extra ``[gpu]``): cuBLAS for
  the products, cuSOLVER's POTRF in place for the tile Cholesky;
- ``"array_api_strict"``: the array API's reference namespace, for CI: the
  device-generic code is run on it so that it cannot rot into NumPy-only code while
  no GPU checks it. It is a test backend, not a device a user names.

Which backend a fit uses is the user's ``device`` (``"cpu"``, ``"cuda"`` or ``"auto"``),
resolved once by :func:`resolve_device`, with its reason, which the plan records.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import mmap
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

import pipeline._optional as _optional
from pipeline.engine import blas
from pipeline.errors import DeviceUnavailableError
from pipeline.options import DEVICES

log = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "DEVICES",
    "Backend",
    "TileCopies",
    "cuda_available",
    "get_backend",
    "resolve_device",
]

#: the backends :func:`get_backend` knows (``array_api_strict``: tests only)
BACKENDS = ("numpy", "cupy", "array_api_strict")


@dataclass(frozen=True, eq=False)
class Backend:
    """One array library, as the tile arithmetic sees it.

    Attributes
    ----------
    name : {"numpy", "cupy", "array_api_strict"}
    xp : module
        The array namespace (array API; ``array_api_compat``'s wrapper for NumPy and
        CuPy).
    device : {"cpu", "cuda"}
        Where its arrays live.
    """

    name: str
    xp: Any = field(repr=False)
    device: str

    # -- moving data -----------------------------------------------------------------
    @property
    def is_host(self) -> bool:
        """True when arrays live in host memory (NumPy)."""
        return self.name == "numpy"

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """``a`` as an array of this backend (a copy to the device when ``a`` is on the
        host), in ``dtype`` if given."""
        if dtype is not None:
            dtype = self.dtype(dtype)
        if self.name == "cupy":
            import cupy

            return cupy.asarray(a, dtype=dtype)
        if self.name == "array_api_strict" and isinstance(a, np.ndarray | np.generic):
            a = np.ascontiguousarray(a)
        return self.xp.asarray(a, dtype=dtype)

    def holds(self, a: Any) -> bool:
        """True when ``a`` is an array of this backend (on its device), so that it is used
        as it is rather than copied from the host."""
        if self.name == "numpy":
            return isinstance(a, np.ndarray)
        return type(a).__module__.split(".")[0] == self.name

    def to_numpy(self, a: Any) -> np.ndarray:
        """``a`` as a NumPy array on the host (a copy from the device)."""
        if self.name == "cupy":
            return a.get()
        return np.asarray(a)

    def dtype(self, dtype: Any) -> Any:
        """The namespace's dtype object for ``dtype`` (``"float64"``, ``np.float32``...)."""
        return getattr(self.xp, np.dtype(dtype).name)

    def synchronize(self) -> None:
        """Wait for the device's queued work (for timings; a no-op on the host)."""
        if self.name == "cupy":
            import cupy

            cupy.cuda.get_current_stream().synchronize()

    def memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of device memory; None on the host."""
        if self.name == "cupy":
            import cupy

            free, total = cupy.cuda.runtime.memGetInfo()
            return int(free), int(total)
        return None

    # -- per-tile linear algebra -----------------------------------------------------
    def cholesky_lower(self, a: Any, overwrite: bool = False) -> tuple[Any, int]:
        """Lower Cholesky factor of the symmetric tile whose lower triangle ``a`` holds.

        Returns ``(L, info)`` as LAPACK's POTRF: ``info`` 0 on success, else the
        1-based column where the tile is not positive definite (L is then unusable).
        The strict upper triangle of L is zero. ``overwrite``: ``a`` may be used as L's
        storage (cuSOLVER's POTRF in place, no second tile of device memory).
        """
        if self.name == "numpy":  # the CPU tile Cholesky's own call
            return blas.potrf_lower_float64(np.asarray(a), overwrite)
        if self.name == "cupy":
            return _cupy_potrf_lower(a, overwrite)
        try:
            return self.xp.linalg.cholesky(a), 0
        except np.linalg.LinAlgError:  # the reference namespace raises: find the column
            _, info = get_backend("numpy").cholesky_lower(np.asarray(a))
            return a, max(int(info), 1)

    def solve_triangular(self, L: Any, B: Any, *, lower: bool = True, trans: bool = False) -> Any:
        """``op(L)⁻¹ B`` for triangular ``L`` (``op(L) = Lᵀ`` when ``trans``)."""
        if self.name == "numpy":
            import scipy.linalg

            return scipy.linalg.solve_triangular(
                L, B, lower=lower, trans=1 if trans else 0, check_finite=False
            )
        if self.name == "cupy":
            import cupyx.scipy.linalg

            return cupyx.scipy.linalg.solve_triangular(L, B, lower=lower, trans=1 if trans else 0)
        # the array API has no triangular solve: a general one (tests only)
        xp = self.xp
        A = xp.matrix_transpose(L) if trans else L
        return xp.linalg.solve(A, B)

    def trsm_right_lower_t(self, L: Any, A: Any) -> Any:
        """``X`` with ``X @ Lᵀ = A`` (``L`` lower): a factor tile below the diagonal; in
        place of ``A`` on the host when ``A`` is a writable C-ordered tile of ``L``'s
        dtype (the CPU tile Cholesky's GIL-free TRSM), else a new array."""
        if self.name == "numpy":
            L = np.asarray(L)
            A = blas.output_tile(A, np.result_type(L, A), reuse=A.dtype == L.dtype)
            return blas.trsm_right_lower_t(np.ascontiguousarray(L, dtype=A.dtype), A)
        xp = self.xp
        return xp.matrix_transpose(self.solve_triangular(L, xp.matrix_transpose(A), lower=True))

    def syrk_lower_sub(self, a: Any, x: Any) -> Any:
        """``a - x @ xᵀ`` on the lower triangle (diagonal included) of the square ``a``;
        its strict upper triangle is then undefined. Half a GEMM's flops on the host
        (the tile engine's GIL-free SYRK, as the CPU's tile Cholesky updates its diagonal
        tiles); a whole GEMM elsewhere."""
        if self.name == "numpy":
            return blas.syrk_lower_sub(a, x)
        return self.gemm_nt_sub(a, x, x)

    def gemm_nt_sub(self, a: Any, x: Any, y: Any) -> Any:
        """``a - x @ yᵀ``, in place of ``a`` where the backend can (a GEMM with β = 1:
        cuBLAS, or on the host the tile engine's GIL-free call,
        :func:`pipeline.engine.blas.gemm_nt_sub`, which the CPU's tile Cholesky makes);
        returns the result."""
        if self.name == "cupy" and a.flags.c_contiguous:
            import cupy.cublas

            cupy.cublas.gemm("N", "T", x, y, out=a, alpha=-1.0, beta=1.0)
            return a
        if self.name == "numpy":
            return blas.gemm_nt_sub(a, x, y)
        xp = self.xp
        return a - xp.matmul(x, xp.matrix_transpose(y))


#: threads that make the host tiles a :class:`TileCopies` was told of ahead
HOST_PREP_THREADS = 4


def _host_unregister(rt: Any, ptr: int) -> None:  # pragma: no cover - GPU only
    with contextlib.suppress(Exception):  # (never raise from a finaliser)
        rt.hostUnregister(ptr)


class TileCopies:
    """Host <-> device copies of whole tiles that overlap the compute: the streaming of
    an out-of-core tile algorithm (the device Cholesky's panels,
    :mod:`pipeline.linalg.cholesky_device`).

    On CuPy the host tiles live in pinned memory, uploads run on one non-blocking stream
    and downloads on another, and both are ordered against the compute (the current
    stream) by CUDA events: :meth:`upload` returns at once with a ticket, and
    :meth:`ready` makes the compute wait for it, so a tile is copied in while the
    previous one is multiplied. A device slot is reused only after the compute that
    read it (:meth:`release`). On the other backends the copies are plain and
    synchronous (and the slots unused), so the same algorithm runs, and is tested, on
    the CPU.

    Tiles are named by a key (any hashable, e.g. ``(i, j)``); a download in flight is
    waited for before the host copy is read (:meth:`downloaded`) or uploaded again.

    Host tiles named ahead (:meth:`reserve`) are made by :data:`HOST_PREP_THREADS`
    threads while the device computes: fresh host memory is slow to get (on the H200
    machine page-locking it with ``cudaHostAlloc`` ran at 2.2 GB/s, touching pageable
    pages at about 5 GB/s, page-locking touched ones at 38 GB/s), so the threads touch
    each tile's pages in parallel and then page-lock them (``cudaHostRegister``).
    """

    def __init__(self, be: Backend) -> None:
        self.be = be
        self._cupy = be.name == "cupy"
        self._down: dict[Any, Any] = {}  # key -> event of its download in flight
        self._ready: dict[Any, Future] = {}  # key -> its host tile being made
        self._pool: ThreadPoolExecutor | None = None
        if self._cupy:  # pragma: no cover - GPU only
            import cupy

            self._cp = cupy
            self.up = cupy.cuda.Stream(non_blocking=True)
            self.down = cupy.cuda.Stream(non_blocking=True)

    def reserve(self, shapes: Mapping[Any, tuple[int, ...]], dtype: Any) -> None:
        """Start making the host tiles ``shapes`` (key -> shape, in the order
        :meth:`host_tile` will ask for them) in background threads."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(HOST_PREP_THREADS, thread_name_prefix="host-tiles")
        dtype = np.dtype(dtype)
        for key, shape in shapes.items():
            self._ready[key] = self._pool.submit(self._make, tuple(shape), dtype)

    def _make(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A host tile in pages of its own (an anonymous mapping: page-aligned, shared
        with no other allocation), every page touched here (the GIL released), and on
        CuPy page-locked; None where page-locking failed (:meth:`host_tile` then
        allocates pinned memory itself)."""
        count = int(np.prod(shape))
        a = np.frombuffer(mmap.mmap(-1, max(count * dtype.itemsize, 1)), dtype, count)
        a = a.reshape(shape)
        a.fill(0)
        if self._cupy and a.nbytes:  # pragma: no cover - GPU only
            return self._page_lock(a)
        return a

    def _page_lock(self, a: np.ndarray) -> np.ndarray | None:  # pragma: no cover - GPU only
        """``a`` page-locked for asynchronous copies, unlocked again before its memory
        goes (a weak-reference finaliser runs before the array lets go of its buffer)."""
        rt = self._cp.cuda.runtime
        ptr = int(a.ctypes.data)
        try:
            rt.hostRegister(ptr, int(a.nbytes), 0)
        except Exception as e:  # noqa: BLE001 - CUDA raises its own runtime errors
            log.debug("page-locking a %d-byte host tile failed (%s)", a.nbytes, e)
            return None
        fin = weakref.finalize(a, _host_unregister, rt, ptr)
        fin.atexit = False  # (at exit the CUDA context may be gone already)
        return a

    def host_tile(self, key: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised host array for tile ``key``: page-locked on CuPy (the
        asynchronous copies need it), an ordinary array elsewhere; the one
        :meth:`reserve` made for it when there is one."""
        dtype = np.dtype(dtype)
        fut = self._ready.pop(key, None)
        if fut is not None:
            a = fut.result()
            if a is not None and a.shape == tuple(shape) and a.dtype == dtype:
                return a
        if not self._cupy:
            return np.empty(shape, dtype=dtype)
        count = int(np.prod(shape))  # pragma: no cover - GPU only
        mem = self._cp.cuda.alloc_pinned_memory(max(count * dtype.itemsize, 1))  # pragma: no cover
        return np.frombuffer(mem, dtype, count).reshape(shape)  # pragma: no cover

    def close(self) -> None:
        """Stop making host tiles nobody will ask for."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._ready.clear()

    def slot(self, elements: int, dtype: Any) -> Any:
        """A device buffer that uploads reuse (``elements`` long, flat); None off CuPy."""
        if not self._cupy:
            return None
        return SimpleNamespace(  # pragma: no cover - GPU only
            buf=self._cp.empty(int(elements), dtype=np.dtype(dtype)), free=None
        )

    def download(self, key: Any, src: Any, host: np.ndarray) -> None:
        """Copy the device tile ``src`` into ``host`` once the compute queued so far is
        done (asynchronous on CuPy; :meth:`downloaded` waits for it)."""
        if not self._cupy:
            np.copyto(host, self.be.to_numpy(src), casting="no")
            return
        cp = self._cp  # pragma: no cover - GPU only
        after = cp.cuda.Event()  # pragma: no cover
        after.record()  # pragma: no cover
        self.down.wait_event(after)  # pragma: no cover
        try:  # pragma: no cover
            src.get(stream=self.down, out=host, blocking=False)
        except TypeError:  # pragma: no cover - a CuPy before 13: a blocking copy
            src.get(stream=self.down, out=host)
        done = cp.cuda.Event()  # pragma: no cover
        done.record(self.down)  # pragma: no cover
        self._down[key] = done  # pragma: no cover

    def downloaded(self, key: Any) -> None:
        """Block until the download of ``key`` (if one was queued) has finished; safe
        from any thread, any number of times."""
        done = self._down.get(key)
        if done is not None:  # pragma: no cover - GPU only
            done.synchronize()

    def upload(self, key: Any, host: np.ndarray, slot: Any = None) -> tuple[Any, Any]:
        """``host`` on the device: ``(tile, ticket)``. On CuPy the tile is a view of
        ``slot``'s buffer, written on the upload stream after the compute that last
        read the slot (:meth:`release`) and after the host copy's own download; call
        :meth:`ready` with the ticket before queuing the compute that reads it.
        Elsewhere a new array, and no ticket."""
        if not self._cupy:
            return self.be.asarray(np.ascontiguousarray(host), host.dtype), None
        cp = self._cp  # pragma: no cover - GPU only
        if slot.free is not None:  # pragma: no cover
            self.up.wait_event(slot.free)
        done = self._down.get(key)  # pragma: no cover
        if done is not None:  # pragma: no cover
            self.up.wait_event(done)
        tile = slot.buf[: host.size].reshape(host.shape)  # pragma: no cover
        tile.set(host, stream=self.up)  # pragma: no cover
        ticket = cp.cuda.Event()  # pragma: no cover
        ticket.record(self.up)  # pragma: no cover
        return tile, ticket  # pragma: no cover

    def ready(self, ticket: Any) -> None:
        """Make the compute (the current stream) wait for an upload."""
        if ticket is not None:  # pragma: no cover - GPU only
            self._cp.cuda.get_current_stream().wait_event(ticket)

    def release(self, slot: Any) -> None:
        """The compute queued so far is the last to read ``slot``: the next upload
        into it waits for that compute, not for the host."""
        if slot is not None:  # pragma: no cover - GPU only
            slot.free = self._cp.cuda.Event()
            slot.free.record()

    def synchronize(self) -> None:
        """Wait for every copy in flight."""
        for key in list(self._down):
            self.downloaded(key)
        if self._cupy:  # pragma: no cover - GPU only
            self.up.synchronize()
            self.down.synchronize()


def _cupy_potrf_lower(a: Any, overwrite: bool) -> tuple[Any, int]:
    """cuSOLVER's POTRF on the C-ordered tile ``a`` (its lower triangle), in place when
    ``overwrite``: a C-ordered lower triangle is the upper one of the column-major
    matrix cuSOLVER sees (the same trick as the CPU's ``potrf(a.T, lower=0)``)."""
    import cupy
    from cupy.cuda import device as cuda_device
    from cupy_backends.cuda.libs import cublas, cusolver

    n = int(a.shape[0])
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float64)
    x = a if (overwrite and a.flags.c_contiguous) else cupy.array(a, order="C", copy=True)
    potrf, size = (
        (cusolver.dpotrf, cusolver.dpotrf_bufferSize)
        if x.dtype == np.float64
        else (cusolver.spotrf, cusolver.spotrf_bufferSize)
    )
    handle = cuda_device.get_cusolver_handle()
    uplo = cublas.CUBLAS_FILL_MODE_UPPER
    lwork = size(handle, uplo, n, x.data.ptr, n)
    work = cupy.empty(max(int(lwork), 1), dtype=x.dtype)
    info = cupy.zeros(1, dtype=np.int32)
    potrf(handle, uplo, n, x.data.ptr, n, work.data.ptr, lwork, info.data.ptr)
    code = int(info.get()[0])
    # zero the strict upper triangle (POTRF leaves it as it was)
    x[...] = cupy.tril(x)
    return x, code


@functools.cache
def _namespace(name: str) -> Any:
    from array_api_compat import array_namespace

    if name == "numpy":
        return array_namespace(np.empty(0))
    if name == "cupy":
        cupy = _optional.require("cupy", "device='cuda'")
        return array_namespace(cupy.empty(0))
    if name == "array_api_strict":
        import array_api_strict

        return array_api_strict
    raise ValueError(f"unknown backend {name!r}; use one of {BACKENDS}")


@functools.cache
def get_backend(name: str = "numpy") -> Backend:
    """The :class:`Backend` called ``name`` (``"numpy"``, ``"cupy"``, ``"array_api_strict"``).

    ``"cupy"`` without CuPy raises :class:`~pipeline.errors.MissingExtraError` naming
    the extra ``[gpu]``.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; use one of {BACKENDS}")
    device = "cuda" if name == "cupy" else "cpu"
    return Backend(name, _namespace(name), device)


def cuda_available() -> tuple[bool, str]:
    """Whether CuPy imports and sees at least one CUDA device; and why not."""
    try:
        import cupy
    except ImportError as e:
        return False, f"CuPy is not installed ({type(e).__name__}: {e})"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - CUDA raises its own runtime errors
        return False, f"CuPy finds no usable CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "CuPy finds no CUDA device"
    return True, f"{n} CUDA device(s)"


def resolve_device(device: str = "cpu") -> tuple[Backend, str]:
    """The backend for the user's ``device``, and the reason, for the plan.

    ``"cpu"``: NumPy. ``"cuda"``: CuPy on the current GPU, or
    :class:`~pipeline.errors.DeviceUnavailableError` (a ``ValueError``) naming what is
    missing and the extra to install. ``"auto"``: CuPy when a GPU is there, else the
    CPU, with a log line saying why.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return get_backend("numpy"), "device='cpu'"
    ok, why = cuda_available()
    if device == "cuda":
        if not ok:
            raise DeviceUnavailableError(
                f"device='cuda' needs CuPy and an NVIDIA GPU: {why}. Install the GPU "
                "extra (pip install 'krr-pipeline[gpu]', or the cupy-cudaXXx wheel for "
                "your CUDA) on a machine with a GPU, or use device='cpu' or device='auto'"
            )
        return get_backend("cupy"), f"device='cuda': {why}"
    if ok:
        return get_backend("cupy"), f"device='auto' found a GPU ({why})"
    log.info("device='auto': running on the CPU, because %s", why)
    return get_backend("numpy"), f"device='auto' fell back to the CPU: {why}"
