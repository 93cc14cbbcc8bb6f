"""How the committed fixtures beside this file were made (issue #43: pins written before
anything moves). Do NOT rerun it to make a failing test pass: the fixtures are the
on-disk format of 2026-11-28 (commit f280298), and the tests check that the code under
test still loads and resumes them.

    cd tests/contracts/data && PYTHONPATH=../../.. python make_fixtures.py

writes, packed into ``fixtures.tar.gz`` (:func:`pack`: the stores stay out of the
repository's tree of files; the tests unpack a copy)

- ``run_fixture/``: ``X.npy`` (48 x 3), ``y.npy``, ``Xn.npy`` (10 x 3), ``conf.yaml`` and
  ``run/``, the run directory of :data:`RUN_CONFIG` (paths relative to ``run_fixture``:
  the stage fingerprints hold the relative paths, so a copy resumes from its own
  directory; see ``test_store_layout_pins.py``), and ``expected_batch.npy``, the
  predictions of ``Xn.npy`` it stored;
- ``artifact_fixture/``: ``model/`` (``KernelRidge.save`` of a fit on ``X_art``),
  ``X_new.npy`` and ``expected.npy`` (its predictions).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np

#: the run's config (``krr run`` gets the data paths as overrides: see conf.yaml)
RUN_CONFIG = {
    "name": "pin",
    "data": {"source": "npy", "path": "X.npy", "y_path": "y.npy"},
    "split": {"test_fraction": 0.25, "seed": 3},
    "kernel": {"name": "rbf", "params": {"gamma": 0.3}},
    "lambda": 0.01,
    "solver": {"method": "cholesky"},
    "predict": {"input": "Xn.npy"},
    "evaluate": {"baseline": "none"},
    "block_size": 16,
}
#: the same run from the command line, from ``run_fixture/``: the paths typed as overrides
#: stay relative (those inside a config file are joined to its directory)
CONF_YAML = """\
name: pin
split: {test_fraction: 0.25, seed: 3}
kernel: {name: rbf, params: {gamma: 0.3}}
lambda: 0.01
solver: {method: cholesky}
evaluate: {baseline: none}
block_size: 16
cluster: {n_workers: 1, processes: false, memory_limit: 1GiB, dashboard: false}
"""
RUN_OVERRIDES = ("data.source=npy", "data.path=X.npy", "data.y_path=y.npy", "predict.input=Xn.npy")


def artifact_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The artifact's training rows, targets and new rows (exact in binary)."""
    X = (np.arange(40 * 3, dtype=np.float64).reshape(40, 3) % 7) / 8.0
    y = X[:, 0] - 2.0 * X[:, 1] + 0.25 * X[:, 2]
    X_new = (np.arange(6 * 3, dtype=np.float64).reshape(6, 3) % 5) / 4.0
    return X, y, X_new


def main(dest: Path) -> None:
    import pipeline
    from pipeline.storage import read_all

    run_fx = dest / "run_fixture"
    shutil.rmtree(run_fx, ignore_errors=True)
    run_fx.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(run_fx / "X.npy", rng.standard_normal((48, 3)))
    np.save(run_fx / "y.npy", rng.standard_normal(48))
    np.save(run_fx / "Xn.npy", rng.standard_normal((10, 3)))
    (run_fx / "conf.yaml").write_text(CONF_YAML)
    cwd = os.getcwd()
    os.chdir(run_fx)
    try:
        rep = pipeline.run(RUN_CONFIG, "run")
        batch = rep.outputs["predict"]["batch"]
        np.save("expected_batch.npy", read_all(batch["store"], batch["name"], row_keys=True))
    finally:
        os.chdir(cwd)

    art_fx = dest / "artifact_fixture"
    shutil.rmtree(art_fx, ignore_errors=True)
    art_fx.mkdir(parents=True)
    X, y, X_new = artifact_data()
    est = pipeline.KernelRidge(alpha=0.1, kernel="rbf", gamma=0.5, solver="cholesky")
    est.fit(X, y).save(str(art_fx / "model"))
    np.save(art_fx / "X_new.npy", X_new)
    np.save(art_fx / "expected.npy", est.predict(X_new))


#: the archive of both fixtures, beside this file
ARCHIVE = "fixtures.tar.gz"
FIXTURES = ("artifact_fixture", "run_fixture")


def pack(src: Path, archive: Path) -> None:
    """``src/run_fixture`` and ``src/artifact_fixture`` as one gzipped tar, byte for byte
    reproducible (sorted names, no times, owners or modes beyond 0o644/0o755)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top in FIXTURES:
            for path in sorted([src / top, *(src / top).rglob("*")]):
                info = tarfile.TarInfo(path.relative_to(src).as_posix())
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if path.is_dir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    data = path.read_bytes()
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
    import gzip

    archive.write_bytes(gzip.compress(buf.getvalue(), mtime=0))


def unpack(archive: Path, dest: Path) -> Path:
    """The fixtures of ``archive`` under ``dest`` (returned)."""
    with tarfile.open(archive, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)
    return dest


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "_build"
    main(work)
    pack(work, here / ARCHIVE)
