"""Every fingerprint recipe the package records, pinned byte for byte (issue #43).

A fingerprint names what a stored result was computed from; a run directory, an
estimator's ``store`` or a CV checkpoint is resumed only when the fingerprint
recomputed now equals the recorded one. A recipe that changes (another key, another
order, another rounding of a parameter, another hash) silently turns every existing
store into a recomputation, or, worse, lets two different results share a name. So
each recipe below is evaluated on fixed, exactly representable inputs and compared
with the hex digest the code gave when the pins were written (2026-11-28, before the
redesign of issue #43 moved any module).

If a pin fails: the change moved an on-disk identity. Either undo it, or, when the
change is deliberate, say so in the changelog, bump what needs bumping, and record the
new digest here with the reason (as ``tests/contracts/test_stage_fingerprint_pins.py``
does for the stage fingerprints, which it pins; they are not repeated here).

Inputs: ``X`` is 8 x 3 with entries k/8 (exact in binary), ``y`` is (k - 4)/4, the
kernel RBF(gamma=0.5), lambda 0.1, block size 4, unless a pin says otherwise.
"""

from __future__ import annotations

import hashlib
import json

import dask.array as da
import numpy as np
import pytest

from pipeline.kernels import (
    RBF,
    Constant,
    Laplacian,
    Linear,
    Polynomial,
    kernel_fingerprint,
    make_kernel,
)
from pipeline.storage import fingerprint_blocks, fingerprint_obj, open_tiled_array

X = np.arange(24, dtype=np.float64).reshape(8, 3) / 8.0
Y = (np.arange(8, dtype=np.float64) - 4.0) / 4.0
KERNEL = RBF(gamma=0.5)
LAM = 0.1
BLOCK = 4
#: a stand-in for an upstream fingerprint (the recipes chain fingerprints as strings)
FP = "0123456789abcdef0123456789abcdef"

