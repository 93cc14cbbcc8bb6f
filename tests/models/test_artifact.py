"""The fitted-model artifact: round trip, portability, references, and clear failures."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

from pipeline.kernels import RBF, Laplacian, Linear
from pipeline.models.artifact import (
    FORMAT_VERSION,
    ArtifactError,
    ModelArtifact,
    load_artifact,
    save_artifact,
)
from pipeline.storage import StoreMismatchError


@pytest.fixture
def model():
    rng = np.random.default_rng(11)
    return {
        "X_train": rng.standard_normal((230, 4)),
        "dual_coef": rng.standard_normal((230, 2)),
        "kernel": 0.5 * RBF(length_scale=1.3) + Linear(),
        "regularization": [0.1, 0.01],
        "regularization_convention": "sklearn",
        "preprocessing": {"x_mean": rng.standard_normal(4), "x_scale": [1.0, 2.0, 3.0, 4.0],
                          "y_mean": [5.0, -5.0]},
        "fingerprint_chain": {"input": "abc", "gram": "def"},
        "extra": {"estimator": "KernelRidge", "params": {"alpha": 0.1, "kernel": "rbf"}},
    }  # fmt: skip


@pytest.fixture
def X_new():
    return np.random.default_rng(12).standard_normal((157, 4))


def _meta_path(path):
    return path / "zarr.json"


def _edit_meta(path, fn):
    doc = json.loads(_meta_path(path).read_text())
    fn(doc["attributes"]["krr_model"])
    _meta_path(path).write_text(json.dumps(doc))


def test_round_trip(model, tmp_path, X_new):
    saved = save_artifact(tmp_path / "m", **model)
    loaded = load_artifact(tmp_path / "m")
    assert isinstance(loaded, ModelArtifact)
    np.testing.assert_array_equal(loaded.X_train, model["X_train"])
    np.testing.assert_array_equal(loaded.dual_coef, model["dual_coef"])
    assert loaded.kernel == model["kernel"]
    np.testing.assert_array_equal(loaded.regularization, model["regularization"])
    assert loaded.regularization_convention == "sklearn"
    for key, value in model["preprocessing"].items():
        np.testing.assert_array_equal(loaded.preprocessing[key], value)
    assert loaded.fingerprint_chain == model["fingerprint_chain"]
    assert loaded.extra == model["extra"]
    assert loaded.model_fingerprint == saved.model_fingerprint != ""
    assert loaded.format_version == FORMAT_VERSION and loaded.package_version
    assert loaded.n_features == 4 and loaded.n_outputs == 2
    y = loaded.predict(X_new, block_size=40, train_block_size=64, progress=False)
    pre = model["preprocessing"]
    Xs = (X_new - pre["x_mean"]) / np.asarray(pre["x_scale"])
    ref = model["kernel"](Xs, model["X_train"]) @ model["dual_coef"] + pre["y_mean"]
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(y, saved.predict(X_new, block_size=40, train_block_size=64,
                                                   progress=False))  # fmt: skip


def test_single_output_scalar_lambda_and_file_url(tmp_path):
    rng = np.random.default_rng(0)
    Xt, a = rng.standard_normal((50, 3)), rng.standard_normal(50)
    save_artifact(f"file://{tmp_path}/m", X_train=Xt, dual_coef=a, kernel="laplacian",
                  regularization=1e-3)  # fmt: skip
    m = load_artifact(f"file://{tmp_path}/m")
    assert m.n_outputs is None and m.regularization == 1e-3
    assert m.kernel == Laplacian()
    X = rng.standard_normal((9, 3))
    np.testing.assert_allclose(m.predict(X, progress=False), Laplacian()(X, Xt) @ a, rtol=1e-10)


def test_no_pickle_anywhere(model, tmp_path, monkeypatch):
    save_artifact(tmp_path / "m", **model)

    def forbidden(*a, **k):
        raise AssertionError("loading an artifact must not unpickle anything")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    m = load_artifact(tmp_path / "m")
    assert m.dual_coef.dtype == np.float64
    group = zarr.open_group(store=str(tmp_path / "m"), mode="r")
    for name, arr in group.arrays():
        assert arr.dtype.kind == "f", name
    json.dumps(dict(group.attrs))  # all metadata is plain JSON


PORTABLE = textwrap.dedent(
    """
    import sys, numpy as np
    from pipeline.models.artifact import load_artifact
    m = load_artifact(sys.argv[1])
    np.save(sys.argv[3], m.predict(np.load(sys.argv[2]), block_size=64, progress=False))
    """
)


@pytest.mark.slow
def test_predicts_elsewhere_from_the_artifact_alone(model, tmp_path, X_new):
    """Copy the artifact to a new place; a fresh interpreter predicts the same values."""
    saved = save_artifact(tmp_path / "here" / "m", **model)
    expected = saved.predict(X_new, block_size=64, progress=False)
    shutil.copytree(tmp_path / "here" / "m", tmp_path / "there")
    shutil.rmtree(tmp_path / "here")
    np.save(tmp_path / "x.npy", X_new)
    proc = subprocess.run(
        [sys.executable, "-c", PORTABLE, str(tmp_path / "there"), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


@pytest.mark.parametrize("kind", ["zarr", "npy"])
def test_x_train_by_reference(model, tmp_path, X_new, kind):
    Xt = model.pop("X_train")
    if kind == "zarr":
        ref = str(tmp_path / "xt.zarr")
        z = zarr.create_array(store=ref, shape=Xt.shape, chunks=(64, 4), dtype="f8")
        z[...] = Xt
    else:
        ref = str(tmp_path / "xt.npy")
        np.save(ref, Xt)
    saved = save_artifact(tmp_path / "m", x_train_ref=ref, **model)
    assert not (tmp_path / "m" / "X_train").exists()
    # the reference lies outside the artifact: loading follows it only when told where it is
    with pytest.raises(ArtifactError, match="outside the artifact directory"):
        load_artifact(tmp_path / "m")
    loaded = load_artifact(tmp_path / "m", x_train=ref)
    assert loaded.x_train_ref == ref
    np.testing.assert_array_equal(loaded.X_train, Xt)
    assert loaded.model_fingerprint == saved.model_fingerprint
    # the reference changes: loading refuses it
    if kind == "zarr":
        zarr.open_array(store=ref)[3, 1] = 99.0
    else:
        Xt2 = Xt.copy()
        Xt2[3, 1] = 99.0
        np.save(ref, Xt2)
    with pytest.raises(ArtifactError, match="changed since the model was saved"):
        load_artifact(tmp_path / "m", x_train=ref)
    assert load_artifact(tmp_path / "m", verify=False, x_train=ref).X_train[3, 1] == 99.0
    shutil.rmtree(ref) if kind == "zarr" else (tmp_path / "xt.npy").unlink()
    with pytest.raises(FileNotFoundError, match="X_train reference"):
        load_artifact(tmp_path / "m", x_train=ref)


# -- failures -------------------------------------------------------------------------
def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model artifact at .*does not exist"):
        load_artifact(tmp_path / "nothing")


def test_not_an_artifact(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.txt").write_text("hello")
    with pytest.raises(ArtifactError, match="not a readable model artifact"):
        load_artifact(tmp_path / "junk")
    zarr.open_group(store=str(tmp_path / "grp"), mode="w").attrs["something"] = 1
    with pytest.raises(ArtifactError, match="not a krr-pipeline model artifact"):
        load_artifact(tmp_path / "grp")


def test_corrupt_metadata_file(model, tmp_path):
    save_artifact(tmp_path / "m", **model)
    _meta_path(tmp_path / "m").write_text('{"attributes": {"krr_model": ')
    with pytest.raises(ArtifactError, match="missing or corrupt"):
        load_artifact(tmp_path / "m")


def test_unknown_version(model, tmp_path):
    save_artifact(tmp_path / "m", **model)
    _edit_meta(tmp_path / "m", lambda m: m.update(format_version=99))
    with pytest.raises(ArtifactError, match=r"format version 99 .* reads versions \[1\]"):
        load_artifact(tmp_path / "m")


def test_interrupted_save(model, tmp_path):
    save_artifact(tmp_path / "m", **model)
    _edit_meta(tmp_path / "m", lambda m: m.update(complete=False))
    with pytest.raises(ArtifactError, match="incomplete"):
        load_artifact(tmp_path / "m")


def test_edited_metadata(model, tmp_path):
    save_artifact(tmp_path / "m", **model)
    _edit_meta(tmp_path / "m", lambda m: m["kernel"]["params"].update(gamma=5.0))
    with pytest.raises(ArtifactError, match="metadata checksum does not match"):
        load_artifact(tmp_path / "m")


@pytest.mark.parametrize("name", ["dual_coef", "X_train"])
def test_broken_array_checksum(model, tmp_path, name):
    save_artifact(tmp_path / "m", **model)
    chunk = next(
        p for p in (tmp_path / "m" / name).rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    raw = bytearray(chunk.read_bytes())
    raw[8] ^= 0xFF  # flip one byte of one stored value
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=f"array '{name}' fails its checksum"):
        load_artifact(tmp_path / "m")
    chunk.unlink()  # a missing chunk reads as zeros: still caught
    with pytest.raises(ArtifactError, match=f"array '{name}'"):
        load_artifact(tmp_path / "m")


def test_overwrite_rules(model, tmp_path):
    save_artifact(tmp_path / "m", **model)
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        save_artifact(tmp_path / "m", **model)
    model["dual_coef"] = 2 * model["dual_coef"]
    save_artifact(tmp_path / "m", overwrite=True, **model)
    np.testing.assert_array_equal(load_artifact(tmp_path / "m").dual_coef, model["dual_coef"])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.csv").write_text("1,2\n")
    with pytest.raises(FileExistsError, match="not a krr-pipeline model artifact"):
        save_artifact(tmp_path / "data", overwrite=True, **model)
    assert (tmp_path / "data" / "keep.csv").exists()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"extra": {"f": object()}}, "must be JSON-serialisable"),
        ({"regularization": -1.0}, "regularization"),
        ({"regularization_convention": ""}, "regularization_convention"),
        ({"x_train_ref": "somewhere.zarr"}, "exactly one of X_train"),
        ({"dual_coef": np.zeros(3)}, "dual_coef must have shape"),
        ({"dual_coef": np.full((230, 2), np.nan)}, "NaN or inf"),
        ({"preprocessing": {"x_scale": np.zeros(4)}}, "scale must be non-zero"),
    ],
)
def test_bad_save_arguments(model, tmp_path, change, match):
    model.update(change)
    with pytest.raises(ValueError, match=match):
        save_artifact(tmp_path / "m", **model)
    assert not (tmp_path / "m").exists()


def test_batch_store_of_another_artifact_is_refused(model, tmp_path, X_new):
    a = save_artifact(tmp_path / "a", **model)
    model["dual_coef"] = model["dual_coef"] + 1.0
    b = save_artifact(tmp_path / "b", **model)
    out = str(tmp_path / "pred")
    res = a.predict(X_new, out=out, block_size=50, progress=False)
    assert res.n_computed == 4
    with pytest.raises(StoreMismatchError, match="another model"):
        b.predict(X_new, out=out, block_size=50, progress=False)
    again = load_artifact(tmp_path / "a").predict(X_new, out=out, block_size=50, progress=False)
    assert again.n_skipped == 4


def _krr_run_like_model(path, X, y, convention="sklearn"):
    """What krr run's model stage writes: standardised X_train, the scaler, no estimator."""
    from sklearn.kernel_ridge import KernelRidge as SK

    from pipeline.kernels import RBF

    xm, xs, ym, ys = X.mean(0), X.std(0), y.mean(), y.std()
    Z, t = (X - xm) / xs, (y - ym) / ys
    lam = 0.1 if convention == "sklearn" else 0.1 / len(X)
    sk = SK(alpha=0.1, kernel="rbf", gamma=0.5).fit(Z, t)
    save_artifact(
        path, dual_coef=sk.dual_coef_, kernel=RBF(gamma=0.5), regularization=lam,
        regularization_convention=convention, X_train=Z, extra={"solver": "cholesky"},
        preprocessing={"x_mean": xm, "x_scale": xs, "y_mean": ym, "y_scale": ys},
    )  # fmt: skip
    return lambda Xq: sk.predict((Xq - xm) / xs) * ys + ym


