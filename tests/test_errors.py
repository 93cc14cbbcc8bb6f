"""``pipeline.errors``: one exception class per condition, the old names kept, and the
``krr`` exit code of each.

Issue #43 ("one concept, one home"): "CG needs a positive semi-definite kernel" was two
types (``CGIndefiniteKernelError``, ``stages.solve.IndefiniteKernelError``) and two plain
``ValueError`` checks (``config``, ``out_of_core``); "unconverged" was three types
(``CGConvergenceError``, ``SolveNotConverged``, ``UnconvergedSolveError``). Each is one
class now, in :mod:`pipeline.errors`; the old names are the same objects, and a merged
class subclasses every base the merged ones had, so no ``except`` stops catching it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline import cli, errors
from pipeline.errors import IndefiniteKernelError, SolveNotConverged

ROOT = Path(pipeline.__file__).parent

#: condition -> (its one class, the old homes of its names, the bases catches relied on)
CONDITIONS = {
    "cg with an indefinite kernel": (
        IndefiniteKernelError,
        [
            ("pipeline.linalg.cg", "CGIndefiniteKernelError"),
            ("pipeline.stages.solve", "IndefiniteKernelError"),
        ],
        (ValueError,),
    ),
    "a solve did not converge": (
        SolveNotConverged,
        [
            ("pipeline.linalg.cg", "CGConvergenceError"),
            ("pipeline.stages.solve", "SolveNotConverged"),
            ("pipeline.models.selection.direct", "UnconvergedSolveError"),
        ],
        (RuntimeError,),
    ),
    "cg stagnated": (errors.CGStagnationError, [("pipeline.linalg.cg", "CGStagnationError")], ()),
    "cg diverged": (errors.CGDivergenceError, [("pipeline.linalg.cg", "CGDivergenceError")], ()),
    "cg stopped at max_iter (warning)": (
        errors.CGConvergenceWarning,
        [("pipeline.linalg.cg", "CGConvergenceWarning")],
        (UserWarning,),
    ),
    "tiles of a stored array are not there to be read": (
        errors.IncompleteArrayError,
        [
            ("pipeline.storage", "IncompleteArrayError"),
            ("pipeline.storage.errors", "IncompleteArrayError"),
            ("pipeline.errors", "MissingTileError"),
            ("pipeline.storage", "MissingTileError"),
            ("pipeline.storage.arrays", "MissingTileError"),
        ],
        (errors.CorruptTileError, ValueError),
    ),
    "a tile fails its checksum": (
        errors.CorruptTileError,
        [("pipeline.storage", "CorruptTileError"), ("pipeline.storage.arrays", "CorruptTileError")],
        (ValueError,),
    ),
    "a stored file fails its checksum": (
        errors.CorruptFileError,
        [("pipeline.storage", "CorruptFileError"), ("pipeline.storage.arrays", "CorruptFileError")],
        (errors.CorruptTileError, ValueError),
    ),
    "a store holds other inputs": (
        errors.StoreMismatchError,
        [
            ("pipeline.storage", "StoreMismatchError"),
            ("pipeline.storage.arrays", "StoreMismatchError"),
        ],
        (ValueError,),
    ),
    "a path holds what the pipeline did not create": (
        errors.ForeignPathError,
        [("pipeline.storage", "ForeignPathError"), ("pipeline.storage.errors", "ForeignPathError")],
        (ValueError,),
    ),
    "a completed tile rewritten": (
        errors.TileRewriteError,
        [("pipeline.storage", "TileRewriteError"), ("pipeline.storage.errors", "TileRewriteError")],
        (RuntimeError,),
    ),
    "an object store cannot be used": (
        errors.StoreUnreachable,
        [("pipeline.storage.location", "StoreUnreachable")],
        (OSError,),
    ),
    "a store cannot be written": (
        errors.StoreNotWritableError,
        [
            ("pipeline.linalg.gram", "StoreNotWritableError"),
            ("pipeline.linalg.gram", "StoreNotWritableError"),
        ],
        (ValueError, PermissionError),
    ),
    "too little memory in memory": (
        errors.InsufficientMemoryError,
        [("pipeline.linalg.dense_memory", "InsufficientMemoryError")],
        (MemoryError,),
    ),
    "K + lam I singular (warning)": (
        errors.SingularKernelWarning,
        [("pipeline.linalg.dense_dual", "SingularKernelWarning")],
        (UserWarning,),
    ),
    "an artifact cannot be loaded": (
        errors.ArtifactError,
        [("pipeline.models.artifact", "ArtifactError")],
        (ValueError,),
    ),
    "an optional package is missing": (
        errors.MissingExtraError,
        [("pipeline._optional", "MissingExtraError")],
        (ImportError,),
    ),
    "a GPU is asked for and missing": (
        errors.DeviceUnavailableError,
        [("pipeline.engine.backend", "DeviceUnavailableError")],
        (ValueError,),
    ),
    "a config does not load": (
        errors.ConfigError,
        [
            ("pipeline.stages.config_overrides", "ConfigError"),
            ("pipeline.stages.config", "ConfigError"),
        ],
        (ValueError,),
    ),
    "the data are not valid input": (
        errors.InputError,
        [("pipeline.stages.ingest", "InputError")],
        (ValueError,),
    ),
    "the data changed during ingest": (
        errors.SourceChanged,
        [("pipeline.stages.ingest", "SourceChanged")],
        (RuntimeError,),
    ),
    "a manifest cannot be read": (
        errors.ManifestError,
        [("pipeline.stages.manifest", "ManifestError")],
        (ValueError,),
    ),
    "a complete stage's output no longer verifies": (
        errors.DamagedOutput,
        [("pipeline.stages.verify", "DamagedOutput")],
        (ValueError,),
    ),
    "no space left where a tile is written (issue #44)": (
        errors.DiskFullError,
        [("pipeline.storage.rawchunks", "DiskFullError")],
        (OSError,),
    ),
    "stopped by SIGTERM (issue #44)": (
        errors.Terminated,
        [],
        (KeyboardInterrupt,),
    ),
    "K + shift I not positive definite": (
        errors.NotPositiveDefiniteError,
        [
            ("pipeline.linalg.cholesky_options", "NotPositiveDefiniteError"),
            ("pipeline.linalg.cholesky", "NotPositiveDefiniteError"),
        ],
        (ValueError,),
    ),
    "kernel values not finite": (
        errors.NonFiniteKernelError,
        [
            ("pipeline.kernels.base", "NonFiniteKernelError"),
            ("pipeline.linalg.cholesky_options", "NonFiniteKernelError"),
        ],
        (ValueError,),
    ),
    "too little disk for a factorisation": (
        errors.InsufficientDiskError,
        [("pipeline.linalg.cholesky_inplace", "InsufficientDiskError")],
        (OSError,),
    ),
    "a Gram tile replaced by an in-place factor": (
        errors.GramReplacedError,
        [("pipeline.linalg.cholesky_inplace", "GramReplacedError")],
        (ValueError,),
    ),
    "a stage failed": (
        errors.StageFailed,
        [("pipeline.stages.runner", "StageFailed"), ("pipeline.stages", "StageFailed")],
        (RuntimeError,),
    ),
    "a run directory holds another run": (
        errors.RunDirConflict,
        [("pipeline.stages.runner", "RunDirConflict"), ("pipeline.stages", "RunDirConflict")],
        (ValueError,),
    ),
    "a run directory is locked": (
        errors.LockHeldError,
        [
            ("pipeline.stages.lock", "LockHeldError"),
            ("pipeline.stages", "LockHeldError"),
            ("pipeline.storage.lease", "LockHeldError"),
        ],
        (RuntimeError,),
    ),
    "a run directory cannot be used": (
        errors.RunDirUnusable,
        [("pipeline.stages.lock", "RunDirUnusable")],
        (OSError,),
    ),
    "a command-line error with its exit code": (
        errors.CliError,
        [("pipeline.cli.errors", "CliError"), ("pipeline.cli", "CliError")],
        (Exception,),
    ),
    "a command line argparse refuses": (
        errors.UsageError,
        [("pipeline.cli.args", "UsageError")],
        (Exception,),
    ),
}

#: exception classes still defined outside pipeline.errors (emptied: issue #43 moved the last
#: ten here, CliError and UsageError included)
PENDING: dict[str, set[str]] = {}


def _exception_classes_defined_in_sources() -> dict[str, set[str]]:
    """module -> the exception/warning classes its source defines (by the AST: a class
    whose base is an exception class of the builtins, of pipeline.errors, or of the module)."""
    known = {n for n in dir(builtins) if n.endswith(("Error", "Exception", "Warning"))}
    known |= {"ConvergenceWarning", "Exception", "BaseException", "KeyboardInterrupt"}
    known |= set(errors.__all__)
    found: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        mod = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        mod = mod.removesuffix(".__init__")
        local: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", None)) for b in node.bases}
                if bases & (known | local):
                    local.add(node.name)
        if local:
            found[mod] = local
    return found


def test_every_exception_class_lives_in_pipeline_errors():
    found = _exception_classes_defined_in_sources()
    elsewhere = {m: c for m, c in found.items() if m != "pipeline.errors"}
    assert elsewhere == PENDING, "an exception class defined outside pipeline.errors"
    assert found["pipeline.errors"] == set(errors.__all__)


def test_errors_imports_nothing_from_pipeline():
    tree = ast.parse((ROOT / "errors.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("pipeline")
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("pipeline") for a in node.names)


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_one_class_per_condition_and_old_names_are_it(condition):
    cls, homes, bases = CONDITIONS[condition]
    assert cls.__module__ == "pipeline.errors" and cls.__name__ in errors.__all__
    assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"
    for module, name in homes:
        assert getattr(importlib.import_module(module), name) is cls, f"{module}.{name}"
    for base in bases:
        assert issubclass(cls, base), f"{cls.__name__} is not a {base.__name__}"


def test_conditions_are_distinct_classes():
    classes = [c for c, _, _ in CONDITIONS.values()]
    assert len(set(classes)) == len(classes)
    assert set(errors.__all__) == {c.__name__ for c in classes}


def test_merged_unconverged_types_catch_each_other():
    """``except CGConvergenceError`` (refinement, CV paths) and ``except SolveNotConverged``
    (the CLI's hint) catch every form of the condition, stagnation and divergence too."""
    from pipeline.linalg.cg import CGConvergenceError, CGDivergenceError, CGStagnationError
    from pipeline.models.selection.direct import UnconvergedSolveError

    for exc in (UnconvergedSolveError("x"), CGStagnationError("x"), CGDivergenceError("x")):
        with pytest.raises(CGConvergenceError):
            raise exc
        assert isinstance(exc, SolveNotConverged | RuntimeError)


def test_config_refuses_cg_with_an_indefinite_kernel_as_the_one_type():
    """config.py raised a plain ValueError for this condition (pydantic keeps the error)."""
    from pydantic import ValidationError

    from pipeline.stages.config import RunConfig

    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(
            {
                "data": {"source": "sklearn", "name": "diabetes"},
                "kernel": {"name": "sigmoid"},
                "solver": {"method": "cg"},
            }
        )
    (err,) = info.value.errors()
    assert isinstance(err["ctx"]["error"], IndefiniteKernelError)
    assert "solver.method: 'cg' needs a positive semi-definite kernel" in err["msg"]


def test_out_of_core_refuses_cg_with_an_indefinite_kernel_as_the_one_type(tmp_path):
    """The out-of-core fit (then pipeline/out_of_core.py) raised a plain ValueError for
    this condition."""
    from pipeline.fit import fit_out_of_core
    from pipeline.kernels import make_kernel

    X, y = np.zeros((8, 2)), np.zeros(8)
    with pytest.raises(IndefiniteKernelError, match="solver='cg' needs a positive semi-def"):
        fit_out_of_core(X, y, make_kernel("sigmoid"), 1.0, store=str(tmp_path), solver="cg")


# ---------------------------------------------------------------------------
# exit codes: every condition's `krr run` exit code, pinned (the same as before the merge)

SMALL = """
name: small
data: {source: sklearn, name: diabetes}
kernel: {name: rbf, params: {gamma: 0.05}}
solver: {method: cholesky}
cluster: {n_workers: 1, processes: false, memory_limit: 1GiB, dashboard: false}
"""

_CONFIG_HINT = "change the config as said above, then rerun (the stages before it are kept)"
_RERUN_HINT = "rerun the same command to resume"


def old(module: str, name: str, *args):
    """A maker of ``name`` from its old home: the table also runs on the code before
    the merge (where pipeline.errors did not exist), which gave the same codes."""

    def make():
        return getattr(importlib.import_module(module), name)(*args)

    make.__name__ = name
    return make


def raised(what: str):
    """A maker of the error a CV solver raises for ``K + 0.5 I`` not positive definite:
    ``"band"`` (band Cholesky) or ``"eigen"`` (smallest eigenvalue); the real call, so the
    pin also runs on the code before issue #43 (a plain ValueError there)."""

    def make():
        K = -np.eye(5)
        try:
            if what == "band":
                from pipeline.linalg.band import band_reduce

                band_reduce(K).solve(np.ones(5), [0.5])
            else:
                from pipeline.models.selection.eigen import eigendecompose

                eigendecompose(K, np.ones((5, 1))).dual_coef(0.5)
        except ValueError as e:
            return e
        raise AssertionError(f"{what}: no error")

    make.__name__ = f"{what}-not-positive-definite"
    return make


_CV_HINT = "change the cv section as said above (a rerun cannot help), then rerun"
_NOT_PD = ((0, 0), 3, 2, 1e-3, "sklearn", 1e-3)
_SOLVE, _INGEST, _STORAGE = "pipeline.stages.solve", "pipeline.stages.ingest", "pipeline.storage"
_EXIT_2, _EXIT_3, _EXIT_4 = cli.EXIT_BAD_CONFIG, cli.EXIT_BAD_INPUT, cli.EXIT_STAGE_FAILED

#: (stage, a maker of the cause the stage raised) -> (exit code, the hint after the message)
STAGE_PINS = [
    ("solve", old(_SOLVE, "SolveNotConverged", "x"), _EXIT_4, _CONFIG_HINT),
    ("solve", old(_SOLVE, "IndefiniteKernelError", "x"), _EXIT_4, _CONFIG_HINT),
    ("solve", old("pipeline.kernels.base", "NonFiniteKernelError", "x"), _EXIT_4, _CONFIG_HINT),
    (
        "solve",
        old(
            "pipeline.linalg.cholesky_options",
            "NotPositiveDefiniteError",
            (0, 0),
            3,
            2,
            1e-3,
            "sklearn",
            1e-3,
        ),
        _EXIT_4,
        _RERUN_HINT,
    ),  # fmt: skip
    (
        "solve",
        old("pipeline.linalg.cholesky_inplace", "InsufficientDiskError", "/tmp", 10, 1, "it"),
        _EXIT_4,
        _RERUN_HINT,
    ),
    ("solve", old("pipeline.linalg.cholesky_inplace", "GramReplacedError", "x"), 4, _RERUN_HINT),
    ("ingest", old(_INGEST, "InputError", "x"), _EXIT_3, None),
    ("gram", old(_INGEST, "InputError", "x"), _EXIT_3, None),
    ("ingest", old(_INGEST, "SourceChanged", "x"), _EXIT_4, _RERUN_HINT),
    ("ingest", old(_STORAGE, "StoreMismatchError", "x"), _EXIT_3, None),
    ("ingest", old("builtins", "FileNotFoundError", "x"), _EXIT_3, None),
    ("predict", old("pipeline.models.artifact", "ArtifactError", "x"), _EXIT_3, None),
    ("solve", old("pipeline._optional", "MissingExtraError", "x", "s3"), _EXIT_2, None),
    ("select", old("builtins", "ValueError", "x"), _EXIT_2, None),
    ("select", old(_SOLVE, "IndefiniteKernelError", "x"), _EXIT_4, _CONFIG_HINT),
    ("select", old("pipeline.models.selection.direct", "UnconvergedSolveError", "x"), 4, None),
    ("select", raised("band"), _EXIT_2, _CV_HINT),
    ("select", raised("eigen"), _EXIT_2, _CV_HINT),
    (
        "select",
        old("pipeline.linalg.cholesky_options", "NotPositiveDefiniteError", *_NOT_PD),
        _EXIT_4,
        _RERUN_HINT,
    ),
    ("gram", old(_STORAGE, "CorruptTileError", "s", "gram", (0, 0), 1, 2), _EXIT_4, _RERUN_HINT),
    ("gram", old(_STORAGE, "MissingTileError", "s", "gram", (0, 0), "none"), 4, _RERUN_HINT),
    ("gram", old(_STORAGE, "IncompleteArrayError", "s", "gram", [(0, 0)]), 4, _RERUN_HINT),
    ("gram", old(_STORAGE, "TileRewriteError", "s", "gram", (0, 0)), _EXIT_4, _RERUN_HINT),
    ("gram", old("pipeline.linalg.gram", "StoreNotWritableError", "x"), _EXIT_4, _RERUN_HINT),
    ("gram", old(_STORAGE, "ForeignPathError", "p", "a file"), _EXIT_4, _RERUN_HINT),
    (
        "evaluate",
        old("pipeline.linalg.dense_memory", "InsufficientMemoryError", "x"),
        4,
        _RERUN_HINT,
    ),
    ("model", old("pipeline.stages.verify", "DamagedOutput", "x"), _EXIT_4, _RERUN_HINT),
    ("solve", old("pipeline.linalg.cg", "CGConvergenceError", "x"), _EXIT_4, None),
    ("solve", old("pipeline.linalg.cg", "CGStagnationError", "x"), _EXIT_4, None),
    ("solve", old("pipeline.linalg.cg", "CGIndefiniteKernelError", "x"), _EXIT_4, None),
]


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SMALL)
    return p