#: recorded from the code of 2026-11-28 (commit f280298)
PINS: dict[str, str] = {
    # fingerprint_obj of a dict with nested lists, a tuple, None, NumPy scalars
    "obj": "34bafcf5818ecb21a5a5a5de36ee6f7a",
    # fingerprint_obj("abc")
    "obj_str": "d2aafd907802109a7abbb70d452a9cee",
    # fingerprint_obj([FP, "X_train"]): the ingest arrays' recipe
    "obj_list": "ba4398ea1c17a84d38b69b9e6e4291cf",
    # fingerprint_blocks of X (float64, 8 x 3), any row split
    "blocks_X": "bedbc98c1f7c382901641f24d9ddb9c6",
    # X as float32
    "blocks_X32": "002906ac910205ea5ba95a4e7338e914",
    # y, 1-D
    "blocks_y": "34a368409f0ef0db8bd5489857bf8bae",
    # y as one column
    "blocks_y2d": "c7962a9a2b85a2678b8ab9bed5ca1b14",
    # RBF(gamma=0.5), also by name and by spec
    "kernel_rbf": "kernel-f15bc4511fd68534f8df7061828d11b4ebbbbd8ecc67f1d8586f797ef6f57a0e",
    # RBF(length_scale=2.0)
    "kernel_rbf_ls": "kernel-d8236a4f6ed729868e86af541ce60d2b8d3a58c3d1829b2dea17299ee399df2e",
    # Laplacian(gamma=0.25)
    "kernel_laplacian": "kernel-e0e003e9c5b4cb1db192c44ac3d19f5c01b99e4f9316544330497dd2a1d02d11",
    # Linear()
    "kernel_linear": "kernel-6dd018fa263cfbb9f6586455a9311ef6a71a1ade060b71d86e93747f5ea169b6",
    # Polynomial(degree=2, gamma=0.5, coef0=1.0)
    "kernel_poly": "kernel-f97b456b32665762afcb5094f166afde4f48eb1c5f07dde8a6eea35d06741627",
    # Constant(2.0)
    "kernel_constant": "kernel-348caf5c028174aa6001b0a313a83ac72bb654179ef1522d215aed50ca0df29a",
    # 2.0 * RBF(gamma=0.5) + Linear()
    "kernel_sum_scaled": "kernel-7d145baf4937c55ea600a7428976e4df5f1d53a799bcadb7c03da1fa2d46e7b2",
    # RBF(gamma=0.5) * Polynomial(degree=3, gamma=1.0, coef0=0.0)
    "kernel_product": "kernel-048cda170d61f5a5eaa76c97a0f40a54d843103ccdf3787908d67a53977b77b2",
    # gram_fingerprint(X, RBF(0.5), block 4, float64): the stored Gram
    "gram": "888ce60cd42e507a0234c135a63d8932",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 50a3ba4bc2d27f6425c9a516d8127c5e
    # the same Gram stored as float32
    "gram_f32": "2060c796f6baf0fccb8b2d697b396309",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 58f2349f35cd46b616bb62be36cc3b3a
    # the fused engine's evaluation, kernel_dtype float64
    "gram_fused64": "888ce60cd42e507a0234c135a63d8932",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 50a3ba4bc2d27f6425c9a516d8127c5e
    # the fused engine's evaluation, kernel_dtype float32, float32 tiles
    "gram_fused32": "11cc6010e9886fd403aacd6d1d05a102",  # moved 2026-11-29 (session 35): the engine's float32 exp (vexp.EXP32_ID); was cafd07f60c598fe7e844568cb479b2e2
    # K(X, Z), Z's fingerprint FP
    "gram_cross": "430a2a8ef33ccd773bb364c4c1edbe70",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was ce52f10b930e73b182e3606dd4d67cb6
    # factor_fingerprint(gram FP, 0.1, sklearn, no jitter, float64)
    "factor": "1c018ef602d7b26b90cf92fdc512e498",
    # the same, n_samples convention
    "factor_n": "01313aa55e49378af67670ece829df06",
    # the same, float32 factor
    "factor_f32": "33bf4c247498c82b581ccb8cd2527f95",
    # the same, JitterPolicy() defaults
    "factor_jitter": "4d1e89edeba193116c53fafb41f4f626",
    # in_place_fingerprint of PINS["factor"] (keep_gram=False)
    "factor_in_place": "733b5d133e8ee73b5cebb9fcb6f907d2",
    # StoredKernelOperator(gram FP, shift 0.1)
    "op_stored": "d62ee9fc66784989bc1adc55576bcfd2",
    # MatrixFreeKernelOperator(X, RBF(0.5), shift 0.1), any block size
    "op_recompute": "b93301d3b8c40d159770f9fa140c060e",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 2423915ef3de21f2ed1ce41af342d7ee
    # the same, kernel_dtype float32
    "op_recompute_f32": "6ffe2819cb3c9da5667ce6335df43e9e",  # moved 2026-11-29 (session 35): the engine's float32 exp (vexp.EXP32_ID); was 25075f889a0060a96930af0d3e2f0ed3
    # IdentityPreconditioner
    "pre_none": "17661600b7003676c3d2683c9562101b",
    # JacobiPreconditioner(diag 1, shift 0.1)
    "pre_jacobi": "1677c362b9e1f4b2bccf3effc30acf18",
    # nystrom_fingerprint(0.1, rank 4, summary 2^-k, info less pivots, history, seconds)
    # moved 2026-11-28 (issue #43 item 2; was e28609d94d0f4e1baa053f15b8927492): one apply
    # of the Nystrom preconditioner, the Cholesky-form Woodbury, replaced the eigen form,
    # whose CG iterates differ in the last bits; the recipe names the apply (its "form"
    # key, NYSTROM_FORM) so that a CG checkpoint of the eigen form is never resumed with
    # it: such a run restarts its CG from iteration 0 (docs/UPGRADING.md)
    "pre_nystrom": "693774a529e35e2a5dc42c4a8ffe11d7",
    # cg_fingerprint(FP, "f" * 32, y, tol 1e-8)
    "cg": "310eb72c0a7318e66a97ffe1ed8a9f30",
    # the same with a mixed solve's extra keys
    "cg_extra": "61fbf7dba43791d7e90b497c2d068a22",
    # model_fingerprint(X, y / 2, RBF(0.5)), no preprocessing
    "model": "468c74b03dd98a5ffc3219177063b85d",
    # the same with a scaler
    "model_pre": "dde43b2f072945921a1939a688cfb657",
    # predict(X[:5], X, y / 2, RBF(0.5), out=..., model_fingerprint=FP)
    "predictions": "b07ae4435c2e0107bb3a4eba543701bf",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was dcc6b0bf9ac72a6fe6b1b10c2db768c0
    # KernelRidge(alpha=0.1, rbf, gamma=0.5, block_size=4, solver=cholesky): fit-<this>
    "store_cholesky": "2d6ee9a7b49bd34f3078",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was db1c8fd1fec894d081ae
    # its Gram (equals PINS["gram"])
    "store_cholesky_gram": "888ce60cd42e507a0234c135a63d8932",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 50a3ba4bc2d27f6425c9a516d8127c5e
    # its factor, attrs and markers
    "store_cholesky_chol": "b75c0b6cd6349ea88bf053a7f954d480",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was c8469abf8b0128bcae107f8582283b36
    # solver=cg, preconditioner=jacobi, matvec=recompute, tol=1e-10: fit-<this>
    "store_cg": "75bcf87390b00dcb47c9",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was e63755b2e19382c79f6d
    # its CG checkpoint marker
    "store_cg_state": "f734711909d0501c99f2a1493a43ce72",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 07eded4e41a33fe168869f5b3b44353b
    # the Cholesky fit with sample weights 1 + k/8
    "store_weighted": "91742ea13fa098bac03d",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was b75e4d345b46499371f5
    # configuration_key({solve: FP, model: m*32, predict: None, evaluate: e})
    "configuration": "f1ae8a5eeab34fe139813fdfcab7edd5",
    # SettingCheckpoint(cg, kfold, 2 folds).fingerprint(RBF(0.5), gamma 0.5, 3 lambdas)
    "cv_setting": "e62307ee5c7a56aaa5d446637a2de354",  # moved 2026-11-29 (session 35): the engine's float32 exp (vexp.EXP32_ID); was 9e0adad6cf9aee5964116d37d699b629
    # SettingCheckpoint.for_search(a search with tol 1e-6, kfold, 2 folds) per solver, the
    # same setting: cg and eigen as recorded before issue #43 item 4 (commit 891b9e2)
    "cv_search_cg": "f202ffba83529f6f7ab9b9c0c81696e2",  # moved 2026-11-29 (session 35): the engine's float32 exp (vexp.EXP32_ID); was 7b38472cd4d1600718e979a8c9f6aa1c
    "cv_search_eigen": "51eb314e58ef7efa7d3184c2ec0ee9a2",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 5499d643d84126a042b7da99cf008c88
    # moved 2026-11-28 (issue #43 item 4; was e253a22d4631fddb86674994df4190ad): the band
    # solver's routed CG preconditions its folds with the one fold form (FoldNystromBlock),
    # other rounding than the per-fold form it had, so its stored predictions' recipe is
    # version 2 (PREDICTIONS_RECIPE): settings stored before are recomputed, not mixed
    "cv_search_band": "650a76975a87532cb2ad75952180a079",  # moved 2026-11-29: the engine's float64 exp (vexp.EXP_ID); was 70b5d3e37572f9ae7b98559903ca8dad
    # path_identity of a file holding X's bytes (BLAKE2b-160)
    "data_file": "93d6bdf523b1b842b3e8b5b426fbf0b15b902107",
}


