"""The tile engine: every kernel pass is a tile set, a source and a consumer.

One Dask graph builder (:func:`tile_pass`) serves every pass over a kernel
matrix; the public entry points are short specifications on it:

=====================  ================  ===========================  ======================
entry point            tile set          source                       consumer
=====================  ================  ===========================  ======================
:func:`store_tiles`    lower or full     kernel from X blocks         write + mark each tile
:func:`matvec`         lower             kernel or stored Gram        ``K_ij V_j`` and
                                                                      ``K_ijᵀ V_i``, summed
                                                                      per row block
:func:`accumulate`     rectangular       kernel, stored or callable   ``K_ij A_j`` summed per
                                                                      row block, then an
                                                                      optional finish/sink
:func:`gather`         lower (needed)    kernel or stored Gram        ``K[rows][:, cols]``
:func:`diagonal`       diagonal          kernel or stored Gram        ``diag K_ii``
=====================  ================  ===========================  ======================

Sources (:class:`KernelSource`, :class:`StoredSource`, :class:`CallableSource`)
know how to produce the pieces of tile ``(i, j)``: the kernel source through
the fused, cache-blocked evaluators (:mod:`pipeline.engine.fused`; the tile is
never formed for a product), the stored source through verified reads
(:meth:`pipeline.storage.TiledArray.read_tile` checks the CRC-32C). A lower
tile of a symmetric matrix is produced once and used twice (``K_ij V_j`` and
``K_ijᵀ V_i``).

Reproducibility: the partial results of a row block are added in a fixed
order (the tile order, in a tree of fan-in :data:`FAN_IN`), and every tile
task is a pure function of its inputs, so a result is bitwise identical on
the synchronous, threaded or distributed scheduler.

Executor: :func:`execute` runs a graph through :func:`pipeline.engine.parallel.compute`
(the active distributed client, else Dask's threaded scheduler with BLAS held
to one thread); ``local=True`` keeps in-memory passes in this process.

Resume: :func:`pending` is the one place that turns completion markers into
the units still to compute (tiles, or row blocks of a stored prediction).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import dask
import dask.local
import numpy as np
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph

from pipeline.engine import parallel
from pipeline.engine.parallel import blas_threads
from pipeline.engine.sources import CallableSource, KernelSource, StoredSource
from pipeline.engine.where import (
    available_cores,
    in_this_process,
    local_scheduler_function,
    lower_entries,
    n_rows,
    runs_here,
    runs_inline,
    task_threads,
    tile_entries,
    weigh,
)

__all__ = [
    "FAN_IN",
    "CallableSource",
    "KernelSource",
    "StoredSource",
    "Blocks",
    "accumulate",
    "diagonal",
    "execute",
    "gather",
    "matvec",
    "pending",
    "store_tiles",
    "tile_pass",
    "tile_set",
]

#: fan-in of the per-row-block reduction tree (parts are added in tile order)
FAN_IN = 16


# -- tile sets ------------------------------------------------------------------------
def tile_set(
    kind: str, n_row_blocks: int, n_col_blocks: int | None = None
) -> list[tuple[int, int]]:
    """Tiles ``(i, j)`` in row-major order: ``"lower"`` (``j <= i``), ``"full"`` or
    ``"rect"`` (every tile) or ``"diagonal"`` (``i == j``)."""
    nc = n_row_blocks if n_col_blocks is None else n_col_blocks
    if kind == "lower":
        return [(i, j) for i in range(n_row_blocks) for j in range(min(i + 1, nc))]
    if kind in ("full", "rect"):
        return [(i, j) for i in range(n_row_blocks) for j in range(nc)]
    if kind == "diagonal":
        return [(i, i) for i in range(min(n_row_blocks, nc))]
    raise ValueError(f"tile set must be 'lower', 'full', 'rect' or 'diagonal', got {kind!r}")


# -- resume ---------------------------------------------------------------------------
def pending(
    markers: Any,
    units: Iterable[Any],
    *,
    key: Callable[[Any], Any] | None = None,
    accept: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """The units (tiles or row blocks) whose completion marker is missing, in order.

    ``key(unit)`` is the marker key (default the unit itself); ``accept(key)``
    may reject a marker that exists (e.g. one without a checksum), so its unit
    is computed again.
    """
    done = markers.done()
    out = []
    for u in units:
        k = u if key is None else key(u)
        if k in done and (accept is None or accept(k)):
            continue
        out.append(u)
    return out


# -- blocks of an input ---------------------------------------------------------------
class Blocks:
    """Row blocks of an input as graph keys: a Dask array (one key per row block,
    computed once and shared by every tile task) or in-memory blocks."""

    def __init__(self, data: Any, chunks: Sequence[int] | None = None) -> None:
        if isinstance(data, Blocks):
            self.keys, self.dsk, self.deps = data.keys, data.dsk, data.deps
            return
        if hasattr(data, "__dask_keys__") and hasattr(data, "chunks"):
            if len(data.chunks) == 2 and len(data.chunks[1]) != 1:
                data = data.rechunk({1: -1})
            if chunks is not None and tuple(data.chunks[0]) != tuple(chunks):
                data = data.rechunk({0: tuple(int(c) for c in chunks)})
            self.keys = [k[0] if isinstance(k, list) else k for k in data.__dask_keys__()]
            self.dsk: dict[Any, Any] = {}
            self.deps = [data]
            return
        tok = f"blocks-{uuid.uuid4().hex[:12]}"
        if chunks is None or isinstance(data, list | tuple):
            blocks = list(data)
        else:
            starts = np.concatenate([[0], np.cumsum(chunks)]).astype(int)
            blocks = [data[starts[b] : starts[b + 1]] for b in range(len(chunks))]
        self.keys = [(tok, b) for b in range(len(blocks))]
        self.dsk = dict(zip(self.keys, blocks, strict=True))
        self.deps = []

    def __len__(self) -> int:
        return len(self.keys)


# -- the graph builder ----------------------------------------------------------------
def _sum(parts: list[Any], picks: list[int | None]) -> np.ndarray:
    """Add the parts in the given order (``picks``: element of a tuple part, or None)."""
    first = parts[0] if picks[0] is None else parts[0][picks[0]]
    acc = np.array(first, dtype=np.result_type(first, np.float64), copy=True)
    for p, w in zip(parts[1:], picks[1:], strict=True):
        acc += p if w is None else p[w]
    return acc


def _collect(*parts: Any) -> list[Any]:
    return list(parts)


def _concat(*blocks: np.ndarray) -> np.ndarray:
    return np.concatenate(blocks)


def tile_pass(
    name: str,
    tiles: Sequence[tuple[int, int]],
    task: Callable[..., Any],
    args: Callable[[int, int], tuple],
    *,
    rows: Callable[[int, int], list[tuple[int, int | None]]] | None = None,
    n_rows: int = 0,
    finish: Callable[[int], tuple] | None = None,
    final: Callable[..., Any] | None = _collect,
    dsk: dict[Any, Any] | None = None,
    deps: Sequence[Any] = (),
    token: str | None = None,
    row_key: Callable[[int], Any] | None = None,
) -> tuple[dict[Any, Any], list[Any], str | None, list[Any]]:
    """Build one pass: a task per tile, a fixed-order reduction per row block.

    Parameters
    ----------
    name : str
        Key prefix (``f"{name}-tile-{token}"`` for the tile tasks).
    tiles : sequence of (i, j)
        The tile set, in the order its parts are reduced.
    task : callable
        ``task(i, j, *args(i, j))``: a pure function of finished inputs.
    rows : callable, optional
        ``rows(i, j)``: the row blocks tile ``(i, j)`` contributes to, each
        with the element of its (tuple) result to take (None: the result).
        None: no reduction, the final value gets the tile results.
    n_rows : int
        Row blocks (with ``rows``).
    finish : callable, optional
        ``finish(r)`` gives ``(fn, *extra)``: the row block's value becomes
        ``fn(total, *extra)`` (extra may be graph keys).
    final : callable or None
        Receives the row values (or tile results) in order (None: no final
        task; the caller uses the row keys, e.g. as a Dask array's chunks).
    dsk, deps : optional
        Graph entries and Dask collections the tasks' arguments refer to.
    row_key : callable, optional
        With ``finish``: the key of row block r's finished value.

    Returns
    -------
    (dsk, row_keys, final_key, deps)
    """
    token = token or uuid.uuid4().hex[:12]
    tname, rname, fname = (f"{name}-{s}-{token}" for s in ("tile", "sum", "row"))
    out: dict[Any, Any] = dict(dsk or {})
    parts: list[list[tuple[Any, int | None]]] = [[] for _ in range(n_rows)]
    for i, j in tiles:
        key = (tname, i, j)
        out[key] = (task, i, j, *args(i, j))
        if rows is not None:
            for r, pick in rows(i, j):
                parts[r].append((key, pick))
    if rows is None:
        keys = [(tname, i, j) for i, j in tiles]
    else:
        keys = []
        for r in range(n_rows):
            level, depth = parts[r], 0
            if not level:
                continue
            while True:
                nxt = []
                for g in range(0, len(level), FAN_IN):
                    grp = level[g : g + FAN_IN]
                    k = (rname, r, depth, g // FAN_IN)
                    out[k] = (_sum, [p for p, _ in grp], [w for _, w in grp])
                    nxt.append((k, None))
                level, depth = nxt, depth + 1
                if len(level) == 1:
                    break
            total = level[0][0]
            if finish is not None:
                fn, *extra = finish(r)
                k = (fname, r) if row_key is None else row_key(r)
                out[k] = (fn, total, *extra)
                total = k
            keys.append(total)
    fkey = None
    if final is not None:
        fkey = f"{name}-done-{token}"
        out[fkey] = (final, *keys)
    return out, keys, fkey, list(deps)


def execute(
    dsk: dict[Any, Any],
    key: Any,
    deps: Sequence[Any] = (),
    *,
    progress: bool = False,
    desc: str = "",
    local: bool = False,
    n_tasks: int = 1,
    entries: float | None = None,
) -> Any:
    """Run a pass and return the value of ``key``.

    Default: :func:`pipeline.engine.parallel.compute` (the active distributed client,
    else the threaded scheduler with BLAS held to one thread). ``local=True``:
    in this process (threads, or the configured synchronous scheduler), with
    BLAS given ``cores // tasks`` threads, for passes over in-memory data that
    a cluster would only have to be sent. ``entries``: the kernel entries the pass
    evaluates; a small pass runs here, one BLAS thread per task, rather than on a
    client whose workers run on this machine (:func:`pipeline.engine.where.runs_here`),
    and a tiny one that runs here without ``progress`` runs in this thread on Dask's
    synchronous scheduler (:func:`pipeline.engine.where.runs_inline`): the same tasks,
    the same bits, without the threaded scheduler's cost.
    """
    graph = HighLevelGraph.from_collections(key, dsk, dependencies=list(deps))
    d = Delayed(key, graph)
    if local:
        with blas_threads(task_threads(n_tasks, concurrency=available_cores())):
            if runs_inline(entries, True, progress):
                return dask.local.get_sync(dict(graph), key)
            (res,) = dask.compute(d, scheduler=local_scheduler_function(), optimize_graph=False)
        return res
    here = runs_here(entries, graph)
    if runs_inline(entries, here, progress):
        with in_this_process(), blas_threads(1):  # one BLAS thread per task, as on threads
            return dask.local.get_sync(dict(graph), key)
    with in_this_process(here):
        (res,) = parallel.compute(
            d, progress=progress, desc=desc, unit="tile", optimize_graph=False
        )
    return res


# -- specifications -------------------------------------------------------------------
def _inputs(
    source: Any, X: Any, Z: Any, chunks: Sequence[int] | None, zchunks: Sequence[int] | None = None
):
    if not getattr(source, "needs_inputs", False):
        return None, None, {}, []
    xb = Blocks(X, chunks)
    zb = xb if Z is None else Blocks(Z, zchunks)
    dsk = {**xb.dsk, **zb.dsk}
    return xb.keys, zb.keys, dsk, [*xb.deps, *([] if zb is xb else zb.deps)]


def _store_task(source, i, j, xi, xj, handle, run_id, on_write):
    import os
    import time

    t0 = time.perf_counter()
    tile = source.tile(i, j, xi, xj, handle.dtype)
    dt = time.perf_counter() - t0
    if on_write is None:
        handle.write_tile(i, j, tile, run=run_id, pid=os.getpid(), compute_s=round(dt, 6))
    else:
        on_write(handle, i, j, tile, run=run_id, pid=os.getpid(), compute_s=round(dt, 6))
    return (i, j, dt)


def store_graph(
    source: Any,
    handle: Any,
    tiles: Sequence[tuple[int, int]],
    X: Any = None,
    Z: Any = None,
    *,
    run_id: str = "",
    name: str = "store",
    on_write: Callable[..., None] | None = None,
    token: str | None = None,
) -> tuple[dict, str, list]:
    """The graph of :func:`store_tiles` (its value: the ``(i, j, seconds)`` statuses)."""
    token = token or uuid.uuid4().hex[:12]
    g = handle.grid
    xk, zk, dsk, deps = _inputs(source, X, Z, g.row_chunks(), g.col_chunks())
    sk, hk = f"{name}-source-{token}", f"{name}-handle-{token}"
    dsk = {**dsk, sk: source, hk: handle}

    def args(i, j):
        xi = None if xk is None else xk[i]
        xj = None if zk is None else zk[j]
        return (sk, xi, xj, hk, run_id, on_write)

    dsk, _, fkey, deps = tile_pass(name, tiles, _store_entry, args, dsk=dsk, deps=deps, token=token)
    return dsk, fkey, deps


def _store_entry(i, j, source, xi, xj, handle, run_id, on_write):
    return _store_task(source, i, j, xi, xj, handle, run_id, on_write)


def store_tiles(
    source: Any,
    handle: Any,
    tiles: Sequence[tuple[int, int]],
    X: Any = None,
    Z: Any = None,
    *,
    run_id: str = "",
    progress: bool = False,
    desc: str = "",
    on_write: Callable[..., None] | None = None,
) -> list[tuple[int, int, float]]:
    """Evaluate ``tiles`` from ``source``, write each and mark it done (store-and-mark).

    ``tiles`` is normally :func:`pending` of the array's markers. Returns the
    ``(i, j, compute_seconds)`` of each tile written. ``on_write(handle, i, j,
    tile, **info)`` replaces :meth:`TiledArray.write_tile` (e.g. to explain a
    full disk).
    """
    if not tiles:
        return []
    dsk, fkey, deps = store_graph(
        source, handle, tiles, X, Z, run_id=run_id, on_write=on_write,
        token=uuid.uuid4().hex[:12],
    )  # fmt: skip
    g = handle.grid
    area = weigh(tile_entries(g.row_chunks(), g.col_chunks(), tiles), X)
    return execute(dsk, fkey, deps, progress=progress, desc=desc, entries=area)


def _products_entry(i, j, source, xi, xj, vi, vj, shift):
    return source.products(i, j, xi, xj, vi, vj, shift)


def matvec(
    source: Any,
    chunks: Sequence[int],
    V: np.ndarray,
    X: Any = None,
    *,
    shift: float = 0.0,
    progress: bool = False,
) -> np.ndarray:
    """``(K + shift·I) @ V`` for a symmetric K from its lower tiles, ``V`` of shape (n, m).

    Each lower tile is produced once and used twice (``K_ij V_j`` for row
    block i, ``K_ijᵀ V_i`` for row block j); row block r adds its parts in
    tile order, so the result does not depend on the scheduler.
    """
    V = np.ascontiguousarray(V, dtype=np.float64)
    nb = len(chunks)
    xk, _, dsk, deps = _inputs(source, X, None, chunks)
    vb = Blocks(V, chunks)
    dsk.update(vb.dsk)
    tok = uuid.uuid4().hex[:12]
    sk = f"matvec-source-{tok}"
    dsk[sk] = source

    def args(i, j):
        x = (None, None) if xk is None else (xk[i], xk[j])
        return (sk, *x, vb.keys[i], vb.keys[j], float(shift))

    def rows(i, j):
        return [(i, 0)] if i == j else [(i, 0), (j, 1)]

    dsk, _, fkey, deps = tile_pass(
        "matvec", tile_set("lower", nb), _products_entry, args, rows=rows, n_rows=nb,
        final=_concat, dsk=dsk, deps=deps, token=tok,
    )  # fmt: skip
    area = weigh(lower_entries(chunks), X)
    return execute(dsk, fkey, deps, progress=progress, desc="kernel matvec", entries=area)


def _product_entry(i, j, source, xi, xj, aj):
    return source.product(i, j, xi, xj, aj)


def accumulate_graph(
    source: Any,
    row_blocks: Sequence[Any] | int,
    col_blocks: Sequence[Any] | None,
    A_blocks: Sequence[Any],
    *,
    rows: Sequence[int] | None = None,
    finish: Callable[[int], tuple] | None = None,
    name: str = "accumulate",
    dsk: dict[Any, Any] | None = None,
    deps: Sequence[Any] = (),
    final: Callable[..., Any] | None = _concat,
    token: str | None = None,
    row_key: Callable[[int], Any] | None = None,
) -> tuple[dict, list, str | None, list]:
    """The graph of :func:`accumulate` over graph keys (row inputs, column inputs, A blocks).

    ``row_blocks`` are the keys of the row inputs (or their count for a
    stored source); ``rows`` selects the row blocks to compute (default all).
    ``finish(i)`` and ``row_key(i)`` (see :func:`tile_pass`) take the row
    block's index.
    """
    nr = row_blocks if isinstance(row_blocks, int) else len(row_blocks)
    nc = len(A_blocks)
    sel = list(range(nr)) if rows is None else list(rows)
    tok = token or uuid.uuid4().hex[:12]
    sk = f"{name}-source-{tok}"
    dsk = {**(dsk or {}), sk: source}
    tiles = [(i, j) for i in sel for j in range(nc)]
    pos = {r: p for p, r in enumerate(sel)}

    def args(i, j):
        xi = None if isinstance(row_blocks, int) else row_blocks[i]
        xj = None if col_blocks is None else col_blocks[j]
        return (sk, xi, xj, A_blocks[j])

    return tile_pass(
        name, tiles, _product_entry, args, rows=lambda i, j: [(pos[i], None)], n_rows=len(sel),
        finish=None if finish is None else (lambda p: finish(sel[p])), final=final,
        dsk=dsk, deps=deps, token=tok,
        row_key=None if row_key is None else (lambda p: row_key(sel[p])),
    )  # fmt: skip


def accumulate(
    source: Any,
    X: Any,
    A: np.ndarray,
    Z: Any = None,
    *,
    row_chunks: Sequence[int] | None = None,
    col_chunks: Sequence[int] | None = None,
    local: bool = False,
    progress: bool = False,
    desc: str = "",
) -> np.ndarray:
    """``K(X, Z) @ A`` over a rectangular tile set: row block i adds ``K_ij A_j`` in order j.

    ``X``/``Z``: row blocks of the inputs (Dask arrays, lists of blocks, or
    arrays cut by ``row_chunks``/``col_chunks``). A :class:`StoredSource`
    takes ``X=None`` with ``row_chunks`` and ``col_chunks`` (its tiling); a
    :class:`CallableSource` takes ``Z=None`` and no ``col_chunks`` (one column
    block: all of ``A``).
    """
    xb = Blocks(X, row_chunks) if getattr(source, "needs_inputs", True) else None
    zb = None if Z is None else Blocks(Z, col_chunks)
    ab = Blocks([A]) if Z is None and col_chunks is None else Blocks(A, col_chunks)
    zk = None if zb is None else zb.keys
    dsk = {**(xb.dsk if xb else {}), **ab.dsk, **(zb.dsk if zb else {})}
    deps = [*(xb.deps if xb else []), *(zb.deps if zb else [])]
    rk = xb.keys if xb else len(row_chunks or ())
    dsk, _, fkey, deps = accumulate_graph(source, rk, zk, ab.keys, dsk=dsk, deps=deps)
    n_tasks = (len(rk) if not isinstance(rk, int) else rk) * len(ab.keys)
    nx = n_rows(X, row_chunks)
    area = None if nx is None else weigh(nx * int(np.shape(A)[0]), X)
    return execute(
        dsk, fkey, deps, progress=progress, desc=desc, local=local, n_tasks=n_tasks, entries=area
    )


def _piece_entry(i, j, source, xi, xj, rows_i, cols_j, rows_j, cols_i):
    return source.pieces(i, j, xi, xj, rows_i, cols_j, rows_j, cols_i)


def _assemble(shape: tuple[int, int], places: list, *parts: tuple) -> np.ndarray:
    out = np.empty(shape, dtype=np.float64)
    for (ra, ca, rb, cb), (a, b) in zip(places, parts, strict=True):
        if a is not None:
            out[np.ix_(ra, ca)] = a
        if b is not None:
            out[np.ix_(rb, cb)] = b
    return out


def _take_rows(n: int, sels: list[np.ndarray], locs: list[np.ndarray], *blocks: Any) -> np.ndarray:
    """The rows ``locs[b]`` of each block b, placed at positions ``sels[b]`` of ``n`` rows."""
    first = np.asarray(blocks[0])
    out = np.empty((n, *first.shape[1:]), dtype=first.dtype)
    for sel, loc, blk in zip(sels, locs, blocks, strict=True):
        out[sel] = np.asarray(blk)[loc]
    return out


def _row_piece(i: int, j: int, source: Any, xi: Any, loc: np.ndarray, xc: np.ndarray) -> np.ndarray:
    return source.piece(np.asarray(xi)[loc], xc)


def _place_rows(shape: tuple[int, int], sels: list[np.ndarray], *parts: np.ndarray) -> np.ndarray:
    out = np.empty(shape, dtype=np.float64)
    for sel, part in zip(sels, parts, strict=True):
        out[sel] = part
    return out


def _gather_by_rows(source, starts, rows, cols, rsel, csel, xk, dsk, deps, X, progress):
    """``K[rows][:, cols]`` from the inputs: the column points gathered once, then one
    task per row block against them (a kernel source needs no symmetric tiles: a
    column request is a row-block pass, not one task per lower tile)."""
    tok = uuid.uuid4().hex[:12]
    sk, ck = f"gather-source-{tok}", f"gather-columns-{tok}"
    dsk[sk] = source
    cblocks = sorted(csel)
    dsk[ck] = (
        _take_rows, int(cols.size), [csel[c] for c in cblocks],
        [cols[csel[c]] - starts[c] for c in cblocks], *(xk[c] for c in cblocks),
    )  # fmt: skip
    rblocks = sorted(rsel)
    tiles = [(r, 0) for r in rblocks]
    entries = {r: (sk, xk[r], rows[rsel[r]] - starts[r], ck) for r in rblocks}
    shape = (rows.size, cols.size)
    sels = [rsel[r] for r in rblocks]

    def final(*parts):
        return _place_rows(shape, sels, *parts)

    dsk, _, fkey, deps = tile_pass(
        "gather", tiles, _row_piece, lambda i, j: entries[i], final=final,
        dsk=dsk, deps=deps, token=tok,
    )  # fmt: skip
    area = weigh(float(rows.size) * cols.size, X)
    return execute(dsk, fkey, deps, progress=progress, desc="kernel columns", entries=area)


def gather(
    source: Any,
    chunks: Sequence[int],
    rows: np.ndarray,
    cols: np.ndarray,
    X: Any = None,
    *,
    progress: bool = False,
) -> np.ndarray:
    """``K[rows][:, cols]`` of a symmetric K: from a kernel source, one task per row
    block against the gathered column points; from a stored Gram, from its lower tiles,
    each needed tile read once (the pieces of both ``(i, c)`` and its transpose)."""
    starts = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    rb = np.searchsorted(starts, rows, side="right") - 1
    cb = np.searchsorted(starts, cols, side="right") - 1
    rsel = {int(r): np.flatnonzero(rb == r) for r in np.unique(rb)}
    csel = {int(c): np.flatnonzero(cb == c) for c in np.unique(cb)}
    xk, _, dsk, deps = _inputs(source, X, None, chunks)
    if rows.size and cols.size and isinstance(source, KernelSource):
        return _gather_by_rows(source, starts, rows, cols, rsel, csel, xk, dsk, deps, X, progress)
    tok = uuid.uuid4().hex[:12]
    sk = f"gather-source-{tok}"
    dsk[sk] = source
    tiles, entries, places = [], {}, []
    for i, c in tile_set("lower", len(chunks)):
        want_a = i in rsel and c in csel
        want_b = i != c and c in rsel and i in csel
        if not (want_a or want_b):
            continue
        ri = rows[rsel[i]] - starts[i] if want_a else None
        cc = cols[csel[c]] - starts[c] if want_a else None
        rc = rows[rsel[c]] - starts[c] if want_b else None
        ci = cols[csel[i]] - starts[i] if want_b else None
        tiles.append((i, c))
        x = (None, None) if xk is None else (xk[i], xk[c])
        entries[(i, c)] = (sk, *x, ri, cc, rc, ci)
        places.append((rsel.get(i), csel.get(c), rsel.get(c) if want_b else None, csel.get(i)))
    shape = (rows.size, cols.size)

    def final(*parts):
        return _assemble(shape, places, *parts)

    dsk, _, fkey, deps = tile_pass(
        "gather", tiles, _piece_entry, lambda i, j: entries[(i, j)], final=final,
        dsk=dsk, deps=deps, token=tok,
    )  # fmt: skip
    if not tiles:
        return np.empty(shape)
    area = weigh(tile_entries(chunks, chunks, tiles), X)
    return execute(dsk, fkey, deps, progress=progress, desc="kernel columns", entries=area)


def _diag_entry(i, j, source, xi):
    return source.diag(i, xi, xi)


def diagonal(source: Any, chunks: Sequence[int], X: Any = None) -> np.ndarray:
    """The diagonal of K, one task per diagonal tile."""
    xk, _, dsk, deps = _inputs(source, X, None, chunks)
    tok = uuid.uuid4().hex[:12]
    sk = f"diag-source-{tok}"
    dsk[sk] = source
    dsk, _, fkey, deps = tile_pass(
        "diag", tile_set("diagonal", len(chunks)), _diag_entry,
        lambda i, j: (sk, None if xk is None else xk[i]),
        final=_concat, dsk=dsk, deps=deps, token=tok,
    )  # fmt: skip
    return execute(dsk, fkey, deps, entries=sum(int(c) for c in chunks))
