"""Progress everywhere (issue #20 item 4): labelled displays with tiles done, rate and
ETA; the CG iteration and relative residual live; bars on a terminal, timestamped lines
elsewhere, nothing when off; the threaded scheduler through tqdm's Dask callback and a
cluster through the scheduler's progress feed; stdout (``--json``) untouched."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

from pipeline import KernelRidge
from pipeline.engine import progress, progress_dask
from pipeline.kernels import RBF
from pipeline.linalg.gram import build_gram
from pipeline.models.selection import KernelRidgeCV

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ")


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    """No progress mode set, and logging as a program that configured none has it (the
    root at WARNING, the package's loggers unset): whatever an earlier test in this
    process left configured, the displays below are what a plain script sees."""
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    progress.set_progress_mode(None)
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "pipeline"]
    loggers = [logging.getLogger(n) for n in names]
    saved = [(lg, lg.level) for lg in [logging.getLogger(), *loggers]]
    logging.getLogger().setLevel(logging.WARNING)
    for lg in loggers:
        lg.setLevel(logging.NOTSET)
    yield
    for lg, level in saved:
        lg.setLevel(level)
    progress.set_progress_mode(None)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4))
    return X, np.sin(X[:, 0]) + 0.1 * rng.standard_normal(300)


def _lines(err: str, label: str) -> list[str]:
    return [ln for ln in err.splitlines() if f" {label}: " in ln]


def test_fit_on_no_terminal_shows_timestamped_labelled_lines(data, tmp_path, capfd):
    X, y = data
    est = KernelRidge(
        alpha=1e-2, kernel="rbf", gamma=0.2, solver="cholesky", store=tmp_path / "s",
        block_size=64, progress=True,
    )  # fmt: skip
    est.fit(X, y)
    out, err = capfd.readouterr()
    assert out == ""  # progress never goes to stdout
    n_tiles = 5 * 6 // 2  # 300 rows in blocks of 64: 5 row blocks, 15 lower tiles
    gram, chol = _lines(err, "gram"), _lines(err, "cholesky")
    assert gram and chol, err
    for ln in gram + chol:
        assert STAMP.match(ln), ln
    # the tiles are counted (not the graph's other tasks), with a rate and how long it took
    assert f"gram: 0/{n_tiles} tiles (0%)" in gram[0]
    assert re.search(rf"gram: {n_tiles}/{n_tiles} tiles \(100%\), \S+ tiles/s, done in", gram[-1])
    assert f"cholesky: {n_tiles}/{n_tiles} tiles (100%)" in chol[-1]
    est.predict(X[:100])
    pred = _lines(capfd.readouterr().err, "predict")
    assert pred and "predict: 10/10 tiles (100%)" in pred[-1]  # 2 new x 5 training blocks


def test_cg_shows_iteration_and_relative_residual(data, tmp_path, capfd):
    X, y = data
    est = KernelRidge(
        alpha=1e-1, kernel="rbf", gamma=0.2, solver="cg", store=tmp_path / "s", block_size=64,
        preconditioner="jacobi", tol=1e-8, progress="lines",
    )  # fmt: skip
    est.fit(X, y)
    cg = _lines(capfd.readouterr().err, "cg")
    assert len(cg) >= 2 and all(STAMP.match(ln) for ln in cg), cg
    last = cg[-1]
    n = est.n_iter_
    assert n > 1
    assert re.search(rf"cg: {n}/{n} iterations \(100%\)", last), last
    m = re.search(r"residual (\S+) \(tol 1e-08\)", last)
    assert m, last
    assert float(m.group(1)) == pytest.approx(
        float(np.max(est.fit_info_["rel_residual"])), rel=0.01
    )
    assert float(m.group(1)) <= 1e-8


def test_off_and_default_estimators_show_nothing(data, tmp_path, capfd, monkeypatch):
    X, y = data
    kw = dict(alpha=1e-2, kernel="rbf", gamma=0.2, solver="cholesky", block_size=64)
    KernelRidge(**kw, store=tmp_path / "a").fit(X, y)  # scikit-learn style: silent by default
    KernelRidge(**kw, store=tmp_path / "b", progress="off").fit(X, y)
    monkeypatch.setenv(progress.ENV_VAR, "off")  # a kill switch, even for progress=True
    KernelRidge(**kw, store=tmp_path / "c", progress=True).fit(X, y)
    monkeypatch.delenv(progress.ENV_VAR)
    progress.set_progress_mode("off")  # what krr -q calls
    build_gram(X, RBF(gamma=0.2), tmp_path / "d", 64)  # library default progress=True
    out, err = capfd.readouterr()
    assert out == ""
    # log lines of other loggers (a krr main() run earlier in this process may have left
    # its stderr handler on the root logger) are not progress: drop them
    err = "\n".join(
        ln
        for ln in err.splitlines()
        if " INFO pipeline." not in ln or "pipeline.engine.progress" in ln
    )
    assert "gram" not in err and "cholesky" not in err and "tiles" not in err, err


def test_bad_modes_are_refused_naming_the_value(data, monkeypatch):
    X, y = data
    with pytest.raises(ValueError, match=r"progress must be True, False or one of .*'loud'"):
        KernelRidge(progress="loud").fit(X, y)
    with pytest.raises(ValueError, match=r"progress mode must be one of .*'loud'"):
        progress.set_progress_mode("loud")
    monkeypatch.setenv(progress.ENV_VAR, "loud")
    with pytest.raises(ValueError, match=r"environment variable KRR_PROGRESS .*'loud'"):
        progress.resolved_mode()


def test_terminal_gets_tqdm_bars_on_stderr(data, tmp_path, capfd, monkeypatch):
    X, _ = data
    monkeypatch.setattr(progress, "_stderr_is_tty", lambda: True)
    assert progress.resolved_mode()[0] == "bars"
    build_gram(X, RBF(gamma=0.2), tmp_path / "s", 64)
    out, err = capfd.readouterr()
    assert out == ""
    final = err.replace("\r", "\n").splitlines()
    assert any(re.match(r"gram: 100%\|.*\| 15/15 \[.*tile/s\]", ln) for ln in final), err


def test_jupyter_gets_widgets(monkeypatch):
    pytest.importorskip("ipywidgets")
    from tqdm.notebook import tqdm as notebook_tqdm

    monkeypatch.setattr(progress, "_in_notebook", lambda: True)
    assert progress.resolved_mode()[0] == "notebook"
    assert progress._tqdm_class(True) is notebook_tqdm
    progress.set_progress_mode("lines")
    assert progress.resolved_mode()[0] == "lines"


def _trackers(monkeypatch) -> list:
    seen: list = []
    init = progress_dask.DaskProgress.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append(self)

    monkeypatch.setattr(progress_dask.DaskProgress, "__init__", spy)
    return seen


def test_threaded_scheduler_uses_tqdm_dask_callback(data, tmp_path, capfd, monkeypatch):
    from tqdm.dask import TqdmCallback

    X, _ = data
    seen = _trackers(monkeypatch)
    progress.set_progress_mode("lines")
    build_gram(X, RBF(gamma=0.2), tmp_path / "s", 64)
    assert [t.used for t in seen] == ["callback"]
    assert issubclass(progress_dask._TILE_CALLBACK, TqdmCallback)
    gram = _lines(capfd.readouterr().err, "gram")
    assert "gram: 15/15 tiles (100%)" in gram[-1]


def test_distributed_client_uses_the_scheduler_feed(data, tmp_path, capfd, caplog, monkeypatch):
    from distributed import Client, LocalCluster

    from pipeline import constants as C

    X, _ = data
    seen = _trackers(monkeypatch)
    progress.set_progress_mode("lines")
    monkeypatch.setattr(C, "SMALL_PASS_ENTRIES", 0)  # the workers' path, not a small build here
    with (
        caplog.at_level(logging.ERROR),
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        g = build_gram(X, RBF(gamma=0.2), tmp_path / "s", 64)
    assert [t.used for t in seen] == ["distributed"]
    assert len(g.markers.done()) == 15
    gram = _lines(capfd.readouterr().err, "gram")
    assert "gram: 0/15 tiles (0%)" in gram[0] and "gram: 15/15 tiles (100%)" in gram[-1], gram
    # the scheduler's feed ended with the computation: nothing is cancelled at shutdown
    # (asyncio's report of an aiohttp session an earlier S3 test left to the garbage
    # collector is not the cluster's)
    errors = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and not (r.name == "asyncio" and r.getMessage().startswith("Unclosed"))
    ]
    assert not errors, caplog.text


def test_cv_search_counts_kernel_settings(data, capfd):
    X, y = data
    cv = KernelRidgeCV(
        alphas=[0.1, 1.0], param_grid={"gamma": [0.1, 0.5, 1.0]}, cv=3, progress="lines"
    )
    cv.fit(X, y)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if " cv (" in ln]
    assert lines and re.search(r"cv \(\w+\): 3/3 kernel settings \(100%\)", lines[-1]), lines
    assert cv.best_estimator_.progress == "lines"


@pytest.mark.slow
def test_krr_run_json_stdout_stays_clean(tmp_path, capsys, monkeypatch):
    from pipeline import cli

    conf = tmp_path / "small.yaml"
    conf.write_text(
        "name: small\n"
        "data: {source: sklearn, name: diabetes}\n"
        "split: {test_fraction: 0.25, seed: 0}\n"
        "kernel: {name: rbf, params: {gamma: 0.05}}\n"
        "lambda: 0.5\n"
        "solver: {method: cg, matvec: stored}\n"
        "block_size: 128\n"
        "cluster: {n_workers: 1, processes: false, memory_limit: 1GiB, dashboard: false}\n"
    )
    monkeypatch.setenv(progress.ENV_VAR, "lines")
    try:
        rc = cli.main(["run", str(conf), "--run-dir", str(tmp_path / "run"), "--json"])
    finally:
        for h in list(logging.getLogger().handlers):  # the CLI's handler holds capsys' stream
            if getattr(h, "_krr", False):
                logging.getLogger().removeHandler(h)
    out, err = capsys.readouterr()
    assert rc == 0, err
    json.loads(out)  # stdout is the JSON document only
    for label in ("ingest", "gram", "cg", "predict"):
        assert _lines(err, label), (label, err)
    # one display for the ingest stage: its phases, not one bar per array
    assert re.search(r"ingest: X_train: \d+/\d+ row blocks", err), err


@pytest.mark.slow
def test_jupyter_kernel_shows_a_widget(tmp_path):
    pytest.importorskip("ipywidgets")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import sys

    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="Python 3",
                language="python",
            )

    code = (
        "import numpy as np\n"
        "from pipeline.linalg.gram import build_gram\n"
        "from pipeline.kernels import RBF\n"
        "X = np.random.default_rng(0).standard_normal((200, 3))\n"
        f"g = build_gram(X, RBF(gamma=0.2), {str(tmp_path / 's')!r}, 64)\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    km = KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())
    try:
        nbclient.NotebookClient(nb, km=km, kernel_name="python3", timeout=120).execute()
    finally:  # a kernel manager it was given is not stopped by nbclient
        if km.has_kernel and km.is_alive():
            km.shutdown_kernel(now=True)
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs
    widgets = [
        o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets, outputs
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in widgets)
    assert "gram" in text and "/10 " in text, text  # the widget of the 10 tiles (updates: comms)
