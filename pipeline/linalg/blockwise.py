"""Blockwise kernel-row prediction: ŷ = K(X_new, X_train) · α, never forming K.

A specification on the tile engine (:mod:`pipeline.engine.passes`): task ``(i, j)``
evaluates the kernel tile of new-row block ``i`` (``block_size`` rows) by training
block ``j`` (``train_block_size`` rows) in cache-sized pieces and returns only its
``block_rows x n_outputs`` partial product; a row block's parts are summed in a fixed
order, so the result is bit-identical on any scheduler.

With ``out=`` the predictions go to a Zarr array, each row block followed by a
completion marker, so a killed batch prediction resumes where it stopped. The
store's fingerprint combines the model's and the input's; a store written for
another model or input is refused.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
from dask.highlevelgraph import HighLevelGraph

from pipeline.engine import parallel, predict_accumulate, task_threads
from pipeline.engine.evaluators import evaluation_identity
from pipeline.engine.passes import KernelSource, accumulate_graph, execute, pending
from pipeline.kernels import Kernel, kernel_fingerprint, make_kernel
from pipeline.linalg.predict_model import check_preprocessing
from pipeline.linalg.predict_model import model_fingerprint as _model_fingerprint
from pipeline.linalg.predict_source import as_input_blocks
from pipeline.linalg.predict_source import input_fingerprint as _input_fingerprint
from pipeline.storage import StoreMismatchError, fingerprint_obj, open_tiled_array, read_all
from pipeline.storage.arrays import TiledArray
from pipeline.storage.fingerprint import same_work
from pipeline.storage.predictions import check_zarr_output_root

log = logging.getLogger(__name__)

NAN_POLICIES = ("raise", "propagate")
#: column width of the pieces a tile is evaluated in (rows: half of it); the
#: default lets the fused engine (:mod:`pipeline.engine`) use the piece shape
#: measured best for each kernel (256 x 512 for the GEMM-based ones)
CACHE_BLOCK = 512


# -- tasks --------------------------------------------------------------------
def _prepare(
    xb: np.ndarray,
    *,
    index: int,
    row_start: int,
    dtype: np.dtype,
    nan_policy: str,
    x_mean: np.ndarray | None,
    x_scale: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Check one row block for non-finite values, cast it and apply the input scaling.

    Returns the block ready for the kernel and the indices of non-finite rows
    (None if all are finite; those rows are zeroed and later predicted as NaN).
    """
    xb = np.asarray(xb)
    finite = np.isfinite(xb).all(axis=1) if xb.dtype.kind == "f" else None
    bad = None
    if finite is not None and not finite.all():
        rows = np.flatnonzero(~finite)
        if nan_policy == "raise":
            stop = row_start + xb.shape[0] - 1
            raise ValueError(
                f"X_new row block {index} (rows {row_start}..{stop}) has {rows.size} row(s) "
                f"with NaN or inf, the first at row {row_start + int(rows[0])}; clean the "
                "input, or pass nan_policy='propagate' (krr predict: --nan-policy propagate)"
            )
        xb = xb.copy()
        xb[rows] = 0
        bad = rows
    xb = xb.astype(np.float64 if (x_mean is not None or x_scale is not None) else dtype)
    if x_mean is not None:
        xb -= x_mean
    if x_scale is not None:
        xb /= x_scale
    return np.ascontiguousarray(xb, dtype=dtype), bad


