"""Tables in, tables out, by name (issue #13, item 6).

``krr predict`` reads CSV/Parquet feature columns by the model's feature names
(reordered columns give the same predictions; a missing or an extra column is
refused, naming it), and the output format follows the output's extension.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
import zarr

from pipeline import KernelRidge, cli
from pipeline.models.artifact import load_artifact, save_artifact

FEATURES = ["carat", "depth", "table"]


def run_cli(*argv):
    return cli.main([str(a) for a in argv])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(80, 3)) * np.array([1.0, 3.0, 0.3])
    y = 2.0 * X[:, 0] + np.sin(X[:, 1]) - X[:, 2] ** 2
    X_new = rng.normal(size=(25, 3)) * np.array([1.0, 3.0, 0.3])
    return X, y, X_new


@pytest.fixture(scope="module")
def named_model(data, tmp_path_factory):
    """A model fitted on a DataFrame: it knows its feature names."""
    X, y, _ = data
    est = KernelRidge(alpha=0.1, kernel="rbf", gamma=0.3).fit(pd.DataFrame(X, columns=FEATURES), y)
    path = tmp_path_factory.mktemp("named") / "model"
    est.save(path)
    return path, est


@pytest.fixture(scope="module")
def priced_model(data, tmp_path_factory):
    """A model artifact with feature and target names (as the ``model`` stage writes)."""
    X, y, _ = data
    est = KernelRidge(alpha=0.1, kernel="rbf", gamma=0.3).fit(X, y)
    path = tmp_path_factory.mktemp("priced") / "model"
    save_artifact(
        path,
        X_train=X,
        dual_coef=est.dual_coef_,
        kernel=est.kernel_,
        regularization=0.1,
        feature_names=FEATURES,
        target_names=["price"],
    )
    return path, est


def _csv(path, X, cols, **extra):
    df = pd.DataFrame(X, columns=FEATURES)
    for k, v in extra.items():
        df[k] = v
    df[cols + list(extra)].to_csv(path, index=False)
    return path


def test_estimator_records_and_saves_feature_names(named_model):
    path, est = named_model
    assert list(est.feature_names_in_) == FEATURES
    assert load_artifact(path).feature_names == FEATURES
    from pipeline import load

    assert list(load(path).feature_names_in_) == FEATURES


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_reordered_columns_give_the_same_predictions(named_model, data, tmp_path, fmt):
    path, est = named_model
    X_new = data[2]
    expected = est.predict(pd.DataFrame(X_new, columns=FEATURES))
    df = pd.DataFrame(X_new, columns=FEATURES)
    for order in (FEATURES, ["table", "carat", "depth"]):
        src = tmp_path / f"in_{'_'.join(order)}.{fmt}"
        getattr(df[order], f"to_{fmt}")(src, index=False)
        out = tmp_path / f"out_{'_'.join(order)}.npy"
        assert run_cli("predict", path, src, out) == 0
        np.testing.assert_allclose(np.load(out), expected, rtol=1e-10, atol=1e-10)


def test_artifact_predict_reads_a_dataframe_by_name(named_model, data):
    path, est = named_model
    X_new = data[2]
    art = load_artifact(path)
    shuffled = pd.DataFrame(X_new, columns=FEATURES)[["depth", "table", "carat"]]
    got = art.predict(shuffled, block_size=8, progress=False)
    expected = est.predict(pd.DataFrame(X_new, columns=FEATURES))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_missing_column_is_refused_naming_it(named_model, data, tmp_path, capsys):
    path, _ = named_model
    src = tmp_path / "missing.csv"
    pd.DataFrame(data[2][:, :2], columns=["carat", "depth"]).to_csv(src, index=False)
    assert run_cli("predict", path, src, tmp_path / "p.npy") == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "['table']" in err and "missing" in err
    assert not (tmp_path / "p.npy").exists()


def test_extra_column_is_refused_unless_columns_are_selected(named_model, data, tmp_path, capsys):
    path, est = named_model
    src = _csv(tmp_path / "extra.csv", data[2], ["depth", "carat", "table"], price=1.0)
    assert run_cli("predict", path, src, tmp_path / "p.npy") == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "['price']" in err and "--columns carat,depth,table" in err
    # explicit selection (any order): read by name, same predictions
    out = tmp_path / "sel.npy"
    assert run_cli("predict", path, src, out, "--columns", "table,depth,carat") == 0
    expected = est.predict(pd.DataFrame(data[2], columns=FEATURES))
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-10, atol=1e-10)
    # an explicit selection that is not the model's features is refused, naming it
    bad = run_cli("predict", path, src, tmp_path / "bad.npy", "--columns", "carat,depth,price")
    assert bad == cli.EXIT_BAD_INPUT
    assert "['table']" in capsys.readouterr().err


def test_unnamed_model_takes_numeric_columns_in_file_order_with_a_warning(
    data, tmp_path, caplog, capsys
):
    X, y, X_new = data
    est = KernelRidge(alpha=0.1, kernel="rbf", gamma=0.3).fit(X, y)
    est.save(tmp_path / "m")
    assert load_artifact(tmp_path / "m").feature_names is None
    src = tmp_path / "new.csv"
    df = pd.DataFrame(X_new, columns=["u", "v", "w"])
    df.insert(1, "id", [f"r{i}" for i in range(len(df))])  # non-numeric: skipped
    df.to_csv(src, index=False)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert run_cli("predict", tmp_path / "m", src, tmp_path / "p.npy") == 0
    assert "no feature names" in caplog.text
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), est.predict(X_new), rtol=1e-10)
    df["extra"] = 1.0  # four numeric columns for a three-feature model: refused
    df.to_csv(src, index=False)
    assert run_cli("predict", tmp_path / "m", src, tmp_path / "q.npy") == cli.EXIT_BAD_INPUT
    assert "4 numeric columns" in capsys.readouterr().err


def test_output_format_follows_the_extension(priced_model, data, tmp_path):
    path, est = priced_model
    expected = est.predict(data[2])
    src = tmp_path / "new.npy"
    np.save(src, data[2])
    for ext in ("npy", "csv", "parquet", "zarr"):
        assert run_cli("predict", path, src, tmp_path / f"out.{ext}") == 0
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-12)
    csv = pd.read_csv(tmp_path / "out.csv")
    assert list(csv.columns) == ["price"]
    np.testing.assert_allclose(csv["price"].to_numpy(), expected, rtol=1e-12)
    pq = pd.read_parquet(tmp_path / "out.parquet")  # a Parquet file, not a Zarr directory
    assert (tmp_path / "out.parquet").is_file() and list(pq.columns) == ["price"]
    np.testing.assert_allclose(pq["price"].to_numpy(), expected, rtol=1e-12)
    z = zarr.open_array(store=str(tmp_path / "out.zarr"), path="predictions", mode="r")
    np.testing.assert_allclose(z[...], expected, rtol=1e-12)


def test_unnamed_outputs_are_y0_y1(data, tmp_path):
    X, y, X_new = data
    Y = np.c_[y, -y]
    est = KernelRidge(alpha=0.1, kernel="rbf", gamma=0.3).fit(X, Y)
    est.save(tmp_path / "m")
    np.save(tmp_path / "new.npy", X_new)
    assert run_cli("predict", tmp_path / "m", tmp_path / "new.npy", tmp_path / "o.csv") == 0
    csv = pd.read_csv(tmp_path / "o.csv")
    assert list(csv.columns) == ["y0", "y1"]
    np.testing.assert_allclose(csv.to_numpy(), est.predict(X_new), rtol=1e-12)


@pytest.mark.parametrize("name", ["out.txt", "out", "out.json/"])
def test_unknown_output_extension_is_refused_before_any_work(tmp_path, capsys, name):
    # the model and the input do not even exist: the output is checked first
    code = run_cli("predict", tmp_path / "no-model", tmp_path / "no-input.npy", tmp_path / name)
    assert code == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "'.zarr'" in err and "'.parquet'" in err and "extension" in err
    assert not (tmp_path / name.rstrip("/")).exists()


def test_config_predict_output_extension_is_checked():
    from pydantic import ValidationError

    from pipeline.stages.config import PredictConfig

    with pytest.raises(ValidationError, match="'.txt'"):
        PredictConfig(output="preds.txt")
    assert PredictConfig(input="x.npy", output="preds.parquet").output == "preds.parquet"
    with pytest.raises(ValidationError, match="needs predict.input"):  # else nothing written
        PredictConfig(output="preds.parquet")


@pytest.mark.slow
def test_run_records_names_and_predict_stage_writes_by_extension(tmp_path, capsys, diabetes_config):
    """``krr run``: the model knows its feature/target names; ``predict.output`` follows
    its extension, and the batch input (columns reversed) is read by name."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    feats = [c for c in frame.columns if c != "target"]
    new = frame[feats].iloc[:30]
    new[feats[::-1]].to_csv(tmp_path / "new.csv", index=False)
    conf = diabetes_config()
    out = tmp_path / "batch.parquet"
    argv = ["run", conf, f"predict.input={tmp_path / 'new.csv'}", f"predict.output={out}"]
    assert run_cli(*argv, "--run-dir", tmp_path / "run") == 0
    from pipeline.stages.status import latest_model

    art = load_artifact(latest_model(tmp_path / "run"))  # results/<configuration>/model/model
    assert art.feature_names == feats and art.target_names == ["target"]
    got = pd.read_parquet(out)
    assert list(got.columns) == ["target"]
    expected = art.predict(new.to_numpy(), block_size=64, progress=False)
    np.testing.assert_allclose(got["target"].to_numpy(), expected, rtol=1e-9)
    # a config whose output has an unknown extension is refused before any work
    bad = run_cli("run", conf, "predict.output=b.txt", "--run-dir", tmp_path / "run2")
    assert bad == cli.EXIT_BAD_CONFIG and "'.txt'" in capsys.readouterr().err
    assert not (tmp_path / "run2").exists()