def _pin(name: str, got: str) -> None:
    assert got == PINS[name], f"fingerprint recipe {name!r} moved: {got} != {PINS[name]}"


# -- the two base recipes (pipeline.storage) -------------------------------------------


def test_fingerprint_obj_recipe():
    # key-sorted compact JSON, integral floats as ints, numpy scalars unwrapped, tuples as
    # lists, BLAKE2b-128: a dict, nested containers, None, str
    obj = {"b": 1.0, "a": [1, 2.5, np.float64(3.0), np.int64(4)], "c": None, "t": (1, "x")}
    _pin("obj", fingerprint_obj(obj))
    # the recipe spelled out: a NumPy float scalar is unwrapped but not made an int (a
    # quirk kept as it is: np.float64(3.0) is written 3.0, a Python 3.0 is written 3)
    text = '{"a":[1,2.5,3.0,4],"b":1,"c":null,"t":[1,"x"]}'
    assert hashlib.blake2b(text.encode(), digest_size=16).hexdigest() == PINS["obj"]
    assert (
        fingerprint_obj({"t": [1, "x"], "c": None, "a": [1.0, 2.5, 3.0, 4], "b": 1}) != PINS["obj"]
    )
    # a bare string and a list, the two other shapes the recipes hash
    _pin("obj_str", fingerprint_obj("abc"))
    _pin("obj_list", fingerprint_obj([FP, "X_train"]))


