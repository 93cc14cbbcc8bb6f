"""Blockwise prediction: equality with the dense reference, inputs, bad input, Zarr output."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from dask.callbacks import Callback

from pipeline.kernels import RBF, Laplacian, Linear, Polynomial
from pipeline.linalg.blockwise import BatchPrediction, predict, predict_blockwise
from pipeline.storage import StoreMismatchError

TOL = {"rtol": 1e-10, "atol": 1e-10}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(42)
    Xt = rng.standard_normal((311, 3))
    X = rng.standard_normal((523, 3))
    a1 = rng.standard_normal(311)
    a3 = rng.standard_normal((311, 3))
    return X, Xt, a1, a3


@pytest.mark.parametrize(
    ("block_size", "train_block_size", "cache_block"),
    [(64, 64, 1024), (100, 37, 16), (1000, 1000, 1024), (7, 311, 50), (523, 1, 1024)],
)
@pytest.mark.parametrize("multi", [False, True])
def test_equals_dense_reference(data, block_size, train_block_size, cache_block, multi):
    X, Xt, a1, a3 = data
    a = a3 if multi else a1
    k = RBF(gamma=0.4)
    ref = k(X, Xt) @ a
    y = predict(
        X, Xt, a, k, block_size=block_size, train_block_size=train_block_size,
        cache_block=cache_block, progress=False,
    )  # fmt: skip
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, **TOL)


@pytest.mark.parametrize(
    "kernel",
    [Laplacian(gamma=0.3), Polynomial(degree=2, coef0=1.0), Linear(), 2.0 * RBF() + Linear()],
)
def test_other_kernels(data, kernel):
    X, Xt, _, a3 = data
    y = predict(X, Xt, a3, kernel, block_size=128, train_block_size=100, progress=False)
    np.testing.assert_allclose(y, kernel(X, Xt) @ a3, **TOL)


def test_lazy_dask_array_and_tiles_never_leave_a_task(data):
    X, Xt, a1, _ = data
    k = RBF(gamma=0.4)
    b, bt = 128, 160
    y = predict_blockwise(X, Xt, a1, k, block_size=b, train_block_size=bt)
    assert isinstance(y, da.Array)
    assert y.shape == (523,)
    assert y.chunks[0] == (128, 128, 128, 128, 11)

    biggest = []

    class Sizes(Callback):
        def _posttask(self, key, result, dsk, state, id):
            biggest.append(getattr(result, "nbytes", 0))

    with Sizes():
        out = y.compute(scheduler="threads")
    np.testing.assert_allclose(out, k(X, Xt) @ a1, **TOL)
    # every task result is a row block, a train block or a partial product:
    # no task hands a kernel tile (b x bt x 8 bytes) to another
    assert max(biggest) < b * bt * 8 / 4


def test_input_sources_agree(data, tmp_path):
    X, Xt, _, a3 = data
    k = RBF(gamma=0.4)
    ref = k(X, Xt) @ a3
    np.save(tmp_path / "x.npy", X)
    z = zarr.create_array(store=str(tmp_path / "x.zarr"), shape=X.shape, chunks=(50, 3), dtype="f8")
    z[...] = X
    cols = ["a", "b", "c"]
    pd.DataFrame(X, columns=cols).to_parquet(tmp_path / "x.parquet")
    sources = [
        X,
        da.from_array(X, chunks=(97, 2)),
        z,
        str(tmp_path / "x.npy"),
        str(tmp_path / "x.zarr"),
        str(tmp_path / "x.parquet"),
    ]
    for src in sources:
        y = predict(src, Xt, a3, k, block_size=100, train_block_size=64, progress=False)
        np.testing.assert_allclose(y, ref, **TOL, err_msg=f"source {type(src)}")


def test_preprocessing(data):
    X, Xt, _, a3 = data
    k = RBF(gamma=0.4)
    pre = {
        "x_mean": np.array([0.1, -0.2, 0.3]),
        "x_scale": np.array([2.0, 0.5, 1.5]),
        "y_mean": np.array([1.0, 2.0, 3.0]),
        "y_scale": 4.0,
    }
    y = predict(X, Xt, a3, k, preprocessing=pre, block_size=100, progress=False)
    ref = k((X - pre["x_mean"]) / pre["x_scale"], Xt) @ a3 * 4.0 + pre["y_mean"]
    np.testing.assert_allclose(y, ref, **TOL)
    with pytest.raises(ValueError, match="unknown preprocessing parameter 'x_min'"):
        predict(X, Xt, a3, k, preprocessing={"x_min": 0.0}, progress=False)
    with pytest.raises(ValueError, match="'y_mean' must be a scalar or have length 3"):
        predict(X, Xt, a3, k, preprocessing={"y_mean": [1.0, 2.0]}, progress=False)


def test_float32_stays_float32(data):
    X, Xt, a1, _ = data
    k = RBF(gamma=0.4)
    y = predict(
        X.astype(np.float32), Xt.astype(np.float32), a1.astype(np.float32), k, progress=False
    )
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, k(X, Xt) @ a1, rtol=1e-4, atol=1e-4)


# -- bad input ----------------------------------------------------------------------
def test_wrong_feature_count(data):
    X, Xt, a1, _ = data
    with pytest.raises(ValueError, match="X_new has 2 features, but the model was fitted on 3"):
        predict(X[:, :2], Xt, a1, RBF(), progress=False)


def test_nan_rows_raise_naming_the_block(data):
    X, Xt, a1, _ = data
    Xb = X.copy()
    Xb[250, 1] = np.nan
    with pytest.raises(ValueError, match=r"row block 2 \(rows 200\.\.299\).*first at row 250"):
        predict(Xb, Xt, a1, RBF(), block_size=100, progress=False)


def test_nan_rows_propagate_when_asked(data):
    X, Xt, a3, _ = data[0], data[1], data[3], None
    k = RBF(gamma=0.4)
    Xb = X.copy()
    Xb[[3, 250, 522], [0, 1, 2]] = [np.nan, np.inf, -np.inf]
    y = predict(Xb, Xt, a3, k, block_size=100, nan_policy="propagate", progress=False)
    bad = np.zeros(len(X), bool)
    bad[[3, 250, 522]] = True
    assert np.isnan(y[bad]).all()
    np.testing.assert_allclose(y[~bad], (k(X, Xt) @ a3)[~bad], **TOL)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nan_policy": "ignore"}, "nan_policy must be one of"),
        ({"block_size": 0}, "block_size must be"),
        ({"train_block_size": 0}, "train_block_size must be >= 1"),
    ],
)
def test_bad_parameters(data, kwargs, match):
    X, Xt, a1, _ = data
    with pytest.raises(ValueError, match=match):
        predict(X, Xt, a1, RBF(), progress=False, **kwargs)


def test_bad_model_shapes(data):
    X, Xt, a1, _ = data
    with pytest.raises(ValueError, match=r"dual_coef must have shape \(311,\)"):
        predict(X, Xt, a1[:-1], RBF(), progress=False)
    with pytest.raises(ValueError, match="X_train must be 2-D"):
        predict(X, Xt[:, 0], a1, RBF(), progress=False)


# -- output to a Zarr store -------------------------------------------------------------
def test_zarr_output_and_rerun_skips_everything(data, tmp_path):
    X, Xt, _, a3 = data
    k = RBF(gamma=0.4)
    out = str(tmp_path / "pred")
    res = predict(X, Xt, a3, k, out=out, block_size=100, progress=False)
    assert isinstance(res, BatchPrediction)
    assert (res.n_blocks, res.n_computed, res.n_skipped) == (6, 6, 0)
    arr = zarr.open_array(store=out, path="predictions", mode="r")
    assert arr.shape == (523, 3) and arr.chunks == (100, 3)
    np.testing.assert_allclose(arr[...], k(X, Xt) @ a3, **TOL)
    again = predict(X, Xt, a3, k, out=out, block_size=100, progress=False)
    assert (again.n_computed, again.n_skipped) == (0, 6)
    np.testing.assert_array_equal(again.to_numpy(), res.to_numpy())


def test_output_store_of_another_model_is_refused(data, tmp_path):
    X, Xt, a1, _ = data
    k = RBF(gamma=0.4)
    out = str(tmp_path / "pred")
    predict(X, Xt, a1, k, out=out, block_size=100, progress=False)
    with pytest.raises(StoreMismatchError, match="holds predictions of another model"):
        predict(X, Xt, 2 * a1, k, out=out, block_size=100, progress=False)
    with pytest.raises(StoreMismatchError, match="holds predictions of another model"):
        predict(X, Xt, a1, RBF(gamma=0.5), out=out, block_size=100, progress=False)
    with pytest.raises(StoreMismatchError, match="holds predictions for another input"):
        predict(X + 1, Xt, a1, k, out=out, block_size=100, progress=False)
    # nothing was modified by the refusals; overwrite=True replaces the store
    np.testing.assert_allclose(
        zarr.open_array(store=out, path="predictions")[...], k(X, Xt) @ a1, **TOL
    )
    res = predict(X, Xt, 2 * a1, k, out=out, block_size=100, overwrite=True, progress=False)
    assert res.n_computed == 6
    np.testing.assert_allclose(res.to_numpy(), 2 * (k(X, Xt) @ a1), **TOL)


def test_missing_marker_block_is_recomputed_alone(data, tmp_path):
    X, Xt, a1, _ = data
    k = RBF(gamma=0.4)
    out = tmp_path / "pred"
    first = predict(X, Xt, a1, k, out=str(out), block_size=100, progress=False).to_numpy()
    # a crash after a block's data write but before its marker: data present, no marker
    (out / "_markers" / "predictions" / "3").unlink()
    zarr.open_array(store=str(out), path="predictions")[300:400] = -1.0
    res = predict(X, Xt, a1, k, out=str(out), block_size=100, progress=False)
    assert (res.n_computed, res.n_skipped) == (1, 5)
    np.testing.assert_array_equal(res.to_numpy(), first)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, zarr
    from pipeline.diagnostics import peak_rss_bytes
    from pipeline.kernels import RBF
    from pipeline.linalg.blockwise import predict

    store, M, N, D = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(0)
    Xt = rng.standard_normal((N, D)); a = rng.standard_normal(N)
    z = zarr.create_array(store=store + "/x.zarr", shape=(M, D), chunks=(4096, D), dtype="f8")
    for s in range(0, M, 4096):
        z[s:s + 4096] = rng.standard_normal((min(4096, M - s), D))
    k = RBF(gamma=1.0 / D)
    predict(store + "/x.zarr", Xt[:50], a[:50], k, block_size=2048, progress=False)  # warm up
    base = peak_rss_bytes()
    res = predict(store + "/x.zarr", Xt, a, k, out=store + "/out", block_size=2048,
                  train_block_size=2048, progress=False)
    peak = peak_rss_bytes()
    y = res.zarr()
    check = k(np.asarray(z[1000:1100]), Xt) @ a
    print(json.dumps({"base": base, "peak": peak, "err": float(abs(y[1000:1100] - check).max()),
                      "computed": res.n_computed}))
    """
)


@pytest.mark.slow
def test_memory_bounded_far_below_the_kernel_size(tmp_path):
    M, N, D = 40_000, 6_000, 8
    kernel_bytes = M * N * 8  # 1.9 GB if the kernel were materialised
    budget = 128 * 2**20  # growth of peak RSS allowed during the prediction (measured: ~20 MiB)
    assert kernel_bytes >= 14 * budget
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path), str(M), str(N), str(D)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rec["err"] < 1e-10
    assert rec["computed"] == -(-M // 2048)
    growth = rec["peak"] - rec["base"]
    assert growth < budget, f"peak RSS grew by {growth / 2**20:.0f} MiB during prediction"
    assert rec["peak"] < 1024 * 2**20, f"peak RSS {rec['peak'] / 2**20:.0f} MiB"


def test_runs_under_dask_config_scheduler_sync(data):
    # the lazy array composes with ordinary dask code and other schedulers
    X, Xt, a1, _ = data
    k = RBF(gamma=0.4)
    with dask.config.set(scheduler="sync"):
        y = (predict_blockwise(X, Xt, a1, k, block_size=77) * 2).compute()
    np.testing.assert_allclose(y, 2 * (k(X, Xt) @ a1), **TOL)