def _krr_run(monkeypatch, small, tmp_path, raise_in_run_stages):
    import pipeline.stages as stages

    monkeypatch.setattr(stages, "run_stages", raise_in_run_stages)
    return cli.main(["run", str(small), "--run-dir", str(tmp_path / "run")])


@pytest.mark.parametrize(
    ("stage", "make", "code", "hint"),
    STAGE_PINS,
    ids=[f"{s}-{m.__name__}" for s, m, _, _ in STAGE_PINS],
)
def test_stage_failure_exit_code_is_pinned(
    monkeypatch, small, tmp_path, capsys, stage, make, code, hint
):
    from pipeline.stages import StageFailed

    def fail(*a, **k):
        cause = make()
        raise StageFailed(stage, cause) from cause

    assert _krr_run(monkeypatch, small, tmp_path, fail) == code
    err = capsys.readouterr().err
    assert f"stage {stage!r} failed: " in err
    if hint is not None:
        assert err.rstrip().endswith(hint)


@pytest.mark.parametrize("name", ["CGConvergenceError", "CGStagnationError", "CGDivergenceError"])
def test_every_form_of_unconverged_gets_the_same_exit_and_hint(
    monkeypatch, small, tmp_path, capsys, name
):
    """One condition, one hint: a rerun cannot help a deterministic solve that stopped short."""
    from pipeline.linalg import cg
    from pipeline.stages import StageFailed

    def fail(*a, **k):
        cause = getattr(cg, name)("x")
        raise StageFailed("solve", cause) from cause

    assert _krr_run(monkeypatch, small, tmp_path, fail) == cli.EXIT_STAGE_FAILED
    assert capsys.readouterr().err.rstrip().endswith(_CONFIG_HINT)


