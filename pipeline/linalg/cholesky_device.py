"""The tile Cholesky on a :class:`~pipeline.engine.backend.Backend` (a GPU through CuPy):
the resident-tile schedule. Over a stored Gram it is run by the one driver,
:func:`pipeline.linalg.cholesky.tile_cholesky` with ``backend=`` (its checks first); the
in-memory dense fit runs it on NumPy with its own matrix as ``target``.

The same mathematics, tile order and k order as the CPU's tile Cholesky
(:mod:`pipeline.linalg.cholesky_tile`), column after column (left-looking):

    A    = K_ij + shift * delta_ij * I - sum_{k<j} L_ik @ L_jk.T     (k = 0, 1, ..., j-1)
    L_jj = potrf(A)                 (i == j; float64 also for a float32 factor)
    L_ij = A @ inv(L_jj).T          (i > j, a TRSM)

with the backend's calls: :meth:`~Backend.gemm_nt_sub` for the updates (cuBLAS GEMM
with beta = 1, in place; :meth:`~Backend.syrk_lower_sub` for a diagonal tile's, half
the flops on the host), :meth:`~Backend.cholesky_lower` (cuSOLVER POTRF in place)
and :meth:`~Backend.trsm_right_lower_t`. On the NumPy backend these are the CPU tile
Cholesky's own GIL-free calls (:mod:`pipeline.engine.blas`). Every tile is its own contiguous device
array, and a Gram tile's buffer becomes its factor tile: the device holds the factor
once (the lower triangle), never a second copy of the matrix.

The Gram tiles come from ``tile_fn(i, j)``: computed on the device, or read from a
stored Gram (:func:`stored_tiles`). With a factor store ``L`` (a
:class:`~pipeline.storage.TiledArray` under :func:`device_factor_fingerprint`), each
finished tile is copied to the host and written, region first and marker last, by
one writer thread, while the next tiles are computed; a rerun uploads the marked
tiles instead of computing them, and gives the same factor bit for bit (the sums are
in a fixed order). ``memory_limit`` caps the device bytes the factor's tiles hold
(the out-of-core mode), in one of two orders of the same work, with the same factor
bit for bit: the **tile** schedule evicts finished tiles least recently used first and
uploads one again for each update that needs it (any limit of four tiles; the host
backends' order); the **panel** schedule, a GPU's default past its memory, factors as
many tile columns as fit together and streams every earlier column through the device
once per panel from page-locked host copies, the copies on their own streams ahead of
the compute (:class:`~pipeline.engine.backend.TileCopies`), so that one upload serves
a GEMM per panel column.

Device-generic: the arithmetic only uses the array API (``be.xp``) and the backend's
calls, so it runs, and is tested, on NumPy and array-api-strict too; the CuPy-only
parts are the copy streams and page-locked host memory (the writer thread's buffer,
:class:`~pipeline.engine.backend.TileCopies`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import numpy as np

from pipeline.constants import (
    DEVICE_MEMORY_SHARE,
    GPU_BLOCK,
    HOST_BLOCK,
    MIN_RESIDENT_TILES,
    PANEL_PREFETCH,
    PANEL_SCRATCH_TILES,
)
from pipeline.engine.backend import Backend, TileCopies
from pipeline.engine.tile_io import TileIO
from pipeline.errors import DeviceUnavailableError
from pipeline.linalg.cholesky_options import (
    JitterPolicy,
    factor_fingerprint,
    make_jitter_policy,
    regularisation_shift,
)
from pipeline.linalg.cholesky_tile import finish_tile, shifted_tile, update
from pipeline.storage import TiledArray, fingerprint_obj, open_tiled_array
from pipeline.storage.tiles import TileGrid, copy_tile
from pipeline.storage.waits import cap_store_waits_if_interrupted

log = logging.getLogger(__name__)

__all__ = [
    "DeviceCholeskyFactor",
    "check_device_memory",
    "device_block",
    "device_cholesky",
    "device_factor_fingerprint",
    "open_device_factor",
    "stored_tiles",
]

# ---------------------------------------------------------------------------------
# sizes


def _device_memory(be: Backend) -> tuple[int, int] | None:
    """(free, total) device bytes, None on the host. On CuPy the free bytes count the
    blocks CuPy's memory pool holds unused (freed arrays it keeps for reuse), which
    ``memGetInfo`` counts as taken."""
    mem = be.memory()
    if mem is None or be.name != "cupy":
        return mem
    import cupy  # pragma: no cover - GPU only

    return mem[0] + int(cupy.get_default_memory_pool().free_bytes()), mem[1]  # pragma: no cover


def _column_bytes(n: int, block: int, itemsize: int) -> int:
    """Working set of one tile column: its ``ceil(n/block)`` tiles plus the Gram tile
    being made and one scratch tile (the POTRF's copy or the TRSM's result)."""
    return (-(-n // block) + 2) * block * block * itemsize


def _largest_fitting_block(n: int, free: int, itemsize: int) -> int:
    """The largest multiple of 128 (at most :data:`GPU_BLOCK`) whose tile column fits
    in ``free`` bytes; 0 when not even 128 does."""
    b = min(GPU_BLOCK, -(-max(n, 1) // 128) * 128)
    while b >= 128:
        if _column_bytes(n, b, itemsize) <= free:
            return b
        b -= 128
    return 0


def device_block(n: int, be: Backend, dtype: Any = "float64") -> int:
    """Default tile edge for a factor of order ``n`` on ``be``.

    :data:`GPU_BLOCK` (4096) on CuPy, smaller where one tile column would not fit in
    the GPU's free memory; :data:`HOST_BLOCK` (256) on host backends. Never more than
    ``n`` (at least 1).
    """
    n = int(n)
    cap = max(n, 1)
    mem = _device_memory(be)
    if mem is None:
        return min(HOST_BLOCK, cap)
    free, _ = mem
    fit = _largest_fitting_block(n, int(free * DEVICE_MEMORY_SHARE), np.dtype(dtype).itemsize)
    return min(fit or 128, GPU_BLOCK, cap)


def check_device_memory(be: Backend, n: int, block: int, dtype: Any = "float64") -> None:
    """Raise before any work when the device cannot hold one tile column of the factor.

    The working set of one tile column is ``(ceil(n/block) + 2) * block**2 * itemsize``
    bytes (the column's tiles, the Gram tile being made, one scratch tile). A host
    backend always passes.

    Raises
    ------
    DeviceUnavailableError
        The device's free memory is smaller; the message names the tile size that
        would fit (or says that none does).
    """
    mem = _device_memory(be)
    if mem is None:
        return
    free, total = mem
    dtype = np.dtype(dtype)
    need = _column_bytes(int(n), int(block), dtype.itemsize)
    if need <= free:
        return
    fit = _largest_fitting_block(int(n), free, dtype.itemsize)
    gib = 2.0**30
    advice = (
        f"use block={fit} (or smaller), or device='cpu'"
        if fit
        else "no tile size fits (not even 128): free device memory, or use device='cpu'"
    )
    raise DeviceUnavailableError(
        f"the GPU has {free / gib:.2f} GiB free of {total / gib:.2f} GiB, too little for one "
        f"tile column of the {n}x{n} {dtype.name} factor with {block}x{block} tiles "
        f"({need / gib:.2f} GiB); {advice}"
    )


# ---------------------------------------------------------------------------------
# the factor's store


def device_factor_fingerprint(
    gram: Any, lam: float, convention: str, jitter: Any, dtype: Any, be: Backend
) -> str:
    """Fingerprint of a factor made on ``be``: the CPU's
    :func:`~pipeline.linalg.cholesky_options.factor_fingerprint` (``gram``: the Gram's
    TiledArray, or its fingerprint string) chained with ``{"device": be.name}`` (another
    backend rounds differently, so its tiles are other work). On the host, also the
    tiles' recipe: the engine's in-place GEMM and TRSM (``"engine-blas"``), whose bits
    differ from NumPy's ``a -= x @ y.T`` and SciPy's ``solve_triangular`` that made the
    tiles stored before (no ``"update"``)."""
    g = SimpleNamespace(fingerprint=gram) if isinstance(gram, str) else gram
    policy = make_jitter_policy(jitter)
    recipe = {"factor": factor_fingerprint(g, lam, convention, policy, dtype), "device": be.name}
    if be.name == "numpy":
        recipe["update"] = "engine-blas"
    return fingerprint_obj(recipe)


def open_device_factor(
    store: str,
    gram: Any,
    n: int,
    block: int,
    lam: float,
    be: Backend,
    *,
    convention: str = "sklearn",
    jitter: Any = None,
    dtype: Any = "float64",
    name: str = "chol",
    overwrite: bool = True,
) -> TiledArray:
    """Create (or reopen, to resume) the store of a device factor: the CPU factor's
    layout and attributes, under :func:`device_factor_fingerprint`."""
    policy = make_jitter_policy(jitter)
    shift = regularisation_shift(lam, int(n), convention)
    gfp = gram if isinstance(gram, str) else gram.fingerprint
    attrs = {
        "lambda": float(lam),
        "convention": convention,
        "shift": float(shift),
        "gram_fingerprint": gfp,
        "jitter_policy": None if policy is None else policy.to_dict(),
        "layout": "lower tiles of L with L @ L.T = K + shift*I; upper tiles unwritten",
        "device": be.name,
    }
    fp = device_factor_fingerprint(gfp, lam, convention, policy, dtype, be)
    return open_tiled_array(
        str(store), name, (int(n), int(n)), int(block), np.dtype(dtype), fp,
        overwrite=overwrite, attributes=attrs,
    )  # fmt: skip


def stored_tiles(gram: TiledArray) -> Callable[[int, int], np.ndarray]:
    """``tile_fn`` reading the lower tiles of a stored Gram (each verified against its
    marker's checksum); give :func:`device_cholesky` ``read_ahead=STORED_READ_AHEAD``
    so the reads overlap the device's work."""

    def tile_fn(i: int, j: int) -> np.ndarray:
        return gram.read_tile(i, j)

    return tile_fn


# ---------------------------------------------------------------------------------
# the factor


class _Tiles(Mapping):
    """Read-only view ``(i, j) -> device tile`` of a factor (evicted tiles come back)."""

    def __init__(self, factor: DeviceCholeskyFactor) -> None:
        self._f = factor

    def __getitem__(self, key: tuple[int, int]) -> Any:
        i, j = key
        if not (0 <= j <= i < self._f.grid.n_row_blocks):
            raise KeyError(key)
        return self._f.tile(i, j)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return self._f.grid.lower_tiles()

    def __len__(self) -> int:
        return self._f.grid.n_lower_tiles()


class DeviceCholeskyFactor:
    """The factor ``L`` (``L @ L.T = K + shift * I``) held as device tiles.

    Attributes
    ----------
    be : Backend
    n, block : int
    shift, lam : float
    convention : str
    dtype : numpy.dtype
    L : TiledArray or None
        The factor's store, when one was given.
    jitter : dict
        ``{"j.j": jitter}`` of the diagonal tiles that needed it.
    info : dict
        ``tiles_computed``, ``tiles_resumed``, ``uploads``, ``evictions``,
        ``seconds``, ``gflops`` (``n**3 / 3`` flops over ``seconds``), ``block``,
        ``backend``, ``memory_limit``, ``peak_tile_bytes``.
    """

    def __init__(
        self, be: Backend, n: int, block: int, dtype: Any, memory_limit: int | None,
        L: TiledArray | None, target: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        self.be = be
        self.n, self.block = int(n), int(block)
        self.grid = TileGrid(self.n, self.n, self.block)
        self.dtype = np.dtype(dtype)
        self.memory_limit = memory_limit
        self.L = L
        self.target = target
        self.shift = 0.0
        self.lam: float | None = None
        self.convention = "sklearn"
        self.jitter: dict[str, float] = {}
        self.info: dict[str, Any] = {}
        self._dev: OrderedDict[tuple[int, int], Any] = OrderedDict()  # LRU, newest last
        self._host: dict[tuple[int, int], np.ndarray] = {}  # host copies (evicted tiles)
        self._copies: TileCopies | None = None  # the panel schedule's copies
        self._writes: dict[tuple[int, int], Future] = {}
        self._resident = 0
        self._peak = 0
        self.uploads = 0
        self.evictions = 0
        self._freed = False

    # -- tiles on the device -----------------------------------------------------
    @property
    def tiles(self) -> Mapping:
        """``(i, j) -> device tile`` for ``j <= i`` (an evicted tile is uploaded again)."""
        return _Tiles(self)

    def _nbytes(self, i: int, j: int) -> int:
        r, c = self.grid.row_slice(i), self.grid.row_slice(j)
        return (r.stop - r.start) * (c.stop - c.start) * self.dtype.itemsize

    def _make_room(self, nbytes: int, pinned: tuple[tuple[int, int], ...]) -> None:
        """Evict least recently used tiles (not ``pinned``) until ``nbytes`` more fit."""
        if self.memory_limit is None:
            return
        for key in list(self._dev):
            if self._resident + nbytes <= self.memory_limit:
                return
            if key in pinned:
                continue
            self._evict(key)

    def _evict(self, key: tuple[int, int]) -> None:
        tile = self._dev.pop(key)
        if key in self._host:  # its host copy is kept
            pass
        elif self.L is not None:  # on the host in L once its write finished
            self._writes[key].result()
        elif self.target is None:  # (in the target already)
            self._host[key] = self.be.to_numpy(tile)
        self._resident -= self._nbytes(*key)
        self.evictions += 1

    def _hold(self, key: tuple[int, int], tile: Any, pinned=()) -> Any:
        """Keep ``tile`` as factor tile ``key`` on the device (making room first)."""
        self._make_room(self._nbytes(*key), pinned)
        self._dev[key] = tile
        self._resident += self._nbytes(*key)
        self._peak = max(self._peak, self._resident)
        return tile

    def tile(self, i: int, j: int, pinned: tuple[tuple[int, int], ...] = ()) -> Any:
        """Factor tile ``(i, j)`` on the device: uploaded again if it was evicted."""
        if self._freed:
            raise RuntimeError("the device factor was freed (factor.free()); factor again")
        key = (int(i), int(j))
        if key in self._dev:
            self._dev.move_to_end(key)
            return self._dev[key]
        if key in self._host:  # (kept: evicting the tile again costs no copy)
            if self._copies is not None:
                self._copies.downloaded(key)
            host = self._host[key]
        elif self.L is not None and key in self._writes:
            self._writes[key].result()
            host = self.L.read_tile(*key)
        elif self.target is not None and key in self._writes:
            host = self.target[self.grid.row_slice(key[0]), self.grid.row_slice(key[1])]
            host = np.tril(host) if key[0] == key[1] else host  # (its upper part is K's)
        else:
            raise KeyError(f"factor tile {key} is not computed")
        self.uploads += 1
        return self._hold(key, self.be.asarray(np.ascontiguousarray(host), self.dtype), pinned)

    # -- results -----------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """The dense lower factor on the host (tests and small ``n`` only)."""
        out = np.zeros((self.n, self.n), dtype=self.dtype)
        for i, j in self.grid.lower_tiles():
            out[self.grid.row_slice(i), self.grid.row_slice(j)] = self.be.to_numpy(self.tile(i, j))
        return out

    def solve(self, Y: Any) -> np.ndarray:
        """``(K + shift I)^-1 Y`` by forward then back substitution over the tiles, on
        the device, in a fixed order. ``Y``: host array, ``(n,)`` or ``(n, m)``; the
        result is a float64 host array of its shape."""
        be, xp, g = self.be, self.be.xp, self.grid
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim not in (1, 2) or Y.shape[0] != self.n:
            raise ValueError(f"Y must have shape ({self.n},) or ({self.n}, m), got {Y.shape}")
        Y2 = Y.reshape(self.n, -1)
        T = g.n_row_blocks
        f64 = be.dtype("float64")

        def lt(i, j):  # a factor tile in float64 (a float32 factor solves in float64)
            t = self.tile(i, j)
            return t if self.dtype == np.float64 else xp.astype(t, f64)

        z = []
        for i in range(T):  # forward: L z = y
            zi = be.asarray(np.ascontiguousarray(Y2[g.row_slice(i)]), "float64")
            for k in range(i):
                zi = zi - xp.matmul(lt(i, k), z[k])
            z.append(be.solve_triangular(lt(i, i), zi, lower=True))
        x: list[Any] = [None] * T
        for i in reversed(range(T)):  # back: L.T x = z
            xi = z[i]
            for k in range(i + 1, T):
                xi = xi - xp.matmul(xp.matrix_transpose(lt(k, i)), x[k])
            x[i] = be.solve_triangular(lt(i, i), xi, lower=True, trans=True)
        out = np.concatenate([be.to_numpy(v) for v in x], axis=0) if T else np.zeros_like(Y2)
        return out.reshape(Y.shape)

    def free(self) -> None:
        """Let go of the device tiles (and the host copies of evicted ones)."""
        self._dev.clear()
        self._host.clear()
        self._resident = 0
        self._freed = True


# ---------------------------------------------------------------------------------
# the writer thread: device -> host -> store, overlapping the next tiles' compute


class _Writer:
    """The factor's write-behind: the tile engine's ordered writer
    (:class:`~pipeline.engine.tile_io.TileIO`: one thread, region first and marker last,
    in completion order), each write copying its tile to the host first. On CuPy the
    copy runs on its own non-blocking stream, into a pinned host buffer, after the
    tile's compute. ``tiles``: the most writes that may wait (all of the factor's: the
    compute never waits for the store, as the tiles are on the device anyway)."""

    def __init__(self, be: Backend, L: TiledArray, block: int, dtype: np.dtype, tiles: int) -> None:
        self.be, self.L = be, L
        self.io = TileIO(depth=0, max_pending=max(1, int(tiles)))
        self._cupy = be.name == "cupy"
        if self._cupy:  # pragma: no cover - GPU only
            import cupy

            self.stream = cupy.cuda.Stream(non_blocking=True)
            nbytes = block * block * dtype.itemsize
            self._pinned = cupy.cuda.alloc_pinned_memory(nbytes)
            self._buf = np.frombuffer(self._pinned, dtype, block * block)

    def submit(self, i: int, j: int, tile: Any, info: dict[str, Any]) -> Future:
        """Store the device tile ``(i, j)``; the future is done once it is stored."""
        if self._cupy:  # pragma: no cover - GPU only
            import cupy

            done = cupy.cuda.Event()
            done.record(cupy.cuda.get_current_stream())
            return self.io.write((i, j), tile, lambda t: self._write_cupy(i, j, t, done, info))
        return self.io.write(
            (i, j), tile, lambda t: self.L.write_tile(i, j, self.be.to_numpy(t), **info)
        )

    def submit_host(
        self, i: int, j: int, host: np.ndarray, info: dict[str, Any], copies: TileCopies, key: Any
    ) -> Future:
        """Store a tile whose host copy ``copies`` is downloading (no second copy)."""

        def write(h: np.ndarray) -> None:
            copies.downloaded(key)
            self.L.write_tile(i, j, h, **info)

        return self.io.write((i, j), host, write)

    def _write_cupy(self, i, j, tile, done, info) -> None:  # pragma: no cover - GPU only
        host = self._buf[: tile.size].reshape(tile.shape)
        with tile.device:  # this thread's current device is the tile's
            self.stream.wait_event(done)
            tile.get(stream=self.stream, out=host)  # blocking: returns once copied
        self.L.write_tile(i, j, host, **info)

    def close(self) -> None:
        """Finish the queued writes; a failed one's error is in its future (and the
        writes queued after it hold that error)."""
        self.io.close(raise_error=False)


# ---------------------------------------------------------------------------------
# the factorisation


def device_cholesky(
    be: Backend,
    tile_fn: Callable[[int, int], Any],
    n: int,
    block: int,
    *,
    shift: float,
    dtype: Any = "float64",
    jitter: Any = None,
    L: TiledArray | None = None,
    target: np.ndarray | None = None,
    memory_limit: int | None = None,
    lam: float | None = None,
    convention: str = "sklearn",
    progress: bool = False,
    schedule: str = "auto",
    read_ahead: int = 0,
) -> DeviceCholeskyFactor:
    """Factor ``K + shift * I = L @ L.T`` tile by tile on the backend ``be``.

    Parameters
    ----------
    be : Backend
        Where the tiles live and are computed (``get_backend("cupy")`` on a GPU).
    tile_fn : callable (i, j) -> array
        Gram tile ``K_ij`` (rows of block ``i``, columns of block ``j``, ``j <= i``),
        a host or device array, fresh on every call: the factorisation takes it over
        (its buffer becomes ``L_ij``). :func:`stored_tiles` reads a stored Gram.
    n, block : int
        Order of ``K`` and tile edge (:func:`device_block` gives a default).
    shift : float
        The diagonal shift (``regularisation_shift(lam, n, convention)``).
    dtype : {"float64", "float32"}
        The factor's dtype (diagonal tiles are factored in float64 either way).
    jitter : None, True, float, dict or JitterPolicy
        As the CPU's: off raises on a diagonal tile that is not positive definite;
        on retries it with growing jitter (recorded in the marker and ``jitter``).
    L : TiledArray, optional
        The factor's store (:func:`open_device_factor`): finished tiles are written
        to it by one writer thread (marker last), and marked tiles are uploaded
        instead of computed (resume).
    target : numpy.ndarray, optional
        An ``(n, n)`` host matrix as the factor's storage (the in-memory dense solve's
        working matrix, usually the one ``tile_fn`` reads from): each finished tile is
        copied into its lower triangle, the diagonal included, and the strict upper
        triangle is never written, as with LAPACK's POTRF; evicted tiles come back from
        it. The factorisation in place, with ``memory_limit`` a few tiles.
    memory_limit : int, optional
        Bytes of device memory the factor's tiles may hold; past it the least
        recently used finished tiles leave the device (they are in ``L`` or on the
        host) and come back when needed. Default: unlimited on host backends,
        :data:`DEVICE_MEMORY_SHARE` of the free memory on a GPU.
    lam, convention : float, str
        For the error messages and the factor's record (``lam`` defaults to the
        lambda that ``shift`` is under ``convention``).
    progress : bool
        Log a line per finished tile column.
    schedule : {"auto", "tiles", "panels"}
        The order of the tile work when the factor does not fit in ``memory_limit``
        (the result is the same bit for bit). ``"tiles"``: tile after tile, finished
        tiles evicted least recently used first and uploaded again when needed (any
        limit of :data:`MIN_RESIDENT_TILES` tiles; one GEMM per upload). ``"panels"``:
        as many tile columns as fit factored together, every earlier column streamed
        through the device once per panel while the previous tile is multiplied (a
        tile uploaded serves one GEMM per panel column; the factor's tiles are kept
        on the host, pinned). ``"auto"``: panels on a device backend when the tiles the
        tile order still needs at once do not fit (it would upload tiles again) and a
        one-column panel does; else tiles.
    read_ahead : int
        Threads that call ``tile_fn`` ahead of the factorisation, in the order it asks
        for the tiles (the engine's :class:`~pipeline.engine.tile_io.TileIO`; 0: none,
        each call in turn). For a ``tile_fn`` that reads the
        host or a store (:func:`stored_tiles`, :data:`~pipeline.constants.STORED_READ_AHEAD`): the reads and
        their checks then overlap the device's work. Same tiles, same factor.

    Returns
    -------
    DeviceCholeskyFactor

    Raises
    ------
    NotPositiveDefiniteError
        A diagonal tile is not positive definite (names tile, pivot row, lambda).
    NonFiniteKernelError
        The Gram holds inf or NaN (a non-finite diagonal before or after POTRF).
    DeviceUnavailableError
        The device cannot hold one tile column (:func:`check_device_memory`).
    ValueError
        Bad sizes, dtype, a store of another shape or block, or a ``memory_limit``
        below :data:`MIN_RESIDENT_TILES` tiles.
    """
    t0 = time.perf_counter()
    schedule_asked = schedule
    n, block = int(n), int(block)
    if n < 1 or block < 1:
        raise ValueError(f"n and block must be >= 1, got n={n}, block={block}")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dtype}")
    shift = float(shift)
    if lam is None:  # for the messages: the lambda this shift is
        lam = shift if convention == "sklearn" else shift / n
    policy: JitterPolicy | None = make_jitter_policy(jitter)
    if L is not None and (tuple(L.shape) != (n, n) or int(L.block_size) != block
                          or np.dtype(L.dtype) != dtype):  # fmt: skip
        raise ValueError(
            f"the factor store {L.name!r} has shape {tuple(L.shape)}, block {L.block_size}, "
            f"dtype {np.dtype(L.dtype)}; this factor needs ({n}, {n}), {block}, {dtype}"
        )
    check_device_memory(be, n, block, dtype)
    tile_bytes = block * block * dtype.itemsize
    if memory_limit is None and _device_memory(be) is not None:
        memory_limit = int(_device_memory(be)[0] * DEVICE_MEMORY_SHARE)
    if memory_limit is not None and memory_limit < MIN_RESIDENT_TILES * tile_bytes:
        raise ValueError(
            f"memory_limit={memory_limit} bytes holds fewer than {MIN_RESIDENT_TILES} "
            f"{block}x{block} {dtype.name} tiles ({MIN_RESIDENT_TILES * tile_bytes} bytes), "
            "the least a tile's update needs: raise it or use a smaller block"
        )
    if target is not None and (L is not None or target.shape != (n, n)):
        raise ValueError(f"target must be an ({n}, {n}) host matrix, and no store with it")
    f = DeviceCholeskyFactor(be, n, block, dtype, memory_limit, L, target)
    f.shift, f.lam, f.convention = shift, lam, convention
    T = f.grid.n_row_blocks
    if schedule not in ("auto", "tiles", "panels"):
        raise ValueError(f"schedule must be 'auto', 'tiles' or 'panels', got {schedule!r}")
    limit_tiles = None if memory_limit is None else memory_limit // tile_bytes
    fits = limit_tiles is None or T * (T + 1) // 2 + PANEL_SCRATCH_TILES <= limit_tiles
    if schedule == "auto":  # panels where the tile order would upload tiles again
        live = limit_tiles is None or _live_tiles(T) + PANEL_SCRATCH_TILES <= limit_tiles
        schedule = "tiles" if be.is_host or live else "panels"
    if schedule == "panels" and not fits and limit_tiles < _panel_tiles(T, 0, 1):
        if schedule_asked == "panels":
            raise ValueError(
                f"memory_limit={memory_limit} bytes holds {limit_tiles} {block}x{block} "
                f"tiles, fewer than one tile column's panel needs "
                f"({_panel_tiles(T, 0, 1)}): raise it, or use schedule='tiles'"
            )
        schedule = "tiles"  # (the tile order streams any limit of MIN_RESIDENT_TILES)
    done = set(L.markers.done()) if L is not None else set()
    reads = None
    if read_ahead > 0:  # the engine's read-ahead, in the schedules' order: column by column
        order = [(i, j) for j in range(T) for i in range(j, T) if (i, j) not in done]
        reads = TileIO(lambda key, fn=tile_fn: fn(*key), order, depth=2 * int(read_ahead),
                       max_pending=0, read_threads=int(read_ahead))  # fmt: skip
        tile_fn = lambda i, j: reads.read((i, j))  # noqa: E731
    run = _Run(be, f, tile_fn, shift, policy, dtype, progress)
    run.done = done
    run.writer = _Writer(be, L, block, dtype, T * (T + 1) // 2) if L is not None else None
    try:
        if schedule == "tiles":
            _tile_schedule(run)
        else:
            run.copies = f._copies = TileCopies(be)
            edge = [_rows(f.grid, i) for i in range(T)]
            run.copies.reserve(  # every tile's host copy, made ahead in the order asked
                {(i, j): (edge[i], edge[j]) for j in range(T) for i in range(j, T)}, dtype
            )
            try:
                for j0, j1 in _panels(T, None if fits else limit_tiles):
                    _panel(run, j0, j1, last=j1 == T)
            finally:
                run.copies.close()
    except BaseException as e:
        cap_store_waits_if_interrupted(e)  # Ctrl-C: the queued writes give up in seconds
        raise
    finally:
        if reads is not None:
            reads.close()
        if run.writer is not None:
            run.writer.close()  # the finished tiles are stored, also when a tile failed
    computed, resumed = run.computed, run.resumed
    for fut in f._writes.values():
        fut.result()  # a failed write raises here
    be.synchronize()
    seconds = time.perf_counter() - t0
    f.info = {
        "backend": be.name,
        "n": n,
        "block": block,
        "dtype": dtype.name,
        "tiles_computed": computed,
        "tiles_resumed": resumed,
        "uploads": f.uploads,
        "evictions": f.evictions,
        "memory_limit": memory_limit,
        "peak_tile_bytes": f._peak,
        "seconds": seconds,
        "gflops": (n**3 / 3) / seconds / 1e9 if seconds > 0 else math.nan,
        "jitter": dict(f.jitter),
        "schedule": schedule,
    }
    if schedule == "panels":
        f.info["panels"] = run.panels
    return f


class _Run:
    """One factorisation's fixed inputs and counters, shared by the two schedules."""

    def __init__(self, be, f, tile_fn, shift, policy, dtype, progress) -> None:
        self.be, self.f, self.tile_fn, self.shift = be, f, tile_fn, shift
        self.policy, self.dtype, self.progress = policy, dtype, progress
        self.grid, self.T = f.grid, f.grid.n_row_blocks
        self.tile_bytes = f.block * f.block * dtype.itemsize
        self.done: set = set()
        self.writer: _Writer | None = None
        self.copies: TileCopies | None = None
        self.computed = self.resumed = self.panels = 0

    def gram(self, i: int, j: int) -> tuple[Any, float]:
        """The Gram tile ``K_ij`` to update (owned; a diagonal one shifted), and the
        jitter's scale (:func:`~pipeline.linalg.cholesky_tile.shifted_tile`)."""
        return shifted_tile(self.be, self.tile_fn(i, j), i, j, self.shift, self.dtype)

    def update(self, a: Any, i: int, j: int, lik: Any, ljk: Any) -> Any:
        """``A_ij -= L_ik L_jkᵀ`` (a diagonal tile: only its lower triangle)."""
        return update(self.be, a, i, j, lik, ljk)

    def finish(self, a: Any, i: int, j: int, scale: float, ljj: Any) -> tuple[Any, dict]:
        """The updated tile's factor tile (POTRF on the diagonal, else a TRSM) and the
        marker's info."""
        f = self.f
        out, info = finish_tile(
            self.be, a, i, j, ljj, row0=f.grid.row_slice(j).start, shift=self.shift,
            scale=scale, policy=self.policy, dtype=self.dtype, lam=f.lam,
            convention=f.convention,
        )  # fmt: skip
        if "jitter" in info:
            f.jitter[f"{j}.{j}"] = info["jitter"]
        info["device"] = self.be.name
        return out, info

    def resumed_tile(self, i: int, j: int) -> np.ndarray:
        """A stored factor tile (verified on read), counted as resumed; a diagonal
        one's jitter back in the factor's record."""
        f = self.f
        f._writes[(i, j)] = _finished(None)
        host = f.L.read_tile(i, j)
        self.resumed += 1
        if i == j and self.policy is not None:
            eps = (f.L.markers.record((i, j)) or {}).get("jitter")
            if eps:
                f.jitter[f"{j}.{j}"] = float(eps)
        return host


def _tile_schedule(run: _Run) -> None:
    """Tile after tile, column after column (left-looking), the factor's finished tiles
    kept on the device while ``memory_limit`` allows and evicted least recently used
    first past it: any limit of :data:`MIN_RESIDENT_TILES` tiles works, and one whose
    panel would not fit streams one tile per update (the host backends' order)."""
    be, f, T, tile_bytes = run.be, run.f, run.T, run.tile_bytes
    for j in range(T):
        for i in range(j, T):
            key = (i, j)
            if key in run.done:  # resume: the stored tile (verified) instead of compute
                host = run.resumed_tile(i, j)
                f._hold(key, be.asarray(np.ascontiguousarray(host), run.dtype))
                f.uploads += 1
                continue
            ts = time.perf_counter()
            f._make_room(tile_bytes, ())  # the Gram tile's room
            a, scale = run.gram(i, j)
            f._resident += tile_bytes  # A counts while it is updated
            try:
                for k in range(j):  # the fixed k order
                    ljk = f.tile(j, k, pinned=((i, k),))
                    lik = f.tile(i, k, pinned=((j, k),))
                    a = run.update(a, i, j, lik, ljk)
            finally:
                f._resident -= tile_bytes
            out, info = run.finish(a, i, j, scale, None if i == j else f.tile(j, j))
            del a
            info["seconds"] = round(time.perf_counter() - ts, 4)
            f._hold(key, out, pinned=((j, j),))
            if f.target is not None:
                _store_in(f.target, f.grid, i, j, be.to_numpy(out))
            run.computed += 1
            f._writes[key] = (
                run.writer.submit(i, j, out, info) if run.writer is not None else _finished(None)
            )
        if run.progress:
            log.info("device Cholesky: tile column %d of %d done", j + 1, T)


def _live_tiles(T: int) -> int:
    """The most factor tiles the tile order still needs at once: at column j, those of
    rows ``j:`` in columns ``:j+1`` (the rows above are done with until the solve)."""
    return max(((j + 1) * (T - j) for j in range(T)), default=0)


def _panel_tiles(T: int, j0: int, j1: int) -> int:
    """Device tiles the panel of tile columns ``j0:j1`` needs: its own lower tiles, the
    upload slots (the panel's rows of one earlier column, twice, and
    :data:`PANEL_PREFETCH` + 1 more) and :data:`PANEL_SCRATCH_TILES`."""
    w = j1 - j0
    own = sum(T - j for j in range(j0, j1))
    return own + 2 * w + PANEL_PREFETCH + 1 + PANEL_SCRATCH_TILES


def _panels(T: int, limit_tiles: int | None) -> list[tuple[int, int]]:
    """The tile columns cut into panels as wide as ``limit_tiles`` allows (one panel
    when None)."""
    if limit_tiles is None:
        return [(0, T)] if T else []
    out, j0 = [], 0
    while j0 < T:
        j1 = j0 + 1
        while j1 < T and _panel_tiles(T, j0, j1 + 1) <= limit_tiles:
            j1 += 1
        out.append((j0, j1))
        j0 = j1
    return out


def _panel(run: _Run, j0: int, j1: int, last: bool) -> None:
    """Factor the tile columns ``j0:j1`` (a panel) with every earlier column streamed
    through the device once.

    The panel's Gram tiles are made on the device; then, for each earlier column k in
    order, its tiles from row ``j0`` down are uploaded one after another (while the
    previous ones are multiplied: :class:`~pipeline.engine.backend.TileCopies`) and each
    updates every panel tile of its row, so a tile brought in serves up to ``j1 - j0``
    GEMMs; then the panel is factored inside, left-looking, as the tile schedule does.
    Every tile sees its updates in the fixed k order, so the factor is the tile
    schedule's bit for bit. Finished tiles are copied to the host (pinned) as they are
    made, stored, and leave the device when the panel is done (the last panel stays).
    """
    be, f, T, copies = run.be, run.f, run.T, run.copies
    g = f.grid
    keys = [(i, j) for j in range(j0, j1) for i in range(j, T)]
    todo = [key for key in keys if key not in run.done]
    run.panels += 1
    ts = time.perf_counter()
    work: dict[tuple[int, int], Any] = {}
    scales: dict[tuple[int, int], float] = {}
    for key in keys:
        if key in run.done:  # resumed: its host copy and its device tile
            host = run.resumed_tile(*key)
            f._host[key] = hold = copies.host_tile(key, host.shape, run.dtype)
            np.copyto(hold, host, casting="same_kind")
            f._dev[key] = be.asarray(hold, run.dtype)
            f._resident += f._nbytes(*key)
            f.uploads += 1
        else:
            work[key], scales[key] = run.gram(*key)
            f._resident += f._nbytes(*key)
    f._peak = max(f._peak, f._resident)
    if todo and j0:
        _stream_earlier_columns(run, j0, j1, work)
    for j in range(j0, j1):
        for i in range(j, T):
            key = (i, j)
            if key not in work:
                continue
            a = work.pop(key)
            for k in range(j0, j):  # the fixed k order, within the panel
                a = run.update(a, i, j, f._dev[(i, k)], f._dev[(j, k)])
            out, info = run.finish(a, i, j, scales[key], None if i == j else f._dev[(j, j)])
            del a
            info["seconds"] = round(time.perf_counter() - ts, 4)
            f._dev[key] = out
            f._host[key] = host = copies.host_tile(key, tuple(out.shape), run.dtype)
            copies.download(key, out, host)
            run.computed += 1
            if run.writer is not None:
                f._writes[key] = run.writer.submit_host(i, j, host, info, copies, key)
            else:
                f._writes[key] = _finished(None)
        if run.progress:
            log.info("device Cholesky: tile column %d of %d done (panel %d:%d)", j + 1, T, j0, j1)
    for key in keys:  # the host copies complete; the panel leaves the device
        copies.downloaded(key)
        if f.target is not None and key not in run.done:
            _store_in(f.target, g, key[0], key[1], f._host[key])
        if not last:
            del f._dev[key]
            f._resident -= f._nbytes(*key)


def _stream_earlier_columns(run: _Run, j0: int, j1: int, work: dict) -> None:
    """The updates of the panel ``j0:j1`` by every earlier tile column k (in order):
    ``L_ik`` for ``i >= j0`` uploaded in turn, :data:`PANEL_PREFETCH` ahead of the
    compute; the panel's own rows of column k stay until k is done."""
    f, T, copies = run.f, run.T, run.copies
    items = [(k, i) for k in range(j0) for i in range(j0, T)]
    elements = f.block * f.block
    free = [copies.slot(elements, run.dtype) for _ in range(2 * (j1 - j0) + PANEL_PREFETCH + 1)]
    f._peak = max(f._peak, f._resident + len(free) * run.tile_bytes)
    issued: list[tuple[Any, Any, Any]] = []  # per item: (tile, ticket, slot)
    rows: list[tuple[int, Any]] = []  # the current column's panel rows: (item, slot)
    for p, (_, i) in enumerate(items):
        while len(issued) < len(items) and len(issued) <= p + PANEL_PREFETCH and free:
            kk, ii = items[len(issued)]
            slot = free.pop(0)
            tile, ticket = copies.upload((ii, kk), f._host[(ii, kk)], slot)
            f.uploads += 1
            issued.append((tile, ticket, slot))
        lik, ticket, slot = issued[p]
        copies.ready(ticket)
        for j in range(j0, min(i, j1 - 1) + 1):
            if (i, j) in work:
                ljk = lik if j == i else issued[p - (i - j)][0]
                work[(i, j)] = run.update(work[(i, j)], i, j, lik, ljk)
        if i < j1:
            rows.append((p, slot))
        else:
            copies.release(slot)
            free.append(slot)
            issued[p] = (None, None, slot)
        if i == T - 1:  # column k done: its panel rows' slots are free again
            for q, s in rows:
                copies.release(s)
                free.append(s)
                issued[q] = (None, None, s)
            rows = []


def _rows(grid: TileGrid, i: int) -> int:
    """Rows of tile row ``i`` (the last one may be ragged)."""
    r = grid.row_slice(i)
    return r.stop - r.start


def _store_in(target: np.ndarray, grid: TileGrid, i: int, j: int, tile: np.ndarray) -> None:
    """Factor tile ``(i, j)`` into the host matrix ``target``: a diagonal tile's lower
    triangle only (the strict upper one keeps K, from which the caller restores it)."""
    dst = target[grid.row_slice(i), grid.row_slice(j)]
    copy_tile(dst, tile, None if i != j else np.tri(tile.shape[0], dtype=bool))


def _finished(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut
