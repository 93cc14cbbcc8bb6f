"""``evaluate.compare``: the exactness gap, shown (issue #45 item 2).

The config's validation and messages, the sentence rules (a pure function), and one
small run on scikit-learn's diabetes data (332 training rows) whose evaluate stage fits
Nyström models and exact fits on nested subsamples on the same held-out rows; the rows
reach metrics.json, ``krr status --json`` and ``krr report``, and a rerun reuses them.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeline.stages import Manifest, default_stages, run_stages
from pipeline.stages.catalog import Catalog
from pipeline.stages.compare import compare_rows, compare_summary, nested_subsamples
from pipeline.stages.config import CompareConfig, ConfigError, load_config

BASE = {
    "data": {"source": "sklearn", "name": "diabetes"},
    "split": {"test_fraction": 0.25},
    "preprocess": {"standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": 0.05}},
    "lambda": 0.5,
    "block_size": 128,
    "solver": {"method": "cholesky"},
}
COMPARE = {"nystrom": [20, 80, 1000], "subsample": [0.125, 0.25, 0.5]}


def _config(compare, **over):
    return load_config({**BASE, **over, "evaluate": {"baseline": "none", "compare": compare}})


# -- the config ----------------------------------------------------------------------


def test_compare_true_takes_the_defaults_and_false_turns_it_off():
    assert _config(True).evaluate.compare == CompareConfig(
        nystrom=[1000, 4000], subsample=[0.125, 0.25, 0.5], seed=0
    )
    assert _config(False).evaluate.compare is None
    c = _config({"nystrom": [500], "subsample": [0.5]}).evaluate.compare
    assert (c.nystrom, c.subsample) == ([500], [0.5])


def test_compare_off_keeps_the_evaluate_stage_identity():
    """Without evaluate.compare the evaluate stage's arguments are those of every earlier
    run (no ``compare: null``), so no run directory reruns its evaluate stage."""
    plain = load_config({**BASE, "evaluate": {"baseline": "none"}}).stage_params()["evaluate"]
    assert "compare" not in plain
    assert _config(False).stage_params()["evaluate"] == plain
    on = _config(True).stage_params()["evaluate"]
    assert on["compare"] == {"nystrom": [1000, 4000], "subsample": [0.125, 0.25, 0.5], "seed": 0}


@pytest.mark.parametrize(
    "compare, named",
    [
        ({"nystrom": [0]}, "got 0"),
        ({"nystrom": [1000, -5]}, "got -5"),
        ({"nystrom": [2.5]}, "got 2.5"),
        ({"nystrom": [True]}, "got [True]"),
        ({"subsample": [0.0]}, "got 0.0"),
        ({"subsample": [0.5, 1.0]}, "got 1.0"),
        ({"subsample": [1.5]}, "got 1.5"),
        ({"subsample": [-0.25]}, "got -0.25"),
    ],
)
def test_bad_compare_values_are_config_errors_naming_the_value(compare, named):
    with pytest.raises(ConfigError) as e:
        _config(compare)
    msg = str(e.value)
    assert "evaluate.compare" in msg and named in msg, msg


def test_compare_with_nothing_to_fit_is_refused():
    with pytest.raises(ConfigError, match="evaluate.compare has nothing to fit"):
        _config({"nystrom": [], "subsample": []})


def test_compare_without_heldout_rows_names_split_test_fraction():
    with pytest.raises(ConfigError) as e:
        _config(True, split={"test_fraction": 0.0})
    msg = str(e.value)
    assert "evaluate.compare" in msg and "split.test_fraction" in msg, msg
    assert "holds none out" in msg
    # a given test set is held-out rows too
    cfg = _config(True, split={"test_fraction": 0.0, "test_path": "/data/test.npy",
                               "test_y_path": "/data/test_y.npy"})  # fmt: skip
    assert cfg.evaluate.compare is not None


# -- the pieces ----------------------------------------------------------------------


def test_subsamples_are_nested_seeded_and_sorted():
    subs = nested_subsamples(100, [0.5, 0.125, 0.25], seed=3)
    assert [len(s) for s in subs] == [12, 25, 50]
    for small, big in zip(subs, subs[1:]):
        assert set(small) < set(big)
    for s in subs:
        assert np.all(np.diff(s) > 0)
    again = nested_subsamples(100, [0.125, 0.25, 0.5], seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(subs, again))
    other = nested_subsamples(100, [0.125, 0.25, 0.5], seed=4)
    assert not np.array_equal(subs[2], other[2])


def _row(kind, n, rmse, m=None):
    return {"kind": kind, "n_train": n, "n_centers": m, "metrics": {"rmse": rmse, "r2": 0.5},
            "seconds": 1.0}  # fmt: skip


def test_summary_the_issues_kin40k_example():
    rows = [_row("exact", 4500, 0.200), _row("exact", 9000, 0.146), _row("exact", 18000, 0.11),
            _row("exact", 36000, 0.078), _row("nystrom", 36000, 0.286, 1000),
            _row("nystrom", 36000, 0.116, 4000)]  # fmt: skip
    assert compare_summary(rows) == (
        "the exact fit is 33% better than Nyström(4,000) in held-out RMSE (0.078 vs 0.116); "
        "the error still falls with N, so more data would pay"
    )


def test_summary_levelled_off_worse_and_same():
    # the last doubling gained 1% (< 2%): levelled off; Nyström's best is better
    rows = [_row("exact", 100, 1.0), _row("exact", 200, 0.99), _row("nystrom", 200, 0.9, 50)]
    s = compare_summary(rows)
    assert s.startswith("the exact fit is 10% worse than Nyström(50)")
    assert s.endswith("the error has levelled off with N, so more data would pay little")
    # within 0.5%: the same
    rows = [_row("exact", 100, 1.2), _row("exact", 200, 1.0), _row("nystrom", 200, 1.004, 50)]
    s = compare_summary(rows)
    assert s.startswith("the exact fit and Nyström(50) score the same")
    assert s.endswith("still falls with N, so more data would pay")


def test_summary_measures_the_gain_per_doubling():
    """A last step of 4x the rows that gained 3% in all gained ~1.5% per doubling: levelled
    off; the same 3% over one doubling: still falling."""
    four = [_row("exact", 100, 1.0), _row("exact", 400, 0.97), _row("nystrom", 400, 1.5, 10)]
    two = [_row("exact", 200, 1.0), _row("exact", 400, 0.97), _row("nystrom", 400, 1.5, 10)]
    assert "levelled off" in compare_summary(four)
    assert "still falls" in compare_summary(two)


def test_summary_without_nystrom_or_subsamples():
    s = compare_summary([_row("exact", 300, 1.0)])
    assert s == "no Nyström model was fitted (each M was at least the training rows)"
    s = compare_summary([_row("exact", 300, 1.0), _row("nystrom", 300, 2.0, 50)])
    assert s.startswith("the exact fit is 50% better than Nyström(50)") and "N" not in s[-30:]
    # without RMSE: MAE, else 1 - R² (higher R² is better)
    rows = [{"kind": "exact", "n_train": 10, "n_centers": None, "metrics": {"r2": 0.8}},
            {"kind": "nystrom", "n_train": 10, "n_centers": 5, "metrics": {"r2": 0.6}}]  # fmt: skip
    assert compare_summary(rows).startswith("the exact fit is 50% better than Nyström(5)")
    assert "1 - R²" in compare_summary(rows)


def test_an_exact_subsample_the_plan_sends_out_of_core_uses_the_store(tmp_path, monkeypatch):
    """When the plan says the subsample's dense solve does not fit in memory, the exact
    fit goes out of core into the given store, and scores as the in-memory fit does."""
    import pipeline.stages.compare as cmp

    rng = np.random.default_rng(0)
    X, Xt = rng.normal(size=(120, 3)), rng.normal(size=(30, 3))
    y, yt = np.sin(X[:, 0]), np.sin(Xt[:, 0])

    def score(pred):
        return {"rmse": float(np.sqrt(np.mean((np.ravel(pred) - yt) ** 2)))}

    kw = dict(kernel={"name": "rbf", "params": {"gamma": 0.3}}, lam=0.1, lam_convention="n",
              nystrom=[], subsample=[0.5], seed=1)  # fmt: skip
    here = compare_rows(X, y, Xt, score, store=str(tmp_path / "store"), **kw)
    assert not (tmp_path / "store").exists()
    monkeypatch.setattr(cmp, "_exact_out_of_core", lambda *a: True)
    ooc = compare_rows(X, y, Xt, score, store=str(tmp_path / "store"), **kw)
    assert [p.name[:4] for p in (tmp_path / "store").iterdir()] == ["fit-"]
    assert [(r["kind"], r["n_train"]) for r in ooc] == [("exact", 60)]
    assert ooc[0]["metrics"]["rmse"] == pytest.approx(here[0]["metrics"]["rmse"], rel=1e-8)


# -- the stage, status and report ----------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("compare") / "run"
    cfg = _config(COMPARE)
    kw = dict(identity=cfg.identity(), config={"name": "compare"})
    first = run_stages(run_dir, default_stages(), cfg.stage_params(), **kw)
    again = run_stages(run_dir, default_stages(), cfg.stage_params(), **kw)
    return run_dir, first, again


def test_the_stage_writes_the_rows_on_the_same_heldout_rows(run, caplog):
    run_dir, first, _ = run
    ev = first.outputs["evaluate"]
    rows = ev["compare"]
    n = first.outputs["ingest"]["n_train"]
    assert n == 332
    assert [(r["kind"], r["n_train"], r["n_centers"]) for r in rows] == [
        ("exact", 42, None),
        ("exact", 83, None),
        ("exact", 166, None),
        ("exact", n, None),
        ("nystrom", n, 20),
        ("nystrom", n, 80),
    ]  # M = 1000 >= n_train is skipped
    for r in rows:
        assert set(r["metrics"]) == {"rmse", "mae", "r2"}
        assert (r["seconds"] is None) == (r["kind"] == "exact" and r["n_train"] == n)
    assert rows[3]["metrics"] == ev["metrics"]  # the full fit's row: the stage's own metrics
    assert ev["compare_summary"] == compare_summary(rows)
    # in y's units, as the stage's metrics: a Nyström model with 80 centres is close
    assert rows[-1]["metrics"]["rmse"] == pytest.approx(ev["metrics"]["rmse"], rel=0.1)
    # metrics.json holds them (written atomically through the catalog)
    cfg_dir = Manifest.load(run_dir).results[first.configuration].dir
    doc = json.loads((run_dir / cfg_dir / "evaluate" / "metrics.json").read_text())
    assert doc["compare"] == rows and doc["compare_summary"] == ev["compare_summary"]


def test_the_subsample_rows_fit_the_nested_rows(run):
    """The 42-row exact fit is a fit on the first nested subsample: refitting it by hand
    on those rows gives the same metrics."""
    from pipeline import KernelRidge
    from pipeline.kernels import make_kernel
    from pipeline.stages.ingest import open_rows

    run_dir, first, _ = run
    ing = first.outputs["ingest"]
    X = np.asarray(open_rows(ing, "X_train").compute())
    y = np.asarray(open_rows(ing, "y_train").compute()).ravel()
    Xt = np.asarray(open_rows(ing, "X_test").compute())
    yt = np.asarray(open_rows(ing, "y_test").compute()).ravel()
    Xt = (Xt - np.asarray(ing["scaler"]["mean"])) / np.asarray(ing["scaler"]["scale"])
    idx = nested_subsamples(len(X), COMPARE["subsample"], seed=0)[0]
    k = make_kernel({"name": "rbf", "params": {"gamma": 0.05}})
    m = KernelRidge(alpha=0.5, kernel=k).fit(X[idx], y[idx])
    pred = m.predict(Xt).ravel() * ing["y_scaler"]["scale"][0] + ing["y_scaler"]["mean"][0]
    rmse = float(np.sqrt(np.mean((pred - yt) ** 2)))
    assert first.outputs["evaluate"]["compare"][0]["metrics"]["rmse"] == pytest.approx(rmse)


def test_a_rerun_with_the_same_config_reuses_the_rows(run):
    _, first, again = run
    assert "evaluate" in first.ran and "evaluate" not in again.ran
    assert "evaluate" in again.skipped_done
    assert again.outputs["evaluate"]["compare"] == first.outputs["evaluate"]["compare"]


def test_status_json_shows_the_rows_and_the_sentence(run, krr_main):
    run_dir, first, _ = run
    res = krr_main("status", run_dir, "--json", check=True)
    c = json.loads(res.stdout)["configurations"][-1]
    assert c["compare"] == first.outputs["evaluate"]["compare"]
    assert c["compare_summary"] == first.outputs["evaluate"]["compare_summary"]
    text = krr_main("status", run_dir, check=True).stdout
    assert f"compare: {c['compare_summary']}" in text


def test_the_run_summary_prints_the_sentence():
    import io

    from pipeline.cli.output import _print_metrics

    out = io.StringIO()
    _print_metrics({"metrics": {"rmse": 1.0}, "n_test": 3, "compare_summary": "it pays"}, out)
    assert "  exactness gap: it pays" in out.getvalue()


def test_report_shows_the_figure_and_the_sentence(run, tmp_path):
    pytest.importorskip("matplotlib")
    from pipeline.report import write_report

    run_dir, first, _ = run
    text = write_report(run_dir, tmp_path / "r.html").read_text()
    assert '<figure id="exactness-gap">' in text
    assert first.outputs["evaluate"]["compare_summary"] in text
    assert 'id="compare" data-omitted' not in text


def test_report_without_compare_says_so():
    from pipeline.report.gather import RunData
    from pipeline.report.html import _compare

    html = _compare(RunData(run_dir="x", notes={"compare": "no exactness comparison: why"}))
    assert 'data-omitted="compare"' in html and "no exactness comparison: why" in html


def test_skipped_centres_are_logged(caplog):
    rng = np.random.default_rng(0)
    X, Xt = rng.normal(size=(40, 2)), rng.normal(size=(10, 2))
    with caplog.at_level(logging.INFO, logger="pipeline.stages.compare"):
        rows = compare_rows(X, X[:, 0], Xt, lambda p: {"rmse": 0.0},
                            kernel={"name": "rbf", "params": {}}, lam=1.0,
                            lam_convention="sklearn", nystrom=[40, 100], subsample=[])  # fmt: skip
    assert rows == []
    assert "Nyström(40) skipped: M >= n_train=40" in caplog.text
    assert "Nyström(100) skipped" in caplog.text


def test_the_catalog_names_the_compare_store(tmp_path):
    assert Catalog.for_stage("evaluate", tmp_path).path("compare_store") == tmp_path / (
        "compare_store"
    )


def test_a_nystrom_run_is_its_own_nystrom_row_and_the_full_exact_fit_is_fitted():
    """With solver.method: nystrom the run's own metrics are the Nyström row of its M
    (not fitted again), and the full exact fit is fitted by the comparison."""
    off = _config(None, solver={"method": "nystrom", "n_centers": 50}).stage_params()
    assert "run_n_centers" not in off["evaluate"]
    on = _config(True, solver={"method": "nystrom", "n_centers": 50}).stage_params()
    assert on["evaluate"]["run_n_centers"] == 50
    assert "run_n_centers" not in _config(True).stage_params()["evaluate"]

    rng = np.random.default_rng(0)
    X, Xt = rng.normal(size=(80, 2)), rng.normal(size=(20, 2))
    y, yt = np.sin(X[:, 0]), np.sin(Xt[:, 0])

    def score(pred):
        return {"rmse": float(np.sqrt(np.mean((np.ravel(pred) - yt) ** 2)))}

    own = {"rmse": 123.0}
    rows = compare_rows(X, y, Xt, score, kernel={"name": "rbf", "params": {"gamma": 0.5}},
                        lam=0.1, lam_convention="sklearn", nystrom=[10, 30], subsample=[0.5],
                        full_metrics=own, full_n_centers=30)  # fmt: skip
    assert [(r["kind"], r["n_train"], r["n_centers"]) for r in rows] == [
        ("exact", 40, None),
        ("exact", 80, None),
        ("nystrom", 80, 10),
        ("nystrom", 80, 30),
    ]
    assert rows[3]["metrics"] == own and rows[3]["seconds"] is None
    assert rows[1]["metrics"]["rmse"] < 1.0 and rows[1]["seconds"] is not None
