"""The on-disk format, pinned (issue #43): what a run directory, an estimator's store and
a model artifact hold, and that those written by the code of 2026-11-28 still load and
resume.

- The relative paths written (array names, marker paths, manifest, latest.json, model
  artifact), the Zarr metadata that matters (shape, chunks, dtype, codecs, fill value,
  the attribute keys), the keys of markers, manifest records, latest.json and the
  artifact's JSON: literal tables below, recorded from that code.
- ``run_fixture/run`` and ``artifact_fixture/model`` (packed in ``data/fixtures.tar.gz``,
  unpacked by the ``fixtures`` fixture) were written by that code
  (``data/make_fixtures.py``): a copy of the run directory is resumed with nothing
  recomputed, by ``krr run`` and by :func:`pipeline.run`, and the artifact loads and
  predicts what it predicted then. A fresh run writes every ``zarr.json`` of the
  committed run exactly (fingerprints and attributes included).

If a pin here fails, the change moved the on-disk format: existing run directories or
models would no longer resume or load as they did. Undo it, or make the change
deliberate (a format version, a migration, a changelog entry) and record it here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import cli

DATA = Path(__file__).resolve().parent / "data"

sys.path.insert(0, str(DATA))
from make_fixtures import ARCHIVE, RUN_CONFIG, RUN_OVERRIDES, artifact_data, unpack  # noqa: E402

STAGES = ["ingest", "gram", "solve", "model", "predict", "evaluate"]
KEY = "57334a041263"  # results/<key>: the configuration key of RUN_CONFIG

#: every file of RUN_CONFIG's run directory (lock file aside), relative to it.
#: plan.json (added 2026-11-28, issue #43): the fit plan, a recorded node computed once
#: per configuration (pipeline.stages.runner.node_output); the committed run predates it
#: and records it when it is first resumed
RUN_FILES = sorted(
    [
        "latest.json",
        "manifest.json",
        "plan.json",
        *[f"gram/gram.zarr/{p}" for p in ["zarr.json", "gram/zarr.json"]],
        *[f"gram/gram.zarr/gram/c/{t}" for t in ["0/0", "1/0", "1/1", "2/0", "2/1", "2/2"]],
        *[f"gram/gram.zarr/_markers/gram/{t}" for t in ["0.0", "1.0", "1.1", "2.0", "2.1", "2.2"]],
        "ingest/data.zarr/zarr.json",
        *[f"ingest/data.zarr/{a}/zarr.json" for a in ["X_train", "y_train", "X_test", "y_test"]],
        *[f"ingest/data.zarr/{a}/c/{i}/0" for a in ["X_train", "y_train"] for i in range(3)],
        *[f"ingest/data.zarr/{a}/c/0/0" for a in ["X_test", "y_test"]],
        *[f"ingest/data.zarr/_markers/{a}/{i}.0" for a in ["X_train", "y_train"] for i in range(3)],
        *[f"ingest/data.zarr/_markers/{a}/0.0" for a in ["X_test", "y_test"]],
        *[
            f"results/{KEY}/{p}"
            for p in [
                "solve/alpha.npy",
                "solve/factor.zarr/zarr.json",
                "solve/factor.zarr/chol/zarr.json",
                *[
                    f"solve/factor.zarr/chol/c/{t}"
                    for t in ["0/0", "1/0", "1/1", "2/0", "2/1", "2/2"]
                ],
                *[
                    f"solve/factor.zarr/_markers/chol/{t}"
                    for t in ["0.0", "1.0", "1.1", "2.0", "2.1", "2.2"]
                ],
                "model/model/zarr.json",
                "model/model/X_train/zarr.json",
                "model/model/X_train/c/0/0",
                "model/model/dual_coef/zarr.json",
                "model/model/dual_coef/c/0",
                "predict/predictions.zarr/zarr.json",
                "predict/predictions.zarr/test/zarr.json",
                "predict/predictions.zarr/test/c/0/0",
                "predict/predictions.zarr/_markers/test/0",
                "predict/batch.zarr/zarr.json",
                "predict/batch.zarr/predictions/zarr.json",
                "predict/batch.zarr/predictions/c/0/0",
                "predict/batch.zarr/_markers/predictions/0",
                "evaluate/metrics.json",
                "evaluate/y_pred.npy",
                "evaluate/y_true.npy",
            ]
        ],
    ]
)

_ROWS = ["block_size", "fingerprint"]
_PRED = ["block_size", "complete", "fingerprint", "input_fingerprint", "model_fingerprint",
         "nan_policy"]  # fmt: skip
#: array path -> (shape, chunk shape, dtype, codecs, fill value, attribute keys); a
#: group -> ("group", attribute keys). Every array is uncompressed ("bytes" alone),
#: little-endian, chunk keys "c/i/j".
#: what a fresh run records differently from the committed one since Gram tiles are
#: fused by default (2026-11-28): zarr.json path -> {attribute path: the fresh value}.
#: Moved again 2026-11-29: the fused evaluators' float64 exp is the engine's own
#: (pipeline.engine.vexp, EXP_ID in the Gram's fingerprint), so the Gram's bits, its
#: fingerprint and every identity chained to them moved once more; the α-chained values
#: were recorded on an AVX2 EPYC
_MODEL = f"results/{KEY}/model/model"
_PREDICT_DIR = f"results/{KEY}/predict"
MOVED_BY_FUSED_GRAM: dict[str, dict[tuple, object]] = {
    "gram/gram.zarr/gram": {
        ("attributes", "fingerprint"): "318faa1f021f729c3006f12bbeddf708",
        ("attributes", "kernel_dtype"): "float64",
    },
    f"results/{KEY}/solve/factor.zarr/chol": {
        ("attributes", "fingerprint"): "53b39b2864d03769f0443cbfe105b244",
        ("attributes", "gram_fingerprint"): "318faa1f021f729c3006f12bbeddf708",
    },
    _MODEL: {
        ("attributes", "krr_model", "arrays", "dual_coef", "checksum"): (
            "9a3cf466e8f7eb85811148a223122641"
        ),
        ("attributes", "krr_model", "fingerprints", "model"): "2a2299c44d4a6112d2d338129609be61",
    },
    f"{_PREDICT_DIR}/predictions.zarr/test": {
        ("attributes", "fingerprint"): "8f03a3b0907465755ef4d2d5e90306dc",
        ("attributes", "model_fingerprint"): "347125018fb313e5dc90c84454bfd7ce",
    },
    f"{_PREDICT_DIR}/batch.zarr/predictions": {
        ("attributes", "fingerprint"): "6ee3d50c6161e2ebb413393ef30fd13a",
        ("attributes", "model_fingerprint"): "347125018fb313e5dc90c84454bfd7ce",
    },
}


#: the values above that chain α's bits: α's last bits depend on the CPU (BLAS kernels,
#: vector exp; the pins were written on an Intel Xeon, and an AMD EPYC differs in the last
#: ulp). On another CPU they are checked by their recipe and α by its values instead
#: (assert_same_alpha); on the pins' CPU, bit for bit as the others.
_ALPHA = ("attributes", "krr_model", "arrays", "dual_coef", "checksum")
ALPHA_CHAINED = {
    (_MODEL, _ALPHA),
    (_MODEL, ("attributes", "krr_model", "fingerprints", "model")),
    (f"{_PREDICT_DIR}/predictions.zarr/test", ("attributes", "fingerprint")),
    (f"{_PREDICT_DIR}/predictions.zarr/test", ("attributes", "model_fingerprint")),
    (f"{_PREDICT_DIR}/batch.zarr/predictions", ("attributes", "fingerprint")),
    (f"{_PREDICT_DIR}/batch.zarr/predictions", ("attributes", "model_fingerprint")),
}


def assert_same_alpha(meta: dict, model_dir: Path, want_meta: dict, want_dir: Path) -> bool:
    """α as the committed model's, to the last bits the CPU allows; whether bit for bit.

    α's recorded checksum must be its stored bytes', its values the committed α's at
    1e-10 relative, and the model fingerprint the recipe's over them; X_train's checksum
    (data, not arithmetic) stays pinned bit for bit.
    """
    import zarr

    from pipeline.kernels.base import kernel_from_spec
    from pipeline.linalg.predict_model import model_fingerprint
    from pipeline.storage import fingerprint_blocks

    got = np.asarray(zarr.open_array(str(model_dir / "dual_coef"), mode="r")[...])
    committed = np.asarray(zarr.open_array(str(want_dir / "dual_coef"), mode="r")[...])
    assert meta["arrays"]["dual_coef"]["checksum"] == fingerprint_blocks([got])
    np.testing.assert_allclose(got, committed, rtol=1e-10, atol=1e-12 * np.abs(committed).max())
    assert sorted(meta["arrays"]) == sorted(want_meta["arrays"])
    for name in meta["arrays"]:
        keys = ("shape", "dtype") if name == "dual_coef" else ("shape", "dtype", "checksum")
        assert {k: meta["arrays"][name][k] for k in keys} == {
            k: want_meta["arrays"][name][k] for k in keys
        }, name
    X = np.asarray(zarr.open_array(str(model_dir / "X_train"), mode="r")[...])
    kernel = kernel_from_spec(meta["kernel"])
    assert meta["fingerprints"]["model"] == model_fingerprint(X, got, kernel, meta["preprocessing"])
    return bool(np.array_equal(got, committed))


def _get(doc: dict, path: tuple):
    for key in path:
        doc = doc[key]
    return doc


def _pop(doc: dict, path: tuple):
    for key in path[:-1]:
        doc = doc[key]
    return doc.pop(path[-1], None)


RUN_ARRAYS = {
    "gram/gram.zarr": ("group", []),
    "gram/gram.zarr/gram": (
        [36, 36], [16, 16], "float64", ["bytes"], 0.0,
        ["block_size", "fingerprint", "kernel", "kernel_dtype", "layout", "x_fingerprint"],
    ),
    "ingest/data.zarr": ("group", []),
    "ingest/data.zarr/X_train": ([36, 3], [16, 3], "float64", ["bytes"], 0.0, _ROWS),
    "ingest/data.zarr/y_train": ([36, 1], [16, 1], "float64", ["bytes"], 0.0, _ROWS),
    "ingest/data.zarr/X_test": ([12, 3], [12, 3], "float64", ["bytes"], 0.0, _ROWS),
    "ingest/data.zarr/y_test": ([12, 1], [12, 1], "float64", ["bytes"], 0.0, _ROWS),
    f"results/{KEY}/solve/factor.zarr": ("group", []),
    f"results/{KEY}/solve/factor.zarr/chol": (
        [36, 36], [16, 16], "float64", ["bytes"], 0.0,
        ["block_size", "convention", "fingerprint", "gram_fingerprint", "jitter_policy",
         "lambda", "layout", "shift"],
    ),
    f"results/{KEY}/model/model": ("group", ["krr_model"]),
    f"results/{KEY}/model/model/X_train": ([36, 3], [36, 3], "float64", ["bytes"], 0.0, []),
    f"results/{KEY}/model/model/dual_coef": ([36], [36], "float64", ["bytes"], 0.0, []),
    f"results/{KEY}/predict/predictions.zarr": ("group", []),
    f"results/{KEY}/predict/predictions.zarr/test": (
        [12, 1], [12, 1], "float64", ["bytes"], "NaN", _PRED,
    ),
    f"results/{KEY}/predict/batch.zarr": ("group", []),
    f"results/{KEY}/predict/batch.zarr/predictions": (
        [10, 1], [10, 1], "float64", ["bytes"], "NaN", _PRED,
    ),
}  # fmt: skip

#: marker directory -> the keys of each of its markers
RUN_MARKERS = {
    "gram/gram.zarr/_markers/gram": ["compute_s", "crc32c", "fingerprint", "pid", "run", "time"],
    **{
        f"ingest/data.zarr/_markers/{a}": ["crc32c", "fingerprint", "time"]
        for a in ["X_train", "y_train", "X_test", "y_test"]
    },
    f"results/{KEY}/solve/factor.zarr/_markers/chol": ["crc32c", "fingerprint", "seconds", "time"],
    **{
        f"results/{KEY}/predict/{s}/_markers/{a}": ["crc32c", "fingerprint", "pid", "rows", "time"]
        for s, a in [("predictions.zarr", "test"), ("batch.zarr", "predictions")]
    },
}

LATEST_KEYS = ["configuration", "dir", "fingerprint", "metrics", "model", "updated"]
MANIFEST_KEYS = ["config", "created", "identity", "latest", "results", "stages", "updated",
                 "version"]  # fmt: skip
STAGE_RECORD_KEYS = ["error", "fingerprint", "finished", "outputs", "resources", "started",
                     "status"]  # fmt: skip
RESULT_RECORD_KEYS = ["created", "dir", "fingerprint", "params", "stages", "updated"]
#: plan.json: {"node": "plan", "records": {fingerprint of the inputs: record}}
NODE_FILE_KEYS = ["node", "records"]
NODE_RECORD_KEYS = ["created", "inputs", "output"]
PLAN_INPUT_KEYS = ["n_features", "n_train", "solve", "x_fingerprint"]
PLAN_OUTPUT_KEYS = ["plan", "reason"]
#: the keys of each stage's outputs in the manifest (what downstream stages and resume read)
STAGE_OUTPUT_KEYS = {
    "ingest": ["X_test", "X_train", "block_size", "feature_names", "n_features", "n_outputs",
               "n_test", "n_train", "ordinal", "scaler", "store", "target_names",
               "x_fingerprint", "y_scaler", "y_test", "y_train"],
    "gram": ["block_size", "dtype", "fingerprint", "name", "shape", "store", "tiles"],
    "solve": ["alpha", "alpha_crc32c", "factor", "factor_dtype", "factor_tiles_computed",
              "jitter", "lam", "lam_convention", "method", "plan", "plan_reason", "shift"],
    "model": ["model_fingerprint", "path"],
    "predict": ["batch", "test"],
    "evaluate": ["heldout", "mean_baseline", "metrics", "n_test"],
}  # fmt: skip

#: a model artifact (KernelRidge.save, and the model stage's model/)
ARTIFACT_FILES = ["X_train/c/0/0", "X_train/zarr.json", "dual_coef/c/0", "dual_coef/zarr.json",
                  "zarr.json"]  # fmt: skip
ARTIFACT_META_KEYS = [
    "arrays", "complete", "created", "extra", "fingerprints", "format", "format_version",
    "kernel", "meta_checksum", "n_features", "n_outputs", "n_train", "package",
    "package_version", "preprocessing", "regularization", "regularization_convention",
    "x_train_ref",
]  # fmt: skip
ARTIFACT_EXTRA_KEYS = ["effective_alpha_", "estimator", "n_iter_", "params", "solver_"]
ESTIMATOR_PARAM_KEYS = [
    "alpha", "alpha_convention", "block_size", "cg_precision", "coef0", "degree",
    "factor_dtype", "gamma", "keep_gram", "kernel", "kernel_params", "matvec", "max_iter",
    "preconditioner", "progress", "random_state", "rank", "solver", "storage_options",
    "store", "tol",
]  # fmt: skip


def _files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != ".lock"
    )


def _arrays(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("zarr.json")):
        meta = json.loads(p.read_text())
        rel = p.parent.relative_to(root).as_posix()
        if meta["node_type"] == "group":
            out[rel] = ("group", sorted(meta["attributes"]))
            continue
        assert meta["zarr_format"] == 3 and meta["chunk_grid"]["name"] == "regular", rel
        assert meta["chunk_key_encoding"] == {
            "name": "default",
            "configuration": {"separator": "/"},
        }, rel
        codecs = meta["codecs"]
        assert all(c["configuration"] == {"endian": "little"} for c in codecs), rel
        out[rel] = (
            meta["shape"],
            meta["chunk_grid"]["configuration"]["chunk_shape"],
            meta["data_type"],
            [c["name"] for c in codecs],
            meta["fill_value"],
            sorted(meta["attributes"]),
        )
    return out


def _markers(root: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in sorted(root.rglob("_markers/*/*")):
        keys = sorted(json.loads(p.read_text()))
        prev = out.setdefault(p.parent.relative_to(root).as_posix(), keys)
        assert prev == keys, p
    return out


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    """The committed fixtures (``data/fixtures.tar.gz``), unpacked once for this module:
    ``run_fixture/`` and ``artifact_fixture/`` (tests copy before they change anything)."""
    return unpack(DATA / ARCHIVE, tmp_path_factory.mktemp("fixtures"))


def _copy_run_fixture(tmp_path: Path, fixtures: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(fixtures / "run_fixture", dest)
    return dest


def test_a_new_run_directory_has_the_pinned_layout(tmp_path, monkeypatch, fixtures):
    src = _copy_run_fixture(tmp_path, fixtures)
    work = tmp_path / "fresh"
    work.mkdir()
    for name in ("X.npy", "y.npy", "Xn.npy"):
        shutil.copy(src / name, work / name)
    monkeypatch.chdir(work)
    rep = pipeline.run(RUN_CONFIG, "run")
    assert rep.ran == STAGES and rep.configuration == KEY
    run = work / "run"
    assert _files(run) == RUN_FILES
    assert _arrays(run) == RUN_ARRAYS
    assert _markers(run) == RUN_MARKERS
    latest = json.loads((run / "latest.json").read_text())
    assert sorted(latest) == LATEST_KEYS
    assert latest["dir"] == f"results/{KEY}" and latest["model"] == f"results/{KEY}/model/model"
    man = json.loads((run / "manifest.json").read_text())
    assert sorted(man) == MANIFEST_KEYS and man["version"] == 1
    assert list(man["stages"]) == ["ingest", "select", *STAGES[1:]]
    for name, rec in man["stages"].items():
        assert sorted(rec) == STAGE_RECORD_KEYS, name
    assert {n: sorted(man["stages"][n]["outputs"]) for n in STAGES} == STAGE_OUTPUT_KEYS
    assert list(man["results"]) == [KEY] and man["latest"] == KEY
    assert sorted(man["results"][KEY]) == RESULT_RECORD_KEYS
    plan = json.loads((run / "plan.json").read_text())
    assert sorted(plan) == NODE_FILE_KEYS and plan["node"] == "plan"
    (rec,) = plan["records"].values()
    assert sorted(rec) == NODE_RECORD_KEYS
    assert sorted(rec["inputs"]) == PLAN_INPUT_KEYS and sorted(rec["output"]) == PLAN_OUTPUT_KEYS
    # the solve stage ran the recorded plan
    assert man["stages"]["solve"]["outputs"]["plan"] == rec["output"]["plan"]
    # paths inside the run directory are recorded relative to it
    assert man["stages"]["gram"]["outputs"]["store"] == "@run/gram/gram.zarr"
    assert man["stages"]["solve"]["outputs"]["alpha"] == f"@run/results/{KEY}/solve/alpha.npy"
    # every Zarr document equals the committed run's, fingerprints and attributes included
    # whether this CPU gives α the pins' bits (ALPHA_CHAINED)
    fresh_model = json.loads((run / _MODEL / "zarr.json").read_text())
    same_cpu = _get(fresh_model, _ALPHA) == MOVED_BY_FUSED_GRAM[_MODEL][_ALPHA]
    for rel in RUN_ARRAYS:
        got = json.loads((run / rel / "zarr.json").read_text())
        want = json.loads((src / "run" / rel / "zarr.json").read_text())
        for d in (got, want):  # zarr 3.1.2 writes an empty key that the newer ones omit
            if d.get("consolidated_metadata", 0) is None:
                del d["consolidated_metadata"]
        if rel.endswith("model/model"):  # the artifact's JSON records when it was made
            for d in (got, want):
                d["attributes"]["krr_model"].pop("created")
                d["attributes"]["krr_model"].pop("meta_checksum")
        if rel == _MODEL:
            assert_same_alpha(
                got["attributes"]["krr_model"], run / rel, want["attributes"]["krr_model"],
                src / "run" / rel,
            )  # fmt: skip
        for path, value in MOVED_BY_FUSED_GRAM.get(rel, {}).items():
            # the one deliberate change (issue #43 item 3): Gram tiles are evaluated by the
            # fused evaluators by default, so the Gram's bits and fingerprint moved, and with
            # them every identity that chains it (factor, alpha's checksum, model, predictions);
            # the committed run keeps its old Gram and resumes as it was
            fresh = _pop(got, path)
            if same_cpu or (rel, path) not in ALPHA_CHAINED:
                assert fresh == value, (rel, path)
            _pop(want, path)
        assert got == want, rel


def _fit_files(tmp_path: Path, **kw) -> tuple[Path, list[str]]:
    X, y, _ = artifact_data()
    est = pipeline.KernelRidge(alpha=0.1, kernel="rbf", gamma=0.5, block_size=16,
                               store=str(tmp_path / "store"), **kw).fit(X, y)  # fmt: skip
    d = Path(est.fit_info_["store"])
    assert d.parent == tmp_path / "store" and d.name.startswith("fit-") and len(d.name) == 24
    return d, _files(d)


_TILES = ["0/0", "1/0", "1/1", "2/0", "2/1", "2/2"]
_KEYS = ["0.0", "1.0", "1.1", "2.0", "2.1", "2.2"]


def test_an_estimator_store_has_the_pinned_layout(tmp_path):
    # solver="cholesky": the Gram and the factor, lower tiles, in store/fit-<20 hex>/
    d, files = _fit_files(tmp_path / "chol", solver="cholesky")
    assert files == sorted(
        # .fit-lock (added 2026-11-28, issue #44): the OS lock two identical fits share
        [".fit-lock", "zarr.json", "gram/zarr.json", "chol/zarr.json"]
        + [f"{a}/c/{t}" for a in ("gram", "chol") for t in _TILES]
        + [f"_markers/{a}/{k}" for a in ("gram", "chol") for k in _KEYS]
    )
    assert _arrays(d) == {
        ".": ("group", []),
        "gram": (
            [40, 40], [16, 16], "float64", ["bytes"], 0.0,
            ["block_size", "fingerprint", "kernel", "kernel_dtype", "layout", "x_fingerprint"],
        ),
        "chol": (
            [40, 40], [16, 16], "float64", ["bytes"], 0.0,
            ["block_size", "convention", "fingerprint", "gram_fingerprint", "jitter_policy",
             "lambda", "layout", "shift"],
        ),
    }  # fmt: skip
    assert _markers(d) == {
        "_markers/gram": ["compute_s", "crc32c", "fingerprint", "pid", "run", "time"],
        "_markers/chol": ["crc32c", "fingerprint", "seconds", "time"],
    }
    # solver="cg" with tiles recomputed from X: one checkpoint slot and its marker
    d, files = _fit_files(tmp_path / "cg", solver="cg", preconditioner="jacobi",
                          matvec="recompute", tol=1e-10)  # fmt: skip
    assert files == [".fit-lock", "_cg/cg/slot0.npz", "_markers/cg-cg/state"]
    state = json.loads((d / "_markers/cg-cg/state").read_text())
    assert sorted(state) == ["crc32c", "fingerprint", "iteration", "slot", "tiling", "time"]
    assert state["tiling"] == {"block_size": 16, "matvec": "recompute"}
    with np.load(d / "_cg/cg/slot0.npz") as slot:  # the CG state's arrays
        assert sorted(slot.files) == [
            "active",
            "b_norm",
            "history",
            "meta",
            "p",
            "r",
            "rz",
            "x",
            "z",
        ]


def test_a_cv_checkpoint_has_the_pinned_layout(tmp_path):
    # KernelRidgeCV(checkpoint=...): per setting, its predictions (p_<lambda>_<fold>) and
    # a JSON record written after them (its fingerprint: test_fingerprint_pins)
    X, y, _ = artifact_data()
    pipeline.KernelRidgeCV(alphas=[0.1, 1.0], kernel="rbf", param_grid={"gamma": [0.5, 1.0]},
                           cv=2, checkpoint=str(tmp_path / "ck")).fit(X, y)  # fmt: skip
    assert _files(tmp_path / "ck") == [
        "setting_000.json", "setting_000.npz", "setting_001.json", "setting_001.npz",
    ]  # fmt: skip
    rec = json.loads((tmp_path / "ck" / "setting_001.json").read_text())
    assert sorted(rec) == ["alphas", "crc32c", "fingerprint", "seconds", "setting"]
    assert rec["setting"] == {"gamma": "1.0"} and rec["alphas"] == [0.1, 1.0]
    with np.load(tmp_path / "ck" / "setting_001.npz") as data:
        assert sorted(data.files) == ["p_0_0", "p_0_1", "p_1_0", "p_1_1"]


def _artifact_meta(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())["attributes"]["krr_model"]


def test_a_saved_model_has_the_pinned_layout(tmp_path, fixtures):
    X, y, _ = artifact_data()
    est = pipeline.KernelRidge(alpha=0.1, kernel="rbf", gamma=0.5, solver="cholesky").fit(X, y)
    est.save(str(tmp_path / "model"))
    assert _files(tmp_path / "model") == ARTIFACT_FILES
    meta = _artifact_meta(tmp_path / "model")
    assert sorted(meta) == ARTIFACT_META_KEYS
    assert (meta["format"], meta["format_version"]) == ("krr-pipeline.model", 1)
    assert sorted(meta["extra"]) == ARTIFACT_EXTRA_KEYS
    assert sorted(meta["extra"]["params"]) == ESTIMATOR_PARAM_KEYS
    assert meta["extra"]["estimator"] == "pipeline.KernelRidge"
    assert sorted(meta["arrays"]) == ["X_train", "dual_coef"]
    assert all(sorted(r) == ["checksum", "dtype", "shape"] for r in meta["arrays"].values())
    assert sorted(meta["fingerprints"]) == ["chain", "model"]
    assert _arrays(tmp_path / "model") == {
        ".": ("group", ["krr_model"]),
        "X_train": ([40, 3], [40, 3], "float64", ["bytes"], 0.0, []),
        "dual_coef": ([40], [40], "float64", ["bytes"], 0.0, []),
    }
    # the same arrays, checksums and model fingerprint as the committed artifact (α's and
    # so the model's, bit for bit where the CPU gives the committed α's bits; ALPHA_CHAINED)
    want = _artifact_meta(fixtures / "artifact_fixture" / "model")
    if assert_same_alpha(meta, tmp_path / "model", want, fixtures / "artifact_fixture" / "model"):
        assert meta["arrays"] == want["arrays"] and meta["fingerprints"] == want["fingerprints"]
    assert meta["fingerprints"]["chain"] == want["fingerprints"]["chain"]
    for key in ("kernel", "regularization", "n_train", "preprocessing"):
        assert meta[key] == want[key], key


def test_the_committed_model_loads_and_predicts_as_it_did(fixtures):
    from pipeline.models.artifact import load_artifact

    X_new = np.load(fixtures / "artifact_fixture" / "X_new.npy")
    want = np.load(fixtures / "artifact_fixture" / "expected.npy")
    art = load_artifact(str(fixtures / "artifact_fixture" / "model"))
    np.testing.assert_allclose(art.predict(X_new, progress=False), want, rtol=1e-12, atol=1e-14)
    est = pipeline.load(fixtures / "artifact_fixture" / "model")
    np.testing.assert_allclose(est.predict(X_new), want, rtol=1e-12, atol=1e-14)
    # its checksum is the recipe's: fingerprint_obj of the metadata less these two keys
    from pipeline.storage import fingerprint_obj

    meta = _artifact_meta(fixtures / "artifact_fixture" / "model")
    body = {k: v for k, v in meta.items() if k not in ("meta_checksum", "complete")}
    assert fingerprint_obj(body) == meta["meta_checksum"] == "231d685938527b41ae08c8995d052c8e"


def _digests(root: Path) -> dict[str, str]:
    """Content hash of every file but the run's own records (manifest, latest, fit plan,
    log, lock)."""
    skip = {"manifest.json", "latest.json", "plan.json", "run.log"}
    return {
        rel: hashlib.sha256((root / rel).read_bytes()).hexdigest()
        for rel in _files(root)
        if rel not in skip
    }


def test_the_committed_run_directory_resumes_with_nothing_recomputed(
    tmp_path, monkeypatch, capsys, fixtures
):
    work = _copy_run_fixture(tmp_path, fixtures)
    before = _digests(work / "run")
    monkeypatch.chdir(work)
    # krr run, as typed in run_fixture/ (the data paths are overrides: relative)
    capsys.readouterr()
    assert cli.main(["run", "conf.yaml", *RUN_OVERRIDES, "--run-dir", "run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ran"] == [] and report["configuration"] == KEY
    # and pipeline.run with the mapping the run was made with
    rep = pipeline.run(RUN_CONFIG, "run")
    assert rep.ran == [] and rep.invalidated == [] and rep.skipped_done == STAGES
    assert _digests(work / "run") == before  # no array, marker or file was written again
    # the committed run predates plan.json: its first resume recorded its fit plan, once
    (rec,) = json.loads((work / "run" / "plan.json").read_text())["records"].values()
    assert rec["output"]["plan"]["solver"] == "cholesky"
    # its latest model predicts the batch it stored then
    model = pipeline.load(pipeline.latest_model("run"))
    assert Path(pipeline.latest_model("run")) == work / "run" / "results" / KEY / "model" / "model"
    got = model.predict(np.load("Xn.npy"))
    want = np.load("expected_batch.npy")
    np.testing.assert_allclose(np.ravel(got), np.ravel(want), rtol=1e-12, atol=1e-14)
    assert cli.main(["status", "run"]) == 0


@pytest.mark.parametrize("what", ["run", "artifact"])
def test_the_committed_fixtures_stay_small(what, fixtures):
    root = fixtures / f"{what}_fixture"
    assert sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) < 150_000
