"""``krr report RUN_DIR``: one self-contained HTML page with every figure of a run.

Two tiny runs on scikit-learn's shipped diabetes data (threaded scheduler, a few
seconds each): a matrix-free CG solve without CV, and a Cholesky solve after a
CV search. The page is parsed (``html.parser``) and, where Debian's ``chromium``
is installed, rendered headless: a screenshot and the DOM after load.
"""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages import Manifest, Stage, default_stages, run_stages
from pipeline.stages.config import load_config

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "block_size": 128,
}
CG = {
    **BASE,
    "solver": {"method": "cg", "preconditioner": "jacobi"},
    "evaluate": {"baseline": "none"},
}
CV = {
    **BASE,
    "solver": {"method": "cholesky"},
    "cv": {"alphas": [0.1, 1.0, 10.0], "param_grid": {"gamma": [0.01, 0.1]}, "folds": 3},
}
CG_FIGURES = {"stage-times", "cg-convergence", "residuals", "parity"}
CV_FIGURES = {"stage-times", "cv-curve", "cv-heatmap", "residuals", "parity"}


def _run(run_dir: Path, raw: dict, name: str, **kw) -> Path:
    cfg = load_config(raw, [])
    run_stages(
        run_dir,
        default_stages(),
        cfg.stage_params(),
        identity=cfg.identity(),
        config={"name": name},
        **kw,
    )
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("matplotlib")
    root = tmp_path_factory.mktemp("report_runs")
    return {"cg": _run(root / "cg", CG, "tiny-cg"), "cv": _run(root / "cv", CV, "tiny-cv")}