def test_a_loaded_krr_run_model_keeps_its_scaler_when_saved_and_drops_it_when_refit(tmp_path):
    # re-saving dropped the scaler (predictions off by 10 on |y| ~ 9); a refit kept it
    # and rescaled the new fit's predictions (off by 7) (session 25)
    from pipeline import KernelRidge, load

    rng = np.random.default_rng(0)
    X = 10 + 5 * rng.standard_normal((200, 3))
    y = np.sin(X).sum(1) * 3 + 7
    Xt = 10 + 5 * rng.standard_normal((20, 3))
    ref = _krr_run_like_model(str(tmp_path / "run_model"), X, y)
    m = load(str(tmp_path / "run_model"))
    np.testing.assert_allclose(m.predict(Xt), ref(Xt), atol=1e-10)
    m.save(str(tmp_path / "resaved"))
    np.testing.assert_array_equal(load(str(tmp_path / "resaved")).predict(Xt), m.predict(Xt))
    m.set_params(solver="dense").fit(X, y)
    assert not hasattr(m, "preprocessing_")
    fresh = KernelRidge(alpha=0.1, kernel=m.kernel, solver="dense").fit(X, y)
    np.testing.assert_array_equal(m.predict(Xt), fresh.predict(Xt))


def test_a_loaded_n_samples_krr_run_model_reports_its_shift(tmp_path):
    from pipeline import load

    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((50, 2)), rng.standard_normal(50)
    _krr_run_like_model(str(tmp_path / "m"), X, y, convention="n")
    m = load(str(tmp_path / "m"))
    assert m.alpha_convention == "n_samples"
    np.testing.assert_allclose(m.effective_alpha_, [0.1])  # n * (0.1 / n), not 0.1 / n


