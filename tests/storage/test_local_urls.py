"""Local paths in every spelling name the same place (session-26 review)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.stages.config import load_config


def test_tilde_paths_in_a_config_are_the_home_directorys(tmp_path, monkeypatch):
    # "~/runs/demo" was checked as the home directory's, then written to ./~/runs/demo
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config({"data": {"source": "npy", "path": "~/X.npy", "y_path": "~/y.npy"},
                       "run_dir": "~/runs/demo"})  # fmt: skip
    assert cfg.data.path == str(tmp_path / "home" / "X.npy")
    assert str(cfg.resolved_run_dir()) == str(tmp_path / "home" / "runs" / "demo")


@pytest.mark.parametrize("scheme", ["local://", "FILE://", "file:"])
def test_a_store_url_of_any_local_spelling_is_one_local_store(tmp_path, monkeypatch, scheme):
    # local:// failed (Zarr and the markers saw two places); file:/abs split the store
    # between ./file:/abs (arrays) and /abs (markers) (session 26)
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(120, 3)), rng.normal(size=120)
    store = tmp_path / "st"
    m = KernelRidge(solver="cholesky", store=f"{scheme}{store}", block_size=50).fit(X, y)
    ref = KernelRidge(solver="dense").fit(X, y)
    np.testing.assert_allclose(m.predict(X), ref.predict(X), rtol=1e-8, atol=1e-10)
    assert store.is_dir() and not (tmp_path / "file:").exists()
    assert any(p.name == "zarr.json" for p in store.rglob("zarr.json"))