class _Page(HTMLParser):
    """Figures (id -> {img src, caption}), sections (id -> attrs), notes, external refs."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, str]] = {}
        self.sections: dict[str, dict[str, str | None]] = {}
        self.notes: list[str] = []
        self.external: list[str] = []
        self.tags: set[str] = set()
        self._fig: str | None = None
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        for key in ("src", "href"):
            v = a.get(key) or ""
            if v and not v.startswith("data:") and not v.startswith("#"):
                self.external.append(f"<{tag} {key}={v[:60]}>")
        if tag == "figure":
            self._fig = a.get("id")
            self.figures[self._fig] = {"src": "", "caption": ""}
        elif tag == "img" and self._fig:
            self.figures[self._fig]["src"] = a.get("src") or ""
        elif tag == "figcaption":
            self._in = "caption"
        elif tag == "section":
            self.sections[a["id"]] = a
        elif tag == "p" and a.get("class") == "note":
            self._in = "note"
            self.notes.append("")

    def handle_endtag(self, tag):
        if tag == "figure":
            self._fig = None
        if tag in ("figcaption", "p"):
            self._in = None

    def handle_data(self, data):
        if self._in == "caption" and self._fig:
            self.figures[self._fig]["caption"] += data
        elif self._in == "note":
            self.notes[-1] += data


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def _png_size(src: str) -> tuple[int, int]:
    """Width and height of a ``data:image/png;base64,...`` image (it must decode)."""
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    data = base64.b64decode(src[len(prefix) :], validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    if "matplotlib" in sys.modules:  # decode the pixels too
        import io

        import matplotlib.image as mpimg

        img = mpimg.imread(io.BytesIO(data), format="png")
        assert img.shape[:2] == (h, w) and float(img.std()) > 0.01  # not a blank image
    return w, h


def _check_figures(page: _Page, expected: set[str]) -> None:
    assert set(page.figures) == expected
    for fid, fig in page.figures.items():
        w, h = _png_size(fig["src"])
        assert w > 100 and h > 100, (fid, w, h)
        assert fig["caption"].strip(), f"figure {fid} has no caption"
    assert not page.external, page.external  # self-contained: no external resources
    assert not {"script", "link"} & page.tags


def test_cg_run_report_has_every_figure_and_notes_what_it_lacks(runs):
    from pipeline.report import write_report

    out = write_report(runs["cg"])
    assert out == runs["cg"] / "report.html"
    page = _parse(out)
    _check_figures(page, CG_FIGURES)
    assert page.sections["cv"]["data-omitted"] == "cv"
    assert any("no cross-validation: the config has no cv section" in n for n in page.notes)
    assert "data-omitted" not in page.sections["cg"]
    text = out.read_text()
    assert "Reason:" in text and "requested solver=" in text  # the plan's reason
    # the metrics table shows this run's numbers next to the mean predictor's
    ev = Manifest.load(runs["cg"]).stages["evaluate"].outputs  # as in metrics.json
    assert f"{ev['metrics']['rmse']:.6g}" in text
    assert f"{ev['mean_baseline']['metrics']['rmse']:.6g}" in text
    assert ev["mean_baseline"]["metrics"]["r2"] < 0.05 < ev["metrics"]["r2"]


def test_cv_run_report_has_the_cv_figures_and_the_sklearn_baseline(runs, tmp_path):
    from pipeline.report import write_report

    out = write_report(runs["cv"], tmp_path / "sub" / "r.html")
    page = _parse(out)
    _check_figures(page, CV_FIGURES)
    assert page.sections["cg"]["data-omitted"] == "cg"
    assert any("this run solved with cholesky" in n for n in page.notes)
    assert "sklearn.kernel_ridge.KernelRidge" in out.read_text()


def test_manifest_records_stage_time_and_peak_memory(runs):
    m = Manifest.load(runs["cv"])
    for name in ("ingest", "select", "solve", "predict", "evaluate"):
        r = m.stages[name].resources
        assert r["seconds"] > 0, (name, r)
        assert r["peak_rss_bytes"] > 10 * 2**20, (name, r)
        assert r["process_max_rss_bytes"] >= r["peak_rss_bytes"] * 0.5
    assert m.stages["select"].resources["seconds"] > m.stages["model"].resources["seconds"]


def test_stage_peak_memory_is_the_stage_own(tmp_path):
    """A stage that holds 200 MB for half a second shows it; the next one does not."""
    pytest.importorskip("psutil")

    def hog(stage_dir, inputs):
        a = np.ones(25 * 2**20)  # 200 MiB
        import time

        time.sleep(0.6)
        return {"sum": float(a[:10].sum())}

    def small(stage_dir, inputs):
        return {}

    rep = run_stages(tmp_path, [Stage("hog", hog), Stage("small", small)], {})
    hog_r = rep.manifest.stages["hog"].resources
    small_r = rep.manifest.stages["small"].resources
    assert hog_r["seconds"] >= 0.6
    assert hog_r["peak_rss_bytes"] - small_r["peak_rss_bytes"] > 150 * 2**20


def test_evaluate_saves_checked_heldout_predictions(runs, tmp_path):
    """A damaged y_pred.npy is noted in the report (its checksum), never drawn."""
    from pipeline.report import write_report
    from pipeline.stages.catalog import load_npy_verified

    run = tmp_path / "copy"
    shutil.copytree(runs["cg"], run)
    ev = Manifest.load(run).stages["evaluate"].outputs
    y_true = load_npy_verified(ev["heldout"]["y_true"], ev["heldout"]["y_true_crc32c"])
    y_pred = load_npy_verified(ev["heldout"]["y_pred"], ev["heldout"]["y_pred_crc32c"])
    assert y_true.shape == y_pred.shape == (ev["n_test"], 1)
    rmse = float(np.sqrt(np.mean((y_pred - y_true) ** 2)))
    assert rmse == pytest.approx(ev["metrics"]["rmse"], rel=1e-12)

    p = Path(ev["heldout"]["y_pred"])
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0xFF
    p.write_bytes(bytes(raw))
    page = _parse(write_report(run))
    assert page.sections["heldout"]["data-omitted"] == "heldout"
    assert {"residuals", "parity"}.isdisjoint(page.figures)
    assert any("no residual or parity plots" in n and "y_pred.npy" in n for n in page.notes)


def test_run_from_before_heldout_was_saved_reads_predict_and_ingest(runs, tmp_path):
    from pipeline.report import write_report

    run = tmp_path / "old"
    shutil.copytree(runs["cg"], run)
    m = Manifest.load(run)
    ev = m.stages["evaluate"].outputs
    for key in ("heldout", "mean_baseline"):
        ev.pop(key)
    m.stages["solve"].outputs.pop("plan")  # as written before the fit plan was recorded
    for rec in m.stages.values():
        rec.resources = {}
    m.save()
    page = _parse(write_report(run))
    assert {"residuals", "parity", "stage-times"} <= set(page.figures)
    assert any("predates" in n for n in page.notes)


def test_partial_run_omits_what_has_not_run(tmp_path):
    pytest.importorskip("matplotlib")
    from pipeline.report import write_report

    run = _run(tmp_path / "partial", CG, "partial", until="solve")
    page = _parse(write_report(run))
    assert set(page.figures) == {"stage-times", "cg-convergence"}
    for sid in ("cv", "heldout", "metrics"):
        assert page.sections[sid]["data-omitted"] == sid
    assert any("the evaluate stage has not run" in n for n in page.notes)


def test_an_unfinished_solve_reports_the_recorded_plan_it_runs(tmp_path, monkeypatch):
    """The fit plan is recorded before the solve (RUN_DIR/plan.json, issue #43): a solve
    that failed still shows it, read back, nothing planned again (it had no plan before)."""
    import pipeline.stages.solve as solve_mod  # where the stages name plan_fit
    from pipeline.report.gather import gather
    from pipeline.stages import StageFailed

    raw = {**CG, "solver": {**CG["solver"], "max_iter": 1, "tol": 1e-12}}
    with pytest.raises(StageFailed, match="did not converge"):
        _run(tmp_path / "failed", raw, "failed")
    real, calls = solve_mod.plan_fit, []
    monkeypatch.setattr(solve_mod, "plan_fit", lambda *a, **k: calls.append(1) or real(*a, **k))
    data = gather(tmp_path / "failed")
    assert data.method == "cg" and data.plan["max_iter"] == 1 and calls == []
    assert data.plan_reason.startswith("requested solver='cg'")


def test_synthetic_two_outputs_and_a_lambda_only_search(tmp_path):
    """Two outputs (two CG curves, two scatter series); a CV over λ alone has no heatmap."""
    pytest.importorskip("matplotlib")
    from pipeline.report.gather import RunData, StageInfo
    from pipeline.report.html import render_html

    rng = np.random.default_rng(0)
    y = rng.normal(size=(50, 2))
    alphas = [0.01, 0.1, 1.0]
    data = RunData(
        run_dir="synthetic",
        stages=[StageInfo("solve", "done", seconds=1.5, peak_rss_bytes=2**30)],
        method="cg",
        plan={"solver": "cg", "tol": 1e-6},
        plan_reason="because",
        solve={"n_iter": 5, "converged": True, "rel_residual": [1e-7, 2e-7]},
        cg_history=np.logspace(0, -7, 6)[:, None] * [1.0, 2.0],
        cv_results={
            "params": [{"alpha": a} for a in alphas],
            "mean_test_score": np.array([0.1, 0.5, 0.3]),
            "std_test_score": np.array([0.01, 0.02, 0.03]),
            "rank_test_score": np.array([3, 1, 2]),
        },
        select={"best_params": {"alpha": 0.1}, "n_splits": 3, "n_candidates": 3},
        metrics={"rmse": 0.5},
        n_test=50,
        y_true=y,
        y_pred=y + 0.1 * rng.normal(size=y.shape),
    )
    out = tmp_path / "r.html"
    out.write_text(render_html(data))
    page = _parse(out)
    _check_figures(page, {"stage-times", "cg-convergence", "cv-curve", "residuals", "parity"})
    assert any("no CV heatmap: the search varied only λ" in n for n in page.notes)


def test_not_a_run_directory(tmp_path):
    pytest.importorskip("matplotlib")
    from pipeline.cli import main
    from pipeline.report import write_report

    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path / "missing")]) == 3


def test_cli_report_writes_the_file(runs, tmp_path, capsys, monkeypatch):
    from pipeline.cli import main

    out = tmp_path / "page.html"
    assert main(["report", str(runs["cg"]), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert CG_FIGURES <= set(_parse(out).figures)
    monkeypatch.chdir(tmp_path)  # a bare file name is written in the working directory
    assert main(["report", str(runs["cg"]), "-o", "bare.html"]) == 0
    assert (tmp_path / "bare.html").is_file()


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    """Without matplotlib (the [plots] extra) the report says what to install, first."""
    from pipeline.cli import main
    from pipeline.report import write_report

    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'krr-pipeline\[plots\]'"):
        write_report(tmp_path, tmp_path / "never.html")
    # a missing extra is exit 2, as the README's table says (it was 3 before session 25)
    assert main(["report", str(tmp_path)]) == 2
    assert "krr-pipeline[plots]" in capsys.readouterr().err
    assert not (tmp_path / "never.html").exists()


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


#: appended to a copy of the page: after load, the ids of the figures whose image decoded
_PROBE = """<script>window.addEventListener('load', () => {
  const ok = [...document.querySelectorAll('figure')].filter(f => {
    const i = f.querySelector('img'); return i && i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-decoded', ok.map(f => f.id).join(' '));
});</script>"""


@pytest.mark.slow
@pytest.mark.skipif(
    _chromium() is None,
    reason="headless rendering needs a chromium binary (Debian: apt-get install chromium); "
    "none is on PATH",
)
@pytest.mark.parametrize(("which", "expected"), [("cg", CG_FIGURES), ("cv", CV_FIGURES)])
def test_report_renders_in_headless_chromium(runs, tmp_path, which, expected):
    from pipeline.report import write_report

    page = write_report(runs[which], tmp_path / "report.html")
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    flags = [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"]
    flags += [f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,4000"]
    dom = subprocess.run(
        [*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    rendered = _Page()
    rendered.feed(dom)
    assert set(rendered.figures) == expected
    decoded = dom.split('data-decoded="', 1)[1].split('"', 1)[0].split()
    assert set(decoded) == expected, decoded  # every figure's image decoded in the browser

    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 4000)
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    rows_with_ink = (img[..., :3].min(axis=(1, 2)) < 0.5).mean()
    assert rows_with_ink > 0.3  # figures and text drawn, not a blank page