def test_primal_per_target_and_dataframe_models_round_trip_bitwise(tmp_path):
    # primal_coef_ was not saved, so a loaded primal model predicted through dual_coef_
    # (0.49 off at float32, alpha=1e-6); per-target alphas were recorded as the first;
    # a DataFrame's F-ordered X_fit_ changed the bits after a round trip (session 25)
    import pandas as pd

    from pipeline import KernelRidge, load

    rng = np.random.default_rng(2)
    X = rng.standard_normal((120, 4))
    Y = X @ rng.standard_normal((4, 2))
    for X_fit, alpha, kernel in (
        (X.astype(np.float32), 1e-6, "linear"),
        (X, [0.1, 5.0], "rbf"),
        (pd.DataFrame(X, columns=list("abcd")), 0.1, "rbf"),
    ):
        m = KernelRidge(alpha=alpha, kernel=kernel).fit(X_fit, Y)
        path = str(tmp_path / f"m{len(list(tmp_path.iterdir()))}")
        m.save(path)
        back = load(path)
        np.testing.assert_array_equal(back.predict(X_fit), m.predict(X_fit))
        assert getattr(back, "solver_", None) == m.solver_
    assert load_artifact(path).regularization is not None
    two = load_artifact(str(tmp_path / "m1"))
    np.testing.assert_array_equal(np.atleast_1d(two.regularization), [0.1, 5.0])


