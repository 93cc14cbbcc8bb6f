"""Artifacts never follow an X_train reference out of their directory (issue #13, item 7).

A model's JSON may name any path or URL as ``x_train_ref``; loading reads it
only when it resolves inside the artifact directory, or when the caller names
the location explicitly with ``load_artifact(path, x_train=...)``.
"""

from __future__ import annotations

import os

import fsspec
import numpy as np
import pytest
import zarr

from pipeline.kernels import RBF
from pipeline.models.artifact import META_KEY, ArtifactError, load_artifact, save_artifact
from pipeline.storage import fingerprint_obj


@pytest.fixture
def saved(tmp_path):
    """An artifact referencing X_train in a sibling file (``../xt.npy`` from the artifact)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    ref = tmp_path / "xt.npy"
    np.save(ref, X)
    art = save_artifact(
        tmp_path / "m", x_train_ref=str(ref), dual_coef=rng.normal(size=40), kernel=RBF(0.5),
        regularization=0.1,
    )  # fmt: skip
    return tmp_path / "m", ref, X, art


def _set_ref(artifact, url):
    """Rewrite the reference and re-sign the metadata, as a hostile or careless editor could."""
    group = zarr.open_group(store=str(artifact), mode="r+")
    meta = dict(group.attrs[META_KEY])
    meta["x_train_ref"] = {**meta["x_train_ref"], "url": url}
    body = {k: v for k, v in meta.items() if k not in ("meta_checksum", "complete")}
    meta["meta_checksum"] = fingerprint_obj(body)
    group.attrs[META_KEY] = meta


def test_outside_reference_needs_an_explicit_location(saved):
    path, ref, X, art = saved
    with pytest.raises(ArtifactError, match="outside the artifact directory") as exc:
        load_artifact(path)
    assert str(ref) in str(exc.value) and "x_train=" in str(exc.value)
    loaded = load_artifact(path, x_train=ref)
    np.testing.assert_array_equal(loaded.X_train, X)
    assert loaded.model_fingerprint == art.model_fingerprint
    # an explicit location is still checked against the recorded checksum
    np.save(path.parent / "other.npy", X + 1.0)
    with pytest.raises(ArtifactError, match="changed since the model was saved"):
        load_artifact(path, x_train=path.parent / "other.npy")


def test_dotdot_reference_is_refused(saved, monkeypatch):
    path, ref, X, _ = saved
    _set_ref(path, "../xt.npy")
    monkeypatch.chdir(path)  # even where '../xt.npy' exists relative to the working directory
    with pytest.raises(ArtifactError, match=r"'\.\./xt\.npy'.*outside the artifact"):
        load_artifact(path)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/xt.npy", "s3://bucket/xt.npy"])
def test_url_reference_is_never_fetched(saved, monkeypatch, url):
    path, *_ = saved
    _set_ref(path, url)

    def no_fetch(*a, **k):
        raise AssertionError(f"load_artifact fetched {a!r}")

    monkeypatch.setattr(fsspec, "open", no_fetch)
    monkeypatch.setattr(zarr, "open_array", no_fetch)
    with pytest.raises(ArtifactError, match="outside the artifact directory") as exc:
        load_artifact(path)
    assert url in str(exc.value)


def test_reference_inside_the_artifact_loads(saved, tmp_path):
    path, ref, X, _ = saved
    os.replace(ref, path / "xt.npy")
    _set_ref(path, "xt.npy")
    np.testing.assert_array_equal(load_artifact(path).X_train, X)
    # a symlink inside the artifact that leads out of it is refused
    np.save(tmp_path / "outside.npy", X)
    os.symlink(tmp_path / "outside.npy", path / "link.npy")
    _set_ref(path, "link.npy")
    with pytest.raises(ArtifactError, match="outside the artifact directory"):
        load_artifact(path)


def test_cli_takes_the_reference_explicitly(saved, tmp_path, capsys):
    from pipeline import cli

    path, ref, X, art = saved
    np.save(tmp_path / "new.npy", X[:5])
    assert cli.main(["predict", str(path), str(tmp_path / "new.npy"), str(tmp_path / "a.npy")]) == 3
    assert "--x-train" in capsys.readouterr().err  # the error names the fix
    argv = ["predict", str(path), str(tmp_path / "new.npy"), str(tmp_path / "b.npy")]
    assert cli.main([*argv, "--x-train", str(ref)]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "b.npy"), art.predict(X[:5], progress=False))
