"""In-place tile Cholesky (``keep_gram=False``) and the disk check before a factorisation.

In place, factor tile ``L_ij`` atomically replaces Gram tile ``K_ij`` in the Gram's
own Zarr array, so a fit needs the Gram's disk space only once. The factor is a
*view* of that array (:class:`InPlaceFactorArray`): same store and name, its own
fingerprint. Tile ``(i, j)``'s completion marker says what the chunk holds: a
marker under the Gram's fingerprint means ``K_ij``, one under the factor's means
``L_ij`` (writing the factor's marker atomically replaces the Gram's, since both
live at the same marker path).

Writing tile ``(i, j)`` in place:

1. an *intent record* ``{fingerprint, crc32c of L_ij}`` (under ``<name>~inplace``);
2. the chunk, replaced atomically (temporary file + rename);
3. the factor's completion marker (replaces the Gram's);
4. the intent record is removed.

A process killed between 2 and 3 leaves a chunk that no longer matches the Gram
marker's checksum. On the next run :func:`adopt_intents` reads it: if it matches
the intent's checksum it *is* ``L_ij`` (finished; it is marked, not recomputed);
otherwise the Gram tile is read as usual. Every other state is the ordinary one
(a chunk still holding ``K_ij``, or a finished marked ``L_ij``).

The Gram stays recoverable: a Gram tile that was replaced (by this factor, by an
in-place factor of another lambda, or by a jitter policy's failed run) has no
Gram marker any more. :class:`InPlaceGramReader` then recomputes it from X when
given ``recompute_tile(i, j)`` (the Gram builder's tile function), with a log line
that says why; without it, a clear error says how to rebuild the Gram.

Disk needed (``b`` = block size, ``T = ceil(n / b)``, ``s`` = bytes per entry of
the factor, 8 for float64 and 4 for float32; markers are negligible):

- ``keep_gram=True``: ``T (T + 1) / 2 * b^2 * s`` for the factor's lower tiles, on
  top of the Gram's ``T (T + 1) / 2 * b^2 * 8``;
- ``keep_gram=False``: ``(w + 1) * b^2 * 8`` only (temporary chunk files of the
  ``w`` writers during the atomic replace), the Gram's own space is reused;
- ``keep_gram=False`` with the Gram computed on demand (never stored first,
  :data:`~pipeline.constants.GRAM_ON_DEMAND_IN_PLACE`): the factor's own
  ``T (T + 1) / 2 * b^2 * s`` (less its tiles already on disk) plus the temporary
  files, and nothing for the Gram.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engine.passes import KernelSource, pending
from pipeline.engine.where import factor_threads
from pipeline.errors import GramReplacedError, InsufficientDiskError
from pipeline.kernels import make_kernel
from pipeline.linalg.cholesky_exec import _left_looking_order
from pipeline.linalg.cholesky_options import CholeskyFactor
from pipeline.storage import IncompleteArrayError, TiledArray, fingerprint_obj
from pipeline.storage import buffers as tile_buffers
from pipeline.storage.arrays import CorruptTileError, tile_checksum
from pipeline.storage.atomic import local_file_path
from pipeline.storage.location import is_url
from pipeline.storage.markers import TileMarkers
from pipeline.storage.rawchunks import chunk_layout

log = logging.getLogger(__name__)

INTENT_SUFFIX = "~inplace"


def factor_disk_bytes(
    n: int, block_size: int, dtype: Any = np.float64, *, keep_gram: bool = True, writers: int = 1
) -> int:
    """Bytes of new disk a factorisation needs (see the module docstring's formula)."""
    t = -(-int(n) // int(block_size))
    tile = int(block_size) ** 2
    if keep_gram:
        return t * (t + 1) // 2 * tile * np.dtype(dtype).itemsize
    return (int(writers) + 1) * tile * 8


def _local_dir(store: str) -> str | None:
    if is_url(store):
        return None  # an object store: no free-space figure to check
    path = os.path.abspath(local_file_path(store))
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or None


def check_disk_space(store: str, needed: int, what: str) -> int | None:
    """Raise :class:`InsufficientDiskError` if ``store``'s disk has < ``needed`` bytes free.

    Returns the free bytes (None for a store with no local disk, e.g. S3).
    """
    path = _local_dir(str(store))
    if path is None:
        return None
    free = int(shutil.disk_usage(path).free)
    if free < needed:
        raise InsufficientDiskError(path, needed, free, what)
    return free


@dataclass(frozen=True)
class InPlaceFactorArray(TiledArray):
    """The factor stored in the Gram's own array: writes go through an intent record."""

    def intents(self) -> TileMarkers:
        return TileMarkers(self.store, self.name + INTENT_SUFFIX, self.fingerprint)

    def write_tile(
        self, i: int, j: int, tile: np.ndarray, *, direct: bool = False, **marker_info: Any
    ) -> None:
        data = np.ascontiguousarray(np.asarray(tile, dtype=self.dtype))
        intents = self.intents()
        intents.mark((i, j), crc32c=tile_checksum(data))  # 1. intent
        # 1b. the chunk's old marker goes first, whatever its fingerprint (the Gram's, or
        # another lambda's factor): a kill between the chunk and its new marker then
        # leaves no marker (recomputed), never an old one over new bytes, which that
        # lambda's reruns met as a CorruptTileError with no way out
        self.markers.unmark((i, j))
        super().write_tile(i, j, data, direct=direct, **marker_info)  # 2. chunk, 3. marker
        intents.unmark((i, j))  # 4.


def adopt_intents(L: InPlaceFactorArray) -> list[tuple[int, int]]:
    """Mark tiles whose chunk already holds the factor tile its intent record names.

    Run before scheduling a resumed in-place factorisation. Returns the tiles adopted.
    """
    intents = L.intents()
    adopted = []
    for key in intents.done():
        if not isinstance(key, tuple) or len(key) != 2:
            continue
        rec = intents.record(key) or {}
        if L.markers.record(key) is None:
            try:
                tile = L.read_tile(*key, verify=False)
            except (OSError, ValueError):
                tile = None
            if tile is not None and tile_checksum(
                np.ascontiguousarray(np.asarray(tile, dtype=L.dtype))
            ) == int(rec.get("crc32c", -1)):
                L.markers.mark(key, crc32c=int(rec["crc32c"]), adopted=True)
                adopted.append(key)
        intents.unmark(key)
    return adopted


@dataclass(frozen=True)
class InPlaceGramReader:
    """Reads Gram tiles of an array that an in-place factor is replacing.

    ``read_tile(i, j)`` returns the verified Gram tile; a tile whose Gram marker
    is gone (replaced by an in-place factor) or whose bytes fail the check is
    recomputed by ``recompute_tile(i, j)`` when given, else raises
    :class:`GramReplacedError` naming the fix.
    """

    gram: TiledArray
    recompute_tile: Callable[[int, int], np.ndarray] | None = None
    #: log level of the per-tile line for a tile that is not stored (the factorisation
    #: logs one line for all of them first); a failed checksum is always at INFO
    missing_level: int = logging.INFO

    # the attributes the Cholesky reads from a Gram
    @property
    def store(self) -> str:
        return self.gram.store

    @property
    def name(self) -> str:
        return self.gram.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.gram.shape

    @property
    def block_size(self) -> int:
        return self.gram.block_size

    @property
    def dtype(self) -> str:
        return self.gram.dtype

    @property
    def fingerprint(self) -> str:
        return self.gram.fingerprint

    @property
    def grid(self):
        return self.gram.grid

    @property
    def markers(self) -> TileMarkers:
        return self.gram.markers

    @functools.cached_property
    def _recompute_takes_out(self) -> bool:
        """Whether ``recompute_tile`` accepts ``out=`` (read once per reader)."""
        return self.recompute_tile is not None and _takes_out(self.recompute_tile)

    def _recompute(
        self, i: int, j: int, why: str, level: int = logging.INFO, first_touch: Any = None
    ) -> np.ndarray:
        if self.recompute_tile is None:
            raise GramReplacedError(
                f"Gram tile ({i}, {j}) of {self.gram.store!r}/{self.gram.name!r} {why}, and no "
                "recompute_tile was given to rebuild it from X. Rebuild the Gram (run the gram "
                "stage again: it recomputes exactly the tiles without a Gram marker), or pass "
                "recompute_tile=<function (i, j) -> Gram tile>."
            )
        log.log(level, "Gram tile (%d, %d) %s; recomputing it from X", i, j, why)
        g = self.gram.grid
        want = (
            g.row_slice(i).stop - g.row_slice(i).start,
            g.col_slice(j).stop - g.col_slice(j).start,
        )
        if self._recompute_takes_out:
            # into memory this process already touched (an evicted factor tile's, as a
            # stored tile's read would be), not fresh pages: on a VM those cost about
            # 2 ms of CPU per MB, and the pool would otherwise only grow

            buf = tile_buffers.take(want, np.dtype(self.gram.dtype), first_touch)
            tile = self.recompute_tile(i, j, out=buf)
        else:
            tile = self.recompute_tile(i, j)
        # (no copy where it is already the Gram's dtype: e.g. the buffer it was given)
        tile = np.asarray(tile, dtype=self.gram.dtype)
        if tile.shape != want:
            raise ValueError(
                f"recompute_tile({i}, {j}) returned shape {tile.shape}, expected {want}"
            )
        return tile

    def read_tile(
        self,
        i: int,
        j: int = 0,
        verify: bool = True,
        *,
        first_touch: Any = None,
        drop_cache: bool = False,
    ) -> np.ndarray:
        rec = self.gram.markers.record((i, j))
        if rec is None:
            return self._recompute(
                i,
                j,
                "was replaced by an in-place factor (keep_gram=False) or is missing",
                self.missing_level,
                first_touch,
            )
        try:
            return self.gram.read_tile(
                i, j, verify=verify, first_touch=first_touch, drop_cache=drop_cache
            )
        except CorruptTileError as exc:
            return self._recompute(i, j, f"fails its checksum ({exc.problem})")


def _takes_out(fn: Callable[..., Any]) -> bool:
    """Whether ``recompute_tile`` accepts ``out=`` (a buffer to write the tile into, as
    :class:`GramTileRecomputer` does); a plain ``(i, j) -> tile`` callable does not."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (some builtins): call it plainly
        return False
    return "out" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _unwritten_chunks(gram: TiledArray, tiles: list) -> list | None:
    """The ``tiles`` whose chunk file is not on the local disk yet (a Gram computed on
    demand, :func:`pipeline.linalg.gram.build_gram` with ``defer=True``): their factor tiles
    need new space. None for an object store (not known; no free-space figure is
    checked there)."""
    if not tiles:
        return []
    if not isinstance(gram.store, str) or _local_dir(gram.store) is None:
        return None
    layout = chunk_layout(gram.store, gram.name)
    if layout is None:  # not raw local chunks: count every such tile, to be safe
        return list(tiles)
    return [t for t in tiles if not layout.path(t).exists()]


def _why_not_stored(missing: int, unwritten: list | None) -> str:
    """Why ``missing`` Gram tiles are not stored, for the factorisation's log line."""
    if unwritten is None:  # an object store: which ones were ever written is not known
        return "computed on demand, or replaced by an in-place factor of another lambda"
    parts = []
    if unwritten:
        parts.append(f"{len(unwritten)} never written: the Gram is computed on demand")
    if missing > len(unwritten):
        parts.append(f"{missing - len(unwritten)} replaced by an in-place factor of another lambda")
    return "; ".join(parts)


def in_place_fingerprint(factor_fp: str) -> str:
    """The in-place factor's fingerprint: that of the separate factor, marked in place."""

    return fingerprint_obj({"what": "tile-cholesky-lower-in-place", "factor": factor_fp})


def factor_in_place(
    gram: TiledArray,
    lam: float,
    shift: float,
    convention: str,
    policy: Any,
    scheduler: str,
    n_threads: int | None,
    progress: bool,
    dtype: np.dtype,
    fp: str,
    *,
    store: str | None = None,
    check_gram: bool = True,
    recompute_tile: Callable[[int, int], np.ndarray] | None = None,
    check_disk: bool = True,
    wide: bool = True,
    t0: float,
    run_tasks: Callable[..., tuple[tuple, dict[str, float]]],
) -> CholeskyFactor:
    """``tile_cholesky(..., keep_gram=False)``: the factor replaces the Gram tile by tile.

    ``run_tasks`` runs the factor's tile tasks: the driver's
    :func:`~pipeline.linalg.cholesky.run_factor_tasks`, passed in by
    :func:`~pipeline.linalg.cholesky.tile_cholesky` (which imports this module)."""
    import time

    import zarr

    if store is not None and str(store) != str(gram.store):
        raise ValueError(
            f"keep_gram=False factors in the Gram's own array, so store must be the Gram's "
            f"({gram.store!r}) or None, got {store!r}"
        )
    if np.dtype(gram.dtype) != dtype:
        raise ValueError(
            f"keep_gram=False stores the factor in the Gram's array, so dtype must be the "
            f"Gram's ({np.dtype(gram.dtype)}), got {dtype}; use keep_gram=True for a "
            f"{dtype} factor of a {np.dtype(gram.dtype)} Gram"
        )
    n = int(gram.shape[0])
    L = InPlaceFactorArray(
        gram.store, gram.name, (n, n), gram.block_size, gram.dtype, in_place_fingerprint(fp)
    )
    L.markers.sweep_tmp()
    L.intents().sweep_tmp()
    adopted = adopt_intents(L)
    if adopted:
        log.info("in-place Cholesky: %d tiles written before a stop adopted", len(adopted))
    grid = gram.grid
    done_l = L.markers.done()
    done_g = gram.markers.done()  # listed once: the check and the tiles to compute
    lower = list(grid.lower_tiles())
    if check_gram and recompute_tile is None:
        missing = [t for t in lower if t not in done_l and t not in done_g]
        if missing:
            raise IncompleteArrayError(
                gram.store,
                gram.name,
                missing,
                grid.n_lower_tiles(),
                message=f"the Gram in {gram.store!r}/{gram.name!r} lacks {len(missing)} of "
                f"{grid.n_lower_tiles()} lower tiles (first: {missing[:3]}): it is incomplete, "
                "or an earlier keep_gram=False factorisation (another lambda, or a failed one) "
                "replaced them by factor tiles. Rebuild the Gram, or pass recompute_tile= to "
                "recompute those tiles from X",
            )
    todo = pending(L.markers, _left_looking_order(grid.n_row_blocks))  # resume
    no_gram = [t for t in todo if t not in done_g]
    unwritten = _unwritten_chunks(gram, no_gram)
    if check_disk and todo:
        nthreads = factor_threads(n_threads, scheduler)
        check_disk_space(
            gram.store,
            factor_disk_bytes(n, gram.block_size, dtype, keep_gram=False, writers=nthreads)
            + len(unwritten or ()) * gram.block_size**2 * dtype.itemsize,
            "the in-place factor's temporary chunk files"
            + (f" and its {len(unwritten)} tiles not on disk yet" if unwritten else ""),
        )
    if no_gram and recompute_tile is not None:
        log.info(
            "in-place Cholesky: %d of the %d tiles to factor have no stored Gram tile (%s); "
            "recomputing it from X as the factor needs each tile",
            len(no_gram),
            len(todo),
            _why_not_stored(len(no_gram), unwritten),
        )
    attrs = {
        "fingerprint": L.fingerprint,
        "factor_fingerprint": fp,
        "lambda": float(lam),
        "convention": convention,
        "shift": float(shift),
        "gram_fingerprint": gram.fingerprint,
        "jitter_policy": None if policy is None else policy.to_dict(),
        "layout": "in place (keep_gram=False): tiles whose marker carries this fingerprint "
        "hold L (L @ L.T = K + shift*I), those under gram_fingerprint still hold K",
    }
    if todo:
        z = gram.zarr("r+")
        z.attrs["inplace_factor"] = attrs
    reader = InPlaceGramReader(gram, recompute_tile, missing_level=logging.DEBUG)
    computed, jit = run_tasks(
        reader, L, todo, shift, lam, convention, policy, scheduler, n_threads, wide, progress
    )
    if policy is not None:
        z = zarr.open_array(store=gram.store, path=gram.name, mode="r+", zarr_format=3)
        z.attrs["inplace_factor"] = {**attrs, "jitter": jit}
    return CholeskyFactor(
        L=L,
        lam=float(lam),
        convention=convention,
        shift=float(shift),
        jitter=jit,
        computed=computed,
        seconds=time.perf_counter() - t0,
    )


@dataclass(frozen=True, eq=False)
class GramTileRecomputer:
    """``recompute_tile`` for :func:`pipeline.linalg.cholesky.tile_cholesky` with ``keep_gram=False``.

    Recomputes Gram tile ``(i, j)`` from X as the Gram build computes it, cast to
    the Gram's dtype: ``kernel(X_i)`` on the diagonal and ``kernel(X_i, X_j)`` off
    it, or, with ``kernel_dtype``, the tile engine's fused evaluators in that dtype
    (:class:`pipeline.engine.KernelSource`; ``build_gram``'s
    ``kernel_dtype``). :meth:`for_gram` reads which from the Gram's array, so a
    recomputed tile has the bits a stored one would have. Picklable; with the Dask
    executor X travels with each task that needs it, so prefer the threads executor
    for a rebuild.
    """

    X: np.ndarray
    kernel: Any
    block_size: int
    dtype: str = "float64"
    kernel_dtype: str | None = None

    @classmethod
    def for_gram(cls, gram: TiledArray, X: np.ndarray, kernel: Any) -> GramTileRecomputer:
        """The recomputer of ``gram``'s tiles: its block, its dtype, and the evaluation
        its array records (``kernel_dtype``, written by ``build_gram``)."""
        try:
            kd = gram.zarr("r").attrs.get("kernel_dtype")
        except Exception:  # an array without our attributes: the kernel's own evaluation
            kd = None
        return cls(X, kernel, int(gram.block_size), np.dtype(gram.dtype).name, kd)

    def __call__(self, i: int, j: int, out: np.ndarray | None = None) -> np.ndarray:
        """Gram tile ``(i, j)``, written into ``out`` when given (C-contiguous, the
        tile's shape and ``dtype``: a reused buffer; the same bits)."""

        k = make_kernel(self.kernel)
        b = int(self.block_size)
        Xi = self.X[i * b : (i + 1) * b]
        Xj = Xi if i == j else self.X[j * b : (j + 1) * b]
        # build_gram's tile (tile_graph's source): fused with a kernel_dtype, else the
        # kernel object's own evaluation in X's dtype
        kd = self.kernel_dtype or ("float32" if Xi.dtype == np.float32 else "float64")
        src = KernelSource(k, kernel_dtype=kd, tile_eval="fused" if self.kernel_dtype else "kernel")
        return src.tile(i, j, Xi, Xj, np.dtype(self.dtype), out=out)