def test_fingerprint_blocks_recipe():
    # the bytes of the row blocks in order, then [n_rows, trailing shape, dtype.str]
    _pin("blocks_X", fingerprint_blocks([X]))
    assert fingerprint_blocks([X[:3], X[3:5], X[5:]]) == PINS["blocks_X"]  # split-free
    _pin("blocks_X32", fingerprint_blocks([X.astype(np.float32)]))  # the dtype enters
    _pin("blocks_y", fingerprint_blocks([Y]))  # 1-D
    _pin("blocks_y2d", fingerprint_blocks([Y[:, None]]))  # the trailing shape enters


def test_row_block_fingerprints_of_dask_arrays():
    # pipeline.engine.input_checks.fingerprint_row_blocks / validate_and_fingerprint and
    # pipeline.linalg.predict_source.input_fingerprint: fingerprint_blocks of the row blocks, any chunking
    from pipeline.engine.input_checks import fingerprint_row_blocks, validate_and_fingerprint
    from pipeline.linalg.predict_source import input_fingerprint

    a = da.from_array(X, chunks=(3, 3))
    b = da.from_array(X, chunks=(5, 3))
    assert fingerprint_row_blocks(a) == fingerprint_row_blocks(b) == PINS["blocks_X"]
    assert validate_and_fingerprint(a) == PINS["blocks_X"]
    assert input_fingerprint(b) == PINS["blocks_X"]


# -- kernels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kernel",
    [
        ("kernel_rbf", RBF(gamma=0.5)),
        ("kernel_rbf_ls", RBF(length_scale=2.0)),
        ("kernel_laplacian", Laplacian(gamma=0.25)),
        ("kernel_linear", Linear()),
        ("kernel_poly", Polynomial(degree=2, gamma=0.5, coef0=1.0)),
        ("kernel_constant", Constant(2.0)),
        ("kernel_sum_scaled", 2.0 * RBF(gamma=0.5) + Linear()),
        ("kernel_product", RBF(gamma=0.5) * Polynomial(degree=3, gamma=1.0, coef0=0.0)),
    ],
)
def test_kernel_fingerprint_recipe(name, kernel):
    # "kernel-" + SHA-256 of the key-sorted JSON of the spec annotated with each node's
    # module-qualified class
    _pin(name, kernel_fingerprint(kernel))


def test_kernel_fingerprint_of_names_and_specs():
    # the sklearn name and the spec give the object's fingerprint
    assert kernel_fingerprint(make_kernel("rbf", gamma=0.5)) == PINS["kernel_rbf"]
    assert kernel_fingerprint(make_kernel(KERNEL.to_spec())) == PINS["kernel_rbf"]


