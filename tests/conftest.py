"""Fixtures every test directory shares: the ``krr`` command line in a subprocess or in
this process, a small config written to disk, small data sets, and the fault tests' run
(its data and config, a damaged byte, a tile's chunk file).

Stage tests run in process (``pipeline.run``, ``pipeline.cli.main``, ``krr_main``);
``krr_run`` is for what needs a process of its own: a kill (``tests/faultinject``), a
hang that a timeout must end, an exit status (a child forked from an interpreter that
imported the pipeline once, ``tests/_forkserver.py``); ``fresh_python`` for what needs a
new interpreter (what an import loads, a variable read at start).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from _forkserver import KrrForked, krr_forked, prestart
from _s3server import stop_servers

TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Compile the engine's numba loops once, before any worker starts: in xdist's
    controller (or in the one process of a run without xdist), never in a worker.

    numba caches a compiled loop next to its module (``pipeline.engine.compiled``), so every
    worker, ``krr`` child and Dask worker of the run then loads it in a fraction of a
    second. In a fresh checkout, as CI's, each of those processes compiled the loops itself
    until one had written the cache, a quarter of the first run's time
    (docs/PERFORMANCE.md#the-test-suite). ``pipeline.fit`` imports every module that
    compiles a loop, and :func:`pipeline.engine.compiled.warm_up` compiles each signature
    they registered (``tests/engine/test_compiled.py`` checks both)."""
    if hasattr(config, "workerinput"):
        return
    import pipeline.fit  # noqa: F401 (registers every compiled loop's warm-up)
    from pipeline.engine import compiled

    compiled.warm_up()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop this process's moto S3 server (``_s3server.moto_server``), if it started one."""
    stop_servers()


@pytest.fixture(scope="session")
def krr_run() -> KrrForked:
    """Run the ``krr`` command line in a process of its own: ``krr_run("status", run_dir)``,
    ``krr_run.run(conf, run_dir, "lambda=0.1", json=True, kill=("gram", 3))``.

    The one implementation of the command-line subprocess the tests use
    (:class:`_forkserver.KrrForked`): each command is a child forked from an interpreter
    that imported ``pipeline.cli`` once and ran nothing, so it is a process of its own
    (a pid to SIGKILL, its own exit status and output) without a new interpreter's 3-4 s
    of imports. The child gets this process's environment without any ``KRR_KILL*``
    variable (a kill is asked for explicitly), so a test never inherits another's
    injected fault. A test that needs a new interpreter itself uses ``fresh_python``."""
    prestart()
    return krr_forked


@contextlib.contextmanager
def _cli_state_restored() -> Iterator[None]:
    """Put back what ``pipeline.cli.main`` sets for its process: the root logger's
    handlers and the levels of the loggers it configures, the ``-v`` count, the progress
    mode (``-q``) and the SIGTERM handler (``main`` restores that one itself)."""
    from pipeline.cli import output as cli_output
    from pipeline.engine import progress

    names = ("", "krr", "pipeline", "distributed")
    levels = {n: logging.getLogger(n).level for n in names}
    handlers = list(logging.getLogger().handlers)
    mode, verbosity = progress._mode, cli_output._VERBOSITY
    try:
        yield
    finally:
        root = logging.getLogger()
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
        progress._mode, cli_output._VERBOSITY = mode, verbosity


@pytest.fixture(autouse=True)
def _cli_state_kept():
    """Every test leaves the logging and progress state as it found it: a test that calls
    ``pipeline.cli.main`` itself (not through :func:`krr_main`) sets the ``pipeline``
    logger to INFO with a stderr handler, and under pytest-xdist the tests that follow on
    that worker (the progress displays' lines) would inherit it."""
    with _cli_state_restored():
        yield


def _restore_environ(saved: Mapping[str, str]) -> None:
    """Make ``os.environ`` ``saved`` again. A local Dask cluster's nannies set
    ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` (1) and more in the
    process that starts them and leave them there: a child process started after an
    in-process run (``krr_run``) ran its BLAS on one thread, other last bits than a run
    of its own (the kill-and-resume comparisons failed on them)."""
    for k in set(os.environ) - set(saved):
        del os.environ[k]
    for k, v in saved.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