def tile_product(
    kernel: Kernel,
    xb: np.ndarray,
    xt: np.ndarray,
    a: np.ndarray,
    cache_block: int = CACHE_BLOCK,
    n_threads: int = 1,
) -> np.ndarray:
    """K(xb, xt) @ a (float64), by the fused engine in cache-sized pieces of the tile.

    This is the whole arithmetic of a prediction task; the benchmark's bare
    numpy loop calls it too, so both time exactly the same tiles and GEMVs.
    The kernel values are float32 iff ``xb`` and ``xt`` are (the kernels' own
    rule); sums longer than one sub-block are float64 (see
    :mod:`pipeline.engine.fused`).
    """
    out = np.zeros((xb.shape[0], a.shape[1]))
    f32 = xb.dtype == np.float32 and xt.dtype == np.float32
    cb = int(cache_block)
    predict_accumulate(
        kernel, xb, xt, a, out,
        kernel_dtype="float32" if f32 else "float64",
        n_threads=n_threads,
        block_shape=None if cb == CACHE_BLOCK else (max(1, cb // 2), cb),
    )  # fmt: skip
    return out


def _finish(
    total: np.ndarray,
    index: int,
    prepared: tuple[np.ndarray, np.ndarray | None],
    *,
    y_mean: np.ndarray | None,
    y_scale: np.ndarray | None,
    dtype: np.dtype,
    handle: TiledArray | None = None,
    squeeze: bool = False,
    starts: list[int] | None = None,
) -> np.ndarray | int:
    """Row block ``index``'s predictions from its kernel sum; with ``handle``, written
    and marked (then only the row count is returned)."""
    y = total
    if y_scale is not None:
        y = y * y_scale
    if y_mean is not None:
        y = y + y_mean
    y = np.asarray(y, dtype=dtype)
    bad = prepared[1]
    if bad is not None:
        y = y.copy()
        y[bad] = np.nan
    if handle is None:
        return y
    return _write(y[:, 0] if squeeze else y, handle=handle, index=index, row_start=starts[index])


def _write(y: np.ndarray, *, handle: TiledArray, index: int, row_start: int) -> int:
    """Write one row block of predictions (chunk ``index``), then its completion marker.

    The marker (key ``(index,)``) records the CRC-32C of the stored bytes, which
    :meth:`BatchPrediction.to_numpy` and the evaluate stage check on read.
    """
    crc = handle.store_tile(index, 0, y)
    handle.markers.mark(
        (index,), rows=[row_start, row_start + int(y.shape[0])], pid=os.getpid(), crc32c=crc
    )
    return int(y.shape[0])


def _checksummed(handle: TiledArray, key: tuple[int, ...]) -> bool:
    """Whether a block's marker records a checksum (older versions wrote none: such a
    block cannot be verified on read, so it is recomputed, not trusted)."""
    rec = handle.markers.record(key)
    return rec is not None and "crc32c" in rec


def _count(*n: int) -> int:
    return int(sum(n))


# -- graph --------------------------------------------------------------------
@dataclass(frozen=True)
class _TrainBlocks:
    """A fitted model's arrays as the prediction graph reads them: X_train and α in
    ``train_block_size`` row blocks, the kernel object, the checked scaler. Not a
    model type: the one fitted-model type is :class:`pipeline.models.artifact.Model`, whose
    ``predict`` calls :func:`predict` with its fields."""

    X_train: da.Array
    dual_coef: da.Array  # 2-D (N, n_outputs)
    kernel: Kernel
    squeeze: bool
    pre: dict[str, np.ndarray]


def _check_model(
    X_train: Any,
    dual_coef: Any,
    kernel: Any,
    preprocessing: Mapping[str, Any] | None,
    train_block_size: int,
) -> _TrainBlocks:
    kernel = make_kernel(kernel)
    if not isinstance(X_train, da.Array):
        X_train = np.asarray(X_train)
    if X_train.ndim != 2:
        raise ValueError(f"X_train must be 2-D (n_train, n_features), got shape {X_train.shape}")
    if not isinstance(dual_coef, da.Array):
        dual_coef = np.asarray(dual_coef)
    if dual_coef.ndim not in (1, 2) or dual_coef.shape[0] != X_train.shape[0]:
        raise ValueError(
            f"dual_coef must have shape ({X_train.shape[0]},) or ({X_train.shape[0]}, n_outputs) "
            f"to match X_train {X_train.shape}, got {dual_coef.shape}"
        )
    if X_train.shape[0] == 0:
        raise ValueError("X_train has no rows; a fitted model needs at least one training point")
    squeeze = dual_coef.ndim == 1
    A = dual_coef[:, None] if squeeze else dual_coef
    if A.dtype.kind not in "fiu" or X_train.dtype.kind not in "fiu":
        raise ValueError(
            f"X_train and dual_coef must be real numbers, got {X_train.dtype} and {A.dtype}"
        )
    bt = int(train_block_size)
    if bt < 1:
        raise ValueError(f"train_block_size must be >= 1, got {train_block_size}")
    Xt = _as_train_blocks(X_train, bt)
    A = _as_train_blocks(A, bt)
    pre = check_preprocessing(preprocessing, X_train.shape[1], None if squeeze else A.shape[1])
    return _TrainBlocks(Xt, A, kernel, squeeze, pre)


def _as_train_blocks(x: Any, bt: int) -> da.Array:
    chunks = (bt, x.shape[1])
    if isinstance(x, da.Array):
        return x.rechunk(chunks)
    return da.from_array(x, chunks=chunks)


def _check_args(block_size: int, nan_policy: str) -> int:
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    b = int(block_size)
    if b < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return b


def _dtypes(X: da.Array, m: _TrainBlocks) -> tuple[np.dtype, np.dtype]:
    f32 = X.dtype == np.float32 and m.X_train.dtype == np.float32 and not m.pre
    kdt = np.dtype(np.float32 if f32 else np.float64)
    return kdt, np.result_type(kdt, m.dual_coef.dtype, np.float32)


def _graph(
    X: da.Array,
    m: _TrainBlocks,
    *,
    nan_policy: str,
    rows: list[int],
    cache_block: int,
    handle: TiledArray | None = None,
) -> tuple[dict, str, str, list[int], np.dtype, str | None]:
    """Tasks computing the prediction of row blocks ``rows``: a specification on the
    tile engine (:func:`pipeline.engine.passes.accumulate_graph`; rectangular tile
    set, the kernel from X blocks, partial products summed per row block in a
    fixed order, then the finish: output scaling, NaN rows and, with
    ``handle``, the checksummed write and its marker).

    Returns ``(dsk, prep_name, finish_name, row_starts, out_dtype, done_key)``;
    ``(finish_name, i, 0)`` holds row block i's predictions (its row count
    with ``handle``), ``done_key`` (with ``handle``) the total row count.
    """
    kdt, odt = _dtypes(X, m)
    token = dask.base.tokenize(
        X.name,
        m.X_train.name,
        m.dual_coef.name,
        kernel_fingerprint(m.kernel),
        nan_policy,
        cache_block,
        {k: v.tolist() for k, v in m.pre.items()},
        rows,
        None if handle is None else (handle.store, handle.name, handle.fingerprint),
    )
    prep, xin, fin = (f"krr-predict-{s}-{token}" for s in ("prep", "x", "out"))
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int).tolist()
    n_train_blocks = len(m.X_train.chunks[0])
    cb = int(cache_block)
    source = KernelSource(
        m.kernel,
        kernel_dtype=kdt.name,
        symmetric=False,
        # inner threads per tile task: 1 when the scheduler keeps every core busy
        n_threads=task_threads(len(rows) * n_train_blocks),
        block_shape=None if cb == CACHE_BLOCK else (max(1, cb // 2), cb),
    )
    finish_fn = functools.partial(
        _finish,
        y_mean=m.pre.get("y_mean"),
        y_scale=m.pre.get("y_scale"),
        dtype=odt,
        handle=handle,
        squeeze=m.squeeze,
        starts=starts,
    )
    dsk: dict[Any, Any] = {}
    for i in rows:
        prep_fn = functools.partial(
            _prepare,
            index=i,
            row_start=starts[i],
            dtype=kdt,
            nan_policy=nan_policy,
            x_mean=m.pre.get("x_mean"),
            x_scale=m.pre.get("x_scale"),
        )
        dsk[(prep, i)] = (prep_fn, (X.name, i, 0))
        dsk[(xin, i)] = (_first, (prep, i))
    dsk, _, done, _ = accumulate_graph(
        source,
        [(xin, i) for i in range(len(X.chunks[0]))],
        [(m.X_train.name, j, 0) for j in range(n_train_blocks)],
        [(m.dual_coef.name, j, 0) for j in range(n_train_blocks)],
        rows=rows,
        finish=lambda i: (finish_fn, i, (prep, i)),
        row_key=lambda i: (fin, i, 0),
        name="krr-predict",
        dsk=dsk,
        final=None if handle is None else _count,
        token=token,
    )
    return dsk, prep, fin, starts, odt, done


def _first(t: tuple) -> Any:
    return t[0]


def predict_blockwise(
    X_new: Any,
    X_train: Any,
    dual_coef: Any,
    kernel: Kernel | str | dict,
    *,
    block_size: int = 4096,
    train_block_size: int = 4096,
    preprocessing: Mapping[str, Any] | None = None,
    nan_policy: str = "raise",
    cache_block: int = CACHE_BLOCK,
) -> da.Array:
    """Lazy predictions ``K(X_new, X_train) @ dual_coef`` as a Dask array.

    Parameters
    ----------
    X_new : array-like, dask.array.Array, zarr.Array or str
        New points ``(M, D)``; see :func:`pipeline.linalg.predict_source.as_input_blocks`.
    X_train : array-like or dask.array.Array
        Training points ``(N, D)`` as the kernel sees them (after preprocessing).
    dual_coef : array-like
        α, shape ``(N,)`` or ``(N, n_outputs)``.
    kernel : Kernel, str or spec dict
        The fitted kernel (see :func:`pipeline.kernels.make_kernel`).
    block_size : int
        Rows of ``X_new`` per task and per output block.
    train_block_size : int
        Rows of ``X_train`` per task; a task's kernel tile is
        ``block_size x train_block_size`` (evaluated in cache-sized pieces).
    preprocessing : dict, optional
        ``x_mean``, ``x_scale`` (applied to ``X_new``), ``y_mean``, ``y_scale``
        (applied to the predictions).
    nan_policy : {"raise", "propagate"}
        "raise": a non-finite value in ``X_new`` fails with an error naming
        the row block and row. "propagate": those rows are predicted as NaN.
    cache_block : int
        Column width of the pieces a task evaluates its tile in, rows half of
        it; the default lets the engine pick per kernel (a performance knob:
        the result differs only by summation order, ~1e-16 relative).

    Returns
    -------
    dask.array.Array
        Shape ``(M,)`` for a 1-D ``dual_coef``, else ``(M, n_outputs)``,
        chunked by ``block_size`` rows.
    """
    b = _check_args(block_size, nan_policy)
    m = _check_model(X_train, dual_coef, kernel, preprocessing, train_block_size)
    X = _check_input(X_new, b, m)
    dsk, _, fin, _, odt, _ = _graph(
        X, m, nan_policy=nan_policy, rows=list(range(len(X.chunks[0]))), cache_block=cache_block
    )
    k = m.dual_coef.shape[1]
    hlg = HighLevelGraph.from_collections(fin, dsk, dependencies=[X, m.X_train, m.dual_coef])
    arr = da.Array(hlg, fin, chunks=(X.chunks[0], (k,)), dtype=odt)
    return arr[:, 0] if m.squeeze else arr


def _check_input(X_new: Any, b: int, m: _TrainBlocks) -> da.Array:
    X = as_input_blocks(X_new, b)
    d = m.X_train.shape[1]
    if X.shape[1] != d:
        raise ValueError(
            f"X_new has {X.shape[1]} features, but the model was fitted on {d} "
            f"(X_train.shape[1]); pass new points with the same {d} columns as in training"
        )
    return X


# -- batch prediction to a store ------------------------------------------------
@dataclass(frozen=True)
class BatchPrediction:
    """Result of a batch prediction written to a Zarr store.

    Attributes
    ----------
    store, name : str
        Where the predictions are (``zarr.open_array(store=store, path=name)``).
    shape : tuple of int
    fingerprint : str
        Fingerprint of the model and input (stored in the array's attributes).
    n_blocks, n_computed, n_skipped : int
        Row blocks in all, computed by this call, and found complete already.
    """

    store: str
    name: str
    shape: tuple[int, ...]
    fingerprint: str
    n_blocks: int
    n_computed: int
    n_skipped: int

    def zarr(self) -> zarr.Array:
        """The predictions array, opened read-only."""
        return zarr.open_array(store=self.store, path=self.name, mode="r", zarr_format=3)

    def to_numpy(self) -> np.ndarray:
        """The predictions in memory, every row block checked against its marker's CRC-32C.

        Raises
        ------
        pipeline.storage.CorruptTileError
            A row block's bytes do not match its checksum (also a deleted chunk).
        pipeline.storage.MissingTileError
            A row block has no completion record (or one without a checksum).
        """
        return read_all(self.store, self.name, row_keys=True)


def _open_output(
    out: str,
    name: str,
    shape: tuple[int, ...],
    b: int,
    dtype: np.dtype,
    meta: dict,
    overwrite: bool,
    ident: dict,
) -> TiledArray:
    check_zarr_output_root(out)  # not among the files of a directory that is not a store
    # the evaluation's identity enters the fingerprint only: the attributes keep their layout
    fp = fingerprint_obj({"kind": "krr-predictions", **meta, **ident, "dtype": dtype.str})
    try:
        return open_tiled_array(
            out, name, shape, b, dtype, fp,
            overwrite=overwrite,
            chunk_cols=shape[1] if len(shape) == 2 else None,
            attributes=meta,
            fill_value=np.nan,  # rows not written yet read as NaN, never as plausible 0.0
        )  # fmt: skip
    except StoreMismatchError as exc:
        old = dict(zarr.open_array(store=str(out), path=name, mode="r", zarr_format=3).attrs)
        where = f"{out!r} (array {name!r})"
        fix = (
            "Write to another output path, or replace them: overwrite=True "
            "(krr predict: --overwrite)."
        )
        old_model, old_input = old.get("model_fingerprint"), old.get("input_fingerprint")
        if old_model is not None and not same_work(old_model, meta["model_fingerprint"]):
            raise StoreMismatchError(
                f"output store {where} holds predictions of another model (model fingerprint "
                f"{old['model_fingerprint']}, this model is {meta['model_fingerprint']}). {fix}"
            ) from exc
        if old_input is not None and not same_work(old_input, meta["input_fingerprint"]):
            raise StoreMismatchError(
                f"output store {where} holds predictions for another input (input fingerprint "
                f"{old['input_fingerprint']}, this input is {meta['input_fingerprint']}). {fix}"
            ) from exc
        raise


def predict(
    X_new: Any,
    X_train: Any,
    dual_coef: Any,
    kernel: Kernel | str | dict,
    *,
    out: str | None = None,
    out_name: str = "predictions",
    block_size: int = 4096,
    train_block_size: int = 4096,
    preprocessing: Mapping[str, Any] | None = None,
    nan_policy: str = "raise",
    model_fingerprint: str | None = None,
    input_fingerprint: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    cache_block: int = CACHE_BLOCK,
) -> np.ndarray | BatchPrediction:
    """Predict ``K(X_new, X_train) @ dual_coef`` block by block on the active scheduler.

    Without ``out`` the predictions come back as numpy (for M that fits in
    memory). With ``out`` (a directory or fsspec URL) they are written to the
    Zarr array ``out_name`` there, row block by row block, each block followed
    by a completion marker; rerunning the same call after a crash computes
    only the blocks without a marker.

    Parameters
    ----------
    X_new, X_train, dual_coef, kernel, block_size, train_block_size, preprocessing, nan_policy
        As in :func:`predict_blockwise`.
    out : str, optional
        Output store (local directory or fsspec URL).
    out_name : str
        Array name inside the store.
    model_fingerprint : str, optional
        Fingerprint of the fitted model (a
        :class:`~pipeline.models.artifact.ModelArtifact` supplies it); default: a
        content hash of ``X_train``, ``dual_coef``, the kernel spec and the
        preprocessing.
    input_fingerprint : str, optional
        Fingerprint of ``X_new``; default: a content hash (one extra streaming
        read of ``X_new``, small next to the kernel work).
    overwrite : bool
        Replace an output store written for another model or input instead of
        refusing it.
    progress : bool
        Show the progress (tiles done, rate, ETA) as the mode of
        :mod:`pipeline.engine.progress` says.

    Returns
    -------
    numpy.ndarray or BatchPrediction
        The predictions, or (with ``out``) where they were written.

    Raises
    ------
    ValueError
        Wrong feature count, non-finite ``X_new`` rows with ``nan_policy="raise"``
        (naming the row block), bad shapes or parameters.
    pipeline.storage.StoreMismatchError
        ``out`` holds predictions of another model or input.
    """
    if out is None:
        y = predict_blockwise(
            X_new, X_train, dual_coef, kernel,
            block_size=block_size, train_block_size=train_block_size,
            preprocessing=preprocessing, nan_policy=nan_policy, cache_block=cache_block,
        )  # fmt: skip
        (res,) = parallel.compute(y, progress=progress, desc="predict", unit="tile")
        return res

    b = _check_args(block_size, nan_policy)
    m = _check_model(X_train, dual_coef, kernel, preprocessing, train_block_size)
    X = _check_input(X_new, b, m)
    if model_fingerprint is None:
        model_fingerprint = _model_fp(X_train, dual_coef, m)
    if input_fingerprint is None:
        input_fingerprint = _input_fingerprint(X)
    kdt, odt = _dtypes(X, m)
    k = m.dual_coef.shape[1]
    shape = (X.shape[0],) if m.squeeze else (X.shape[0], k)
    meta = {
        "model_fingerprint": model_fingerprint,
        "input_fingerprint": input_fingerprint,
        "nan_policy": nan_policy,
    }
    ident = evaluation_identity(m.kernel, kdt)  # the engine's exp: in the fingerprint
    handle = _open_output(str(out), out_name, shape, b, odt, meta, overwrite, ident)
    n_blocks = len(X.chunks[0]) if X.shape[0] else 0
    todo = pending(
        handle.markers,
        range(n_blocks),
        key=lambda i: (i,),
        accept=lambda key: _checksummed(handle, key),
    )
    log.info("predict to %s/%s: %d of %d row blocks to compute", out, out_name, len(todo), n_blocks)
    if todo:
        dsk, _, _, _, _, done_key = _graph(
            X, m, nan_policy=nan_policy, rows=todo, cache_block=cache_block, handle=handle
        )
        execute(
            dsk, done_key, [X, m.X_train, m.dual_coef],
            progress=progress, desc="predict",
        )  # fmt: skip
    if todo or not handle.zarr().attrs.get("complete"):  # every block marked: this is
        handle.zarr().attrs["complete"] = True  # said to readers that ignore the markers
    return BatchPrediction(
        store=str(out),
        name=out_name,
        shape=shape,
        fingerprint=handle.fingerprint,
        n_blocks=n_blocks,
        n_computed=len(todo),
        n_skipped=n_blocks - len(todo),
    )


def _model_fp(X_train: Any, dual_coef: Any, m: _TrainBlocks) -> str:
    Xt = X_train.compute() if isinstance(X_train, da.Array) else np.asarray(X_train)
    a = dual_coef.compute() if isinstance(dual_coef, da.Array) else np.asarray(dual_coef)
    return _model_fingerprint(Xt, a, m.kernel, m.pre)