def test_run_level_errors_exit_codes_are_pinned(monkeypatch, small, tmp_path):
    """Errors ``krr run`` maps outside a stage: run-dir conflict 2, damaged manifest 7,
    locked 5, unusable run dir 7, a config that does not load 2."""
    import pipeline.stages as stages
    from pipeline.stages.lock import LockHeldError, RunDirUnusable
    from pipeline.stages.manifest import ManifestError
    from pipeline.stages.runner import RunDirConflict

    def raising(exc):
        def f(*a, **k):
            raise exc

        return f

    assert _krr_run(monkeypatch, small, tmp_path, raising(RunDirConflict("x"))) == 2
    assert _krr_run(monkeypatch, small, tmp_path, raising(ManifestError("x"))) == 7
    for exc, code in ((LockHeldError(tmp_path, {"pid": 1}), 5), (RunDirUnusable("x"), 7)):

        class Lock:
            def __init__(self, run_dir):
                pass

            acquire = staticmethod(raising(exc))

        monkeypatch.setattr(stages, "RunLock", Lock)
        assert cli.main(["run", str(small), "--run-dir", str(tmp_path / "r2")]) == code
    assert cli.main(["validate", str(tmp_path / "missing.yaml")]) == cli.EXIT_BAD_CONFIG


def test_unreachable_store_exit_code_is_pinned(monkeypatch, small):
    from pipeline.cli import errors as cli_errors
    from pipeline.stages.config import load_config
    from pipeline.storage import location

    def unreachable(self, create_bucket=False, **kw):
        raise location.StoreUnreachable("no such bucket")

    monkeypatch.setattr(location.Location, "check_usable", unreachable)
    monkeypatch.setattr(location, "set_storage_options", lambda *a: None)
    with pytest.raises(cli_errors.CliError) as info:
        cli_errors._check_store("s3://bucket/run", load_config(str(small), []))
    assert info.value.code == cli.EXIT_RUN_DIR == 7