def test_kernel_identity_names_the_classes_modules():
    # what kernel_fingerprint hashes: the spec with each node's module-qualified class. A
    # kernel class moved to another module changes every Gram, factor and model
    # fingerprint made with it: a move must keep these strings
    from pipeline.kernels import kernel_identity

    rbf = {"name": "rbf", "params": {"gamma": 0.5, "length_scale": None},
           "class": "pipeline.kernels.basic.RBF"}  # fmt: skip
    assert kernel_identity(2.0 * RBF(gamma=0.5) + Linear()) == {
        "name": "sum",
        "params": {
            "k1": {"name": "scaled", "params": {"kernel": rbf, "weight": 2.0},
                   "class": "pipeline.kernels.compose.Scaled"},
            "k2": {"name": "linear", "params": {}, "class": "pipeline.kernels.basic.Linear"},
        },
        "class": "pipeline.kernels.compose.Sum",
    }  # fmt: skip
    paths = {
        type(k).__name__: kernel_identity(k)["class"]
        for k in (Laplacian(gamma=0.25), Polynomial(degree=2), Constant(2.0))
    }
    assert paths == {
        "Laplacian": "pipeline.kernels.basic.Laplacian",
        "Polynomial": "pipeline.kernels.basic.Polynomial",
        "Constant": "pipeline.kernels.basic.Constant",
    }


# -- the Gram, the factor, the operators, the preconditioners, CG --------------------------


def test_gram_fingerprint_recipe():
    from pipeline.linalg.gram import gram_fingerprint

    fx = fingerprint_blocks([X])
    # K(X, X) as the gram stage and KernelRidge store it: since 2026-11-28 (#43 item 3) the
    # fused evaluators' float64 values by default, the same recipe as gram_fused64
    assert PINS["gram"] == PINS["gram_fused64"]
    _pin("gram", gram_fingerprint(fx, KERNEL, BLOCK, "float64"))
    assert gram_fingerprint(fx, "rbf", BLOCK, np.float64) != PINS["gram"]  # gamma=None
    assert gram_fingerprint(fx, {"name": "rbf", "params": {"gamma": 0.5}}, 4, "f8") == PINS["gram"]
    _pin("gram_f32", gram_fingerprint(fx, KERNEL, BLOCK, "float32"))  # dtype=float32 runs
    # the fused engine's evaluation names its kernel dtype
    _pin("gram_fused64", gram_fingerprint(fx, KERNEL, BLOCK, "float64", kernel_dtype="float64"))
    _pin("gram_fused32", gram_fingerprint(fx, KERNEL, BLOCK, "float32", kernel_dtype="float32"))
    # K(X, Z): a cross Gram
    _pin("gram_cross", gram_fingerprint(fx, KERNEL, BLOCK, "float64", z_fingerprint=FP))


def _gram_handle(tmp_path, fp: str = FP, dtype=np.float64):
    return open_tiled_array(str(tmp_path / "g"), "gram", (8, 8), BLOCK, dtype, fp)


def test_factor_fingerprints(tmp_path):
    from pipeline.linalg.cholesky import JitterPolicy, factor_fingerprint
    from pipeline.linalg.cholesky_inplace import in_place_fingerprint

    g = _gram_handle(tmp_path)
    # the tile Cholesky of K + 0.1 I (sklearn convention), no jitter, float64 tiles
    _pin("factor", factor_fingerprint(g, LAM, "sklearn", None, np.float64))
    _pin("factor_n", factor_fingerprint(g, LAM, "n_samples", None, np.float64))
    _pin("factor_f32", factor_fingerprint(g, LAM, "sklearn", None, np.float32))
    _pin("factor_jitter", factor_fingerprint(g, LAM, "sklearn", JitterPolicy(), np.float64))
    # keep_gram=False: the factor written over the Gram's tiles
    _pin("factor_in_place", in_place_fingerprint(PINS["factor"]))