class KrrInProcess(KrrForked):
    """``krr ARGS...`` as ``pipeline.cli.main(ARGS)`` in this process, for a test that
    only checks what a command did or printed, or its exit code (no kill, no hang).

    Saves the 2-3 s start of a child process per command (the imports, a new Dask
    cluster's first tasks). Returns a CompletedProcess like ``krr_run``: the
    exit code ``main`` returned, and what it printed on stdout and stderr: its log lines
    (they go to whatever ``sys.stderr`` is) and, at the end, each Python warning once
    (also passed on to pytest). ``cwd`` and ``env`` hold for the call only, and so does
    whatever the command itself sets in ``os.environ``.
    """

    def __call__(
        self,
        *args: Any,
        cwd: str | os.PathLike | None = None,
        env: Mapping[str, str | None] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess:
        from pipeline import cli

        argv = [str(a) for a in args]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.ExitStack() as stack:
            stack.callback(_restore_environ, dict(os.environ))
            mp = stack.enter_context(pytest.MonkeyPatch.context())
            if cwd is not None:
                mp.chdir(cwd)
            for k, v in (env or {}).items():
                if v is None:
                    mp.delenv(k, raising=False)
                else:
                    mp.setenv(k, v)
            stack.enter_context(_cli_state_restored())
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("default")  # each warning once, as in a new process
            code = cli.main(argv)
        for w in caught:  # on stderr as a process prints them, and to pytest as warned
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        res = subprocess.CompletedProcess(["krr", *argv], code, out.getvalue(), err.getvalue())
        if check:
            assert res.returncode == 0, res.stderr[-3000:]
        return res


@pytest.fixture(scope="session")
def krr_main() -> KrrInProcess:
    """Run the ``krr`` command line in this process (``pipeline.cli.main``), with the
    calls of :func:`krr_run` less ``kill``/``inject``/``timeout``: ``krr_main.run(conf,
    run_dir, json=True)``."""
    return KrrInProcess()


@dataclass(frozen=True)
class SmallData:
    """A small regression problem saved as ``.npy`` files (and kept in memory)."""

    dir: Path
    X: np.ndarray
    y: np.ndarray
    X_new: np.ndarray

    @property
    def x_path(self) -> Path:
        return self.dir / "X.npy"

    @property
    def y_path(self) -> Path:
        return self.dir / "y.npy"

    @property
    def x_new_path(self) -> Path:
        return self.dir / "Xn.npy"


def make_small_data(dest: Path, n: int = 200, d: int = 4, n_new: int = 50, seed: int = 0):
    """``X`` standard normal (n, d), ``y = sin(X[:, 0]) + 0.1 noise``, new rows ``X_new``."""
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    X_new = rng.normal(size=(n_new, d))
    np.save(dest / "X.npy", X)
    np.save(dest / "y.npy", y)
    np.save(dest / "Xn.npy", X_new)
    return SmallData(dest, X, y, X_new)


@pytest.fixture
def small_data(tmp_path) -> SmallData:
    """200 x 4 training rows and 50 new rows in ``tmp_path/data`` (seed 0)."""
    return make_small_data(tmp_path / "data")


#: a small `krr run` config: Cholesky, tiles of 64, one in-process worker, no baseline
SMALL_CONFIG: dict[str, Any] = {
    "name": "small",
    "split": {"test_fraction": 0.25, "seed": 0},
    "preprocess": {"standardize": True, "standardize_y": False},
    "kernel": {"name": "rbf", "params": {"gamma": 0.3}},
    "lambda": 0.1,
    "solver": {"method": "cholesky"},
    "block_size": 64,
    "evaluate": {"baseline": "none"},
    "cluster": {"n_workers": 1, "processes": False, "memory_limit": "2GiB", "dashboard": False},
}


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def write_config(tmp_path):
    """``write_config(data=None, name="conf.yaml", dest=tmp_path, **sections) -> Path``.

    Writes :data:`SMALL_CONFIG` as YAML, its sections updated (nested mappings merged)
    by ``sections`` (``lambda`` is ``lam``); ``data`` (a :class:`SmallData`) fills
    ``data`` with its ``.npy`` paths. A string ``text`` is written as it is.
    """

    def write(
        data: SmallData | None = None,
        name: str = "conf.yaml",
        dest: Path | None = None,
        text: str | None = None,
        **sections: Any,
    ) -> Path:
        path = (dest or tmp_path) / name
        if text is not None:
            path.write_text(text)
            return path
        if "lam" in sections:
            sections["lambda"] = sections.pop("lam")
        conf = _merge(SMALL_CONFIG, sections)
        if data is not None:
            conf["data"] = {"source": "npy", "path": str(data.x_path), "y_path": str(data.y_path)}
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        return path

    return write


#: the scikit-learn diabetes data set's ``krr run`` config (332 training rows): Cholesky,
#: tiles of 128, one in-process worker (the command-line, model-load, table and plan tests)
DIABETES_CONFIG: dict[str, Any] = {
    "name": "small",
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25, "seed": 0},
    "preprocess": {"standardize": True, "standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "solver": {"method": "cholesky"},
    "block_size": 128,
    "cluster": {"n_workers": 1, "processes": False, "memory_limit": "1GiB", "dashboard": False},
}


@pytest.fixture
def diabetes_config(tmp_path):
    """``diabetes_config(file="small.yaml", dest=tmp_path, **sections) -> Path``: writes
    :data:`DIABETES_CONFIG` as YAML, its sections updated (nested mappings merged) by
    ``sections`` (``lambda`` is ``lam``; a new section goes last)."""

    def write(file: str = "small.yaml", dest: Path | None = None, **sections: Any) -> Path:
        if "lam" in sections:
            sections["lambda"] = sections.pop("lam")
        path = (dest or tmp_path) / file
        path.write_text(yaml.safe_dump(_merge(DIABETES_CONFIG, sections), sort_keys=False))
        return path

    return write


#: the repository root: first on a fresh interpreter's ``sys.path``
ROOT = TESTS.parent


def run_fresh_python(
    code: str, *args: Any, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS...`` in a new interpreter (text stdout and stderr), the
    repository root first on its PYTHONPATH and ``env`` added to this environment."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def fresh_python() -> Any:
    """``fresh_python(code, *args, env=None, timeout=300)``: run ``code`` in a new
    interpreter (what is imported at start, nothing this process loaded), as
    :func:`run_fresh_python`."""
    return run_fresh_python


def _run_results(run_dir: Path) -> dict[str, np.ndarray]:
    """A finished run directory's results to compare bitwise: the latest configuration's
    alpha (its model's ``dual_coef``) and every array of its prediction stores."""
    import zarr

    from pipeline.models.artifact import load_artifact
    from pipeline.stages.manifest import Manifest

    m = Manifest.load(run_dir)  # the latest configuration's results/<key>/{model,predict}
    out = {"alpha": np.asarray(load_artifact(m.stage_dir("model") / "model").dual_coef)}
    for store in sorted(m.stage_dir("predict").glob("*.zarr")):
        for name, arr in zarr.open_group(str(store), mode="r").arrays():
            out[f"{store.name}/{name}"] = arr[...]
    return out


@pytest.fixture(scope="session")
def run_results():
    """``run_results(run_dir)``: a finished run's alpha and predictions, by name."""
    return _run_results


#: the ``krr run`` config of the fault tests (kills, corruption, signals, a full disk, a
#: stalled store): a Cholesky solve of an RBF Gram in tiles of 100 on one in-process
#: worker; a test names the run and adds or drops sections (:meth:`FaultRun.config`)
FAULT_CONFIG: dict[str, Any] = {
    "split": {"test_fraction": 0.25, "seed": 0},
    "preprocess": {"standardize": True, "standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.2}},
    "lambda": 0.01,
    "solver": {"method": "cholesky"},
    "block_size": 100,
    "evaluate": {"baseline": "none"},
    "cluster": {"n_workers": 1, "processes": False, "memory_limit": "2GiB"},
}


class FaultRun:
    """The data and config files a fault test runs ``krr run`` on (the preamble each
    fault test used to write out itself)."""

    @staticmethod
    def data(
        dest: Path, n: int, d: int, seed: int, target=np.sin, n_new: int | None = None
    ) -> tuple[Path, Path, Path | None]:
        """Write ``X.npy`` (n, d standard normal), ``y.npy`` (``target(X[:, 0])`` plus 0.1
        noise) and, with ``n_new``, ``Xn.npy`` into ``dest``, drawn in that order from
        ``default_rng(seed)``; return their paths."""
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(n, d))
        np.save(dest / "X.npy", X)
        np.save(dest / "y.npy", target(X[:, 0]) + 0.1 * rng.normal(size=n))
        if n_new is None:
            return dest / "X.npy", dest / "y.npy", None
        np.save(dest / "Xn.npy", rng.normal(size=(n_new, d)))
        return dest / "X.npy", dest / "y.npy", dest / "Xn.npy"

    @staticmethod
    def config(
        dest: Path, name: str, x: Path, y: Path, xn: Path | None = None, **sections: Any
    ) -> Path:
        """Write ``dest/conf.yaml``: :data:`FAULT_CONFIG` named ``name`` on the ``.npy``
        files ``x`` and ``y`` (and ``predict.input`` ``xn``), its sections replaced by
        ``sections`` (``lambda`` is ``lam``; a section set to None is left out)."""
        if "lam" in sections:
            sections["lambda"] = sections.pop("lam")
        conf: dict[str, Any] = {
            "name": name,
            "data": {"source": "npy", "path": str(x), "y_path": str(y)},
        }
        for key, value in {**FAULT_CONFIG, **sections}.items():
            if value is not None:
                conf[key] = value
        if xn is not None:
            conf["predict"] = {"input": str(xn)}
        path = dest / "conf.yaml"
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        return path

    def __call__(
        self,
        dest: Path,
        name: str,
        n: int,
        d: int,
        seed: int,
        target=np.sin,
        n_new: int | None = None,
        **sections: Any,
    ) -> Path:
        """:meth:`data` then :meth:`config` in ``dest``; return the config's path."""
        x, y, xn = self.data(dest, n, d, seed, target, n_new)
        return self.config(dest, name, x, y, xn, **sections)


@pytest.fixture(scope="session")
def fault_run() -> FaultRun:
    """``fault_run(dest, "name", n, d, seed, target=np.sin, n_new=None, **sections)``:
    the data and config of a fault test's run; ``fault_run.config(...)`` writes the
    config alone (see :class:`FaultRun`)."""
    return FaultRun()


def flip_byte(path: Path, offset: int = 40) -> None:
    """Invert one byte of ``path`` in place (the same size): the byte at ``offset``, or
    the last one in a shorter file."""
    assert path.is_file(), path
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="session")
def flip() -> Any:
    """``flip(path, offset=40)``: damage a stored file by inverting one byte in place."""
    return flip_byte


def chunk_path(store: str | os.PathLike, name: str, i: int, j: int = 0) -> Path:
    """The Zarr v3 chunk file of tile ``(i, j)`` of array ``name`` in ``store`` (the
    default chunk key encoding, ``c/i/j``); it must exist."""
    path = Path(store) / name / "c" / str(i) / str(j)
    assert path.is_file(), sorted(str(p.relative_to(store)) for p in Path(store).rglob("c/*/*"))
    return path


@pytest.fixture(scope="session")
def chunk_file() -> Any:
    """``chunk_file(store, name, i, j=0)``: the path of a stored tile's chunk file."""
    return chunk_path