def test_pickled_errors_keep_their_class():
    """Instances cross Dask workers: the merged classes pickle by their one home."""
    import pickle

    for exc in (
        errors.IncompleteArrayError("s", "gram", [(1, 0)], 3),
        errors.MissingTileError("s", "gram", (1, 0), "no record"),
        errors.CorruptFileError("/x/alpha.npy", 1, 2),
        SolveNotConverged("x"),
        errors.NotPositiveDefiniteError((1, 1), 3, 66, 1e-3, "sklearn", 1e-3, (1e-10,)),
        errors.NotPositiveDefiniteError.of_shift(0.5, "K + 0.5 I is not positive definite"),
        errors.InsufficientDiskError("/tmp", 10, 1, "the factor"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


def test_tiles_not_there_is_one_class_with_both_messages():
    """``MissingTileError`` (a verified read's block that cannot be verified) and
    ``IncompleteArrayError`` (tiles a consumer found without completion records) were two
    classes for one condition; one class now, each form's message unchanged, and the
    runner still tells the forms apart (unmark one block; or let the owner compute tiles)."""
    from pipeline.stages.recovery import names_tiles_without_records
    from pipeline.storage import IncompleteArrayError, MissingTileError

    block = MissingTileError("s", "gram", (1, 0), "it has no completion record")
    tiles = IncompleteArrayError("s", "gram", [(1, 0), (0, 0)], 3)
    assert type(block) is type(tiles)
    assert str(block) == (
        "block (1, 0) of array 'gram' in store 's' cannot be verified: it has no completion "
        "record. Recompute it (remove its marker, if any, and rerun the step that wrote the "
        "array); `krr run` does this by itself when the store belongs to one of its stages."
    )
    assert str(tiles) == (
        "array 'gram' in store 's' is incomplete: 2 of 3 tiles have no completion record "
        "(first: [(0, 0), (1, 0)]); rerun the step that builds it (`krr run` does this by "
        "itself when the store belongs to one of its stages)"
    )
    assert str(IncompleteArrayError("s", "x", (), message="no stored array")) == "no stored array"
    assert (block.tile, block.missing, block.reason) == ((1, 0), ((1, 0),), block.problem)
    assert (tiles.tile, tiles.missing, tiles.n_tiles) == (None, ((0, 0), (1, 0)), 3)
    assert not names_tiles_without_records(block) and names_tiles_without_records(tiles)