def test_operator_fingerprints(tmp_path):
    from pipeline.linalg.matvec import MatrixFreeKernelOperator, StoredKernelOperator

    g = _gram_handle(tmp_path)
    # matvec: stored (K read from the stored Gram) + 0.1 I
    _pin("op_stored", StoredKernelOperator(g, LAM, check_complete=False).fingerprint)
    # matvec: recompute (tiles from X), float64 and float32 kernel values
    _pin("op_recompute", MatrixFreeKernelOperator(X, KERNEL, LAM, block_size=BLOCK).fingerprint)
    again = MatrixFreeKernelOperator(X, KERNEL, LAM, block_size=3).fingerprint
    assert again == PINS["op_recompute"]  # tiling-free
    f32 = MatrixFreeKernelOperator(X, KERNEL, LAM, block_size=BLOCK, kernel_dtype="float32")
    _pin("op_recompute_f32", f32.fingerprint)


def test_preconditioner_fingerprints():
    from pipeline.linalg.precond import (
        IdentityPreconditioner,
        JacobiPreconditioner,
        nystrom_fingerprint,
    )

    _pin("pre_none", IdentityPreconditioner().fingerprint)
    # Jacobi on diag(K) = 1 (RBF) + 0.1
    _pin("pre_jacobi", JacobiPreconditioner(np.ones(8), LAM).fingerprint)
    # Nystrom: kind, apply form, shift, rank, the 8 leading values of the summary of F,
    # the build info less pivots
    eig = np.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625])
    info = {"method": "rpcholesky", "rank": 4, "pivots": [3, 1, 0, 2], "seed": 0}
    _pin("pre_nystrom", nystrom_fingerprint(LAM, 4, eig, info))
    # ... and less the (adaptive) build's history and its timing
    info32 = {**info, "history": [1, 2], "seconds": 0.5}
    assert nystrom_fingerprint(LAM, 4, eig, info32) == PINS["pre_nystrom"]


def test_cg_fingerprint_recipe():
    from pipeline.linalg.cg_checkpoint import cg_fingerprint

    # operator, preconditioner, y's content as a column, tol
    _pin("cg", cg_fingerprint(FP, "f" * 32, Y, 1e-8))
    assert cg_fingerprint(FP, "f" * 32, Y[:, None], 1e-8) == PINS["cg"]
    # a mixed-precision solve adds its own keys
    _pin("cg_extra", cg_fingerprint(FP, "f" * 32, Y, 1e-8, {"precision": "mixed", "low": FP}))


# -- models, predictions, stores of the estimator ----------------------------------------


def test_model_fingerprint_recipe():
    from pipeline.linalg.predict_model import model_fingerprint

    dual = Y / 2.0
    _pin("model", model_fingerprint(X, dual, KERNEL))
    pre = {"x_mean": np.zeros(3), "x_scale": np.ones(3), "y_mean": [0.5], "y_scale": [2.0]}
    _pin("model_pre", model_fingerprint(X, dual, KERNEL, pre))


def test_batch_prediction_fingerprint(tmp_path):
    # a prediction array's fingerprint: kind, model and input fingerprints, nan_policy, dtype
    import zarr

    from pipeline.linalg.blockwise import predict

    res = predict(
        X[:5], X, Y / 2.0, KERNEL, out=str(tmp_path / "p.zarr"), block_size=BLOCK,
        model_fingerprint=FP, progress=False,
    )  # fmt: skip
    _pin("predictions", res.fingerprint)
    stored = zarr.open_array(store=str(tmp_path / "p.zarr"), path="predictions", mode="r")
    assert stored.attrs["fingerprint"] == PINS["predictions"]
    assert stored.attrs["input_fingerprint"] == fingerprint_blocks([X[:5]])