def test_overwrite_keeps_what_the_artifact_did_not_write(model, tmp_path):
    # overwrite=True removed everything under the path: a user's notes, and the training
    # rows an x_train_ref pointed at inside it, which were then read back as zeros and
    # saved without error (session 26)
    save_artifact(tmp_path / "m", **model)
    (tmp_path / "m" / "NOTES.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"also holds \['NOTES.txt'\]"):
        save_artifact(tmp_path / "m", overwrite=True, **model)
    assert (tmp_path / "m" / "NOTES.txt").read_text() == "mine"
    (tmp_path / "m" / "NOTES.txt").unlink()
    X = np.asarray(model.pop("X_train"))
    with pytest.raises(FileExistsError, match="lies inside the artifact"):
        save_artifact(tmp_path / "m", overwrite=True, x_train_ref=str(tmp_path / "m" / "X_train"),
                      **model)  # fmt: skip
    np.testing.assert_array_equal(load_artifact(tmp_path / "m").X_train, X)


def test_a_primal_float32_model_predicts_as_fitted_through_its_artifact(tmp_path):
    # the artifact (krr predict) evaluated the kernel in float32 against a large alpha:
    # predictions off by more than y's range, exit 0 (session 26)
    from pipeline import KernelRidge

    rng = np.random.default_rng(5)
    X = rng.normal(size=(1500, 3)) + [20.0, 50.0, 100.0]
    y = X @ [1.0, -2.0, 0.5] + rng.normal(size=1500)
    Xn = (rng.normal(size=(200, 3)) + [20.0, 50.0, 100.0]).astype(np.float32)
    m = KernelRidge(kernel="linear", alpha=1e-2).fit(X.astype(np.float32), y)
    assert m.solver_ == "primal"
    m.save(str(tmp_path / "p"))
    got = load_artifact(tmp_path / "p").predict(Xn, progress=False)
    np.testing.assert_allclose(got, m.predict(Xn), atol=1e-3 * np.ptp(y))