def test_estimator_store_names_and_records(tmp_path):
    # KernelRidge(store=...) keeps each fit in store/fit-<20 hex of its identity>, the
    # identity being its parameters, the kernel's fingerprint and X's, y's and the
    # sample weights' content; and the arrays inside record their own fingerprints
    import zarr

    from pipeline import KernelRidge

    def fit(store, sample_weight=None, **kw):
        est = KernelRidge(alpha=LAM, kernel="rbf", gamma=0.5, block_size=BLOCK,
                          store=str(tmp_path / store), **kw)  # fmt: skip
        est.fit(X, Y, sample_weight=sample_weight)
        d = est.fit_info_["store"]
        assert d.startswith(str(tmp_path / store) + "/fit-")
        return d, d.rsplit("/fit-", 1)[1]

    d, name = fit("chol", solver="cholesky")
    _pin("store_cholesky", name)  # solver="cholesky", the Gram kept
    _pin(
        "store_cholesky_gram", zarr.open_array(store=d, path="gram", mode="r").attrs["fingerprint"]
    )
    chol = zarr.open_array(store=d, path="chol", mode="r").attrs["fingerprint"]
    _pin("store_cholesky_chol", chol)
    marker = json.loads((tmp_path / d / "_markers" / "chol" / "1.0").read_text())
    assert marker["fingerprint"] == chol

    # solver="cg", Jacobi, tiles recomputed from X: its checkpoint's marker
    d, name = fit("cg", solver="cg", preconditioner="jacobi", matvec="recompute", tol=1e-10)
    _pin("store_cg", name)
    markers = sorted(p.name for p in (tmp_path / d / "_markers").iterdir())
    assert markers == ["cg-cg"]
    state = json.loads((tmp_path / d / "_markers" / "cg-cg" / "state").read_text())
    _pin("store_cg_state", state["fingerprint"])

    # sample weights: their content enters the identity
    _, name = fit("w", sample_weight=1.0 + np.arange(8) / 8.0, solver="cholesky")
    _pin("store_weighted", name)


# -- run directories, CV checkpoints, data identity ----------------------------------------


def test_configuration_key_recipe():
    # results/<12 hex>: the per-configuration stages' fingerprints (None: a disabled stage)
    from pipeline.stages.results import configuration_key

    key = configuration_key({"solve": FP, "model": "m" * 32, "predict": None, "evaluate": "e"})
    _pin("configuration", key)


def test_cv_setting_checkpoint_fingerprint(tmp_path):
    # a KernelRidgeCV checkpoint's setting: the search's options, X, y, the folds, the
    # kernel, the setting's parameters and its lambdas
    from pipeline.models.selection.checkpoint import SettingCheckpoint

    splits = [(np.arange(4), np.arange(4, 8)), (np.arange(4, 8), np.arange(4))]
    base = {"solver": "cg", "kind": "kfold", "tol": repr(1e-6)}
    ck = SettingCheckpoint(str(tmp_path), base, X, Y, splits)
    _pin("cv_setting", ck.fingerprint(KERNEL, {"gamma": 0.5}, [0.01, 0.1, 1.0]))


@pytest.mark.parametrize("solver", ["cg", "eigen", "band"])
def test_cv_search_checkpoint_fingerprint(tmp_path, solver):
    # what a search records: its solver, kind and options (repr), plus the recipe version
    # of the solvers whose predictions' arithmetic moved (PREDICTIONS_RECIPE)
    import types

    from pipeline.models.selection.checkpoint import SettingCheckpoint

    splits = [(np.arange(4), np.arange(4, 8)), (np.arange(4, 8), np.arange(4))]
    cv = types.SimpleNamespace(checkpoint=str(tmp_path), tol=1e-6, screen_tol=None)
    ck = SettingCheckpoint.for_search(cv, solver, "kfold", X, Y, splits)
    _pin(f"cv_search_{solver}", ck.fingerprint(KERNEL, {"gamma": 0.5}, [0.01, 0.1, 1.0]))


def test_data_file_identity(tmp_path):
    # a local data file up to 1 GiB: its size and the BLAKE2b-160 of its bytes, not its path
    from pipeline.stages.source_identity import path_identity

    p = tmp_path / "X.bin"
    p.write_bytes(X.tobytes())
    ident = path_identity(str(p))
    assert set(ident) == {"bytes", "files", "blake2b"}
    assert (ident["bytes"], ident["files"]) == (192, 1)
    _pin("data_file", ident["blake2b"])
