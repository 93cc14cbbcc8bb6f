"""Render a :class:`~pipeline.report.gather.RunData` as one self-contained HTML page.

No external CSS, script or font: the style sheet is inline and every figure is a
PNG inside a ``data:`` URI, in a ``<figure id="...">`` with a ``<figcaption>``.
A section the run does not have is kept, with a ``<p class="note">`` saying why
(and ``data-omitted`` on the section), so the page always has the same outline.
"""

from __future__ import annotations

import base64
import datetime as _dt
from html import escape
from typing import Any

from pipeline._version import __version__
from pipeline.report import figures as F
from pipeline.report.gather import RunData

__all__ = ["FIGURE_IDS", "render_html"]

#: every figure the report can hold, by its element id
FIGURE_IDS = ("stage-times", "cg-convergence", "cv-curve", "cv-heatmap", "residuals", "parity",
              "exactness-gap")  # fmt: skip

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1200px;padding:1rem 1.5rem;color:#222;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;
margin-top:2rem}table{border-collapse:collapse;margin:.6rem 0;font-size:.92rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
figure{margin:.6rem 1.2rem .6rem 0;display:inline-block;vertical-align:top}
figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.88rem;color:#555;
max-width:700px}.note{color:#7a5b00;background:#fff8e1;padding:.4rem .7rem;border-left:3px
solid #f0c000}.meta{color:#666;font-size:.9rem}pre{white-space:pre-wrap;background:#f7f7f7;
padding:.5rem}.kv{display:grid;grid-template-columns:repeat(4,max-content max-content);
gap:.15rem 1rem;font-size:.9rem;margin:.6rem 0}.kv dt{color:#555}.kv dd{margin:0;
font-variant-numeric:tabular-nums}
"""


#: names the page as ours: write_report replaces only a file that carries it
GENERATOR = "krr-pipeline report"


def _num(v: Any, fmt: str = ".6g") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return format(v, fmt)
    return escape(str(v))


def _bytes(b: Any) -> str:
    if b is None:
        return "–"
    b = float(b)
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def _figure(fid: str, png: bytes, caption: str) -> str:
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="{fid}"><img alt="{escape(caption)}" src="{src}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def _note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'


def _section(sid: str, title: str, body: str, omitted: str | None = None) -> str:
    attr = f' data-omitted="{escape(omitted)}"' if omitted else ""
    return f'<section id="{sid}"{attr}><h2>{escape(title)}</h2>{body}</section>'


def _table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c}</td>' if i >= numeric_from else f"<td>{c}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plan(d: RunData) -> str:
    if not d.plan and not d.method:
        return _section("plan", "Fit plan", _note(d.notes.get("plan", "no fit plan")), "plan")
    parts = [f"<p>Solver: <b>{escape(str(d.method))}</b></p>"]
    if d.plan_reason:
        parts.append(f"<p>Reason:</p><pre>{escape(d.plan_reason)}</pre>")
    if d.plan:
        items = "".join(
            f"<dt>{escape(str(k))}</dt><dd>{_num(v)}</dd>"
            for k, v in d.plan.items()
            if not isinstance(v, dict)
        )
        parts.append(f'<dl class="kv">{items}</dl>')
    elif "plan" in d.notes:
        parts.append(_note(d.notes["plan"]))
    return _section("plan", "Fit plan", "".join(parts))


def _stages(d: RunData) -> str:
    rows = [
        [
            escape(s.name),
            escape(s.status),
            _num(s.seconds, ".2f"),
            _bytes(s.peak_rss_bytes),
            _bytes(s.peak_children_rss_bytes),
            _bytes(s.process_max_rss_bytes),
        ]
        for s in d.stages
    ]
    table = _table(
        [
            "stage",
            "status",
            "wall time (s)",
            "peak RSS, this process",
            "peak RSS, local workers",
            "process max RSS so far",
        ],
        rows,
        numeric_from=2,
    )
    if "stages" in d.notes:
        return _section("stages", "Stages", table + _note(d.notes["stages"]), "stages")
    total = sum(s.seconds or 0.0 for s in d.stages)
    fig = _figure(
        "stage-times",
        F.stage_times(d.stages),
        f"Wall time and peak resident memory of each stage as last run (total {total:.1f} s). "
        "Memory is sampled while the stage runs, for this process and its local workers.",
    )
    return _section("stages", "Stages: time and memory", table + fig)


def _cg(d: RunData) -> str:
    if d.cg_history is None:
        note = d.notes.get("cg", "no CG convergence curve")
        return _section("cg", "CG convergence", _note(note), "cg")
    s = d.solve
    tol = (d.plan or {}).get("tol")
    worst = s.get("rel_residual")
    if isinstance(worst, list) and worst:
        worst = max(worst)
    cap = (
        f"Relative residual per conjugate-gradient iteration: {s.get('n_iter', '?')} "
        f"iterations, final relative residual {_num(worst, '.3e')}, "
        f"{'converged' if s.get('converged') else 'not converged'}"
        + (f" (tolerance {float(tol):.1e})." if tol else ".")
    )
    return _section(
        "cg", "CG convergence", _figure("cg-convergence", F.cg_convergence(d.cg_history, tol), cap)
    )


def _cv(d: RunData) -> str:
    if d.cv_results is None:
        return _section("cv", "Cross-validation", _note(d.notes.get("cv", "no CV")), "cv")
    sel = d.select or {}
    best = ", ".join(f"{k} = {_num(v)}" for k, v in (sel.get("best_params") or {}).items())
    parts = [
        f"<p>Selected <b>{escape(best)}</b> by {_num(sel.get('n_splits'))}-split CV over "
        f"{_num(sel.get('n_candidates'))} candidates (solver {escape(str(sel.get('solver')))}); "
        f"best mean {escape(str(sel.get('scoring')))} = {_num(sel.get('best_score'))}.</p>"
    ]
    res = d.cv_results
    parts.append(
        _figure(
            "cv-curve",
            F.cv_curve(res),
            "Mean CV score (± one standard deviation over the folds) against λ, one curve per "
            "kernel setting; the circle marks the selected candidate.",
        )
    )
    others = sorted({k for p in res["params"] for k in p if k != "alpha"})
    if len(others) == 1:
        parts.append(
            _figure(
                "cv-heatmap",
                F.cv_heatmap(res, others[0]),
                f"Mean CV score over λ and {others[0]}; the star marks the best cell.",
            )
        )
    else:
        why = (
            "no CV heatmap: the search varied only λ"
            if not others
            else f"no CV heatmap: it needs one kernel parameter besides λ, the search has {others}"
        )
        parts.append(_note(why))
    refine = sel.get("refine")
    if refine and refine.get("alphas"):
        parts.append(
            _figure(
                "cv-refine",
                F.cv_refine(refine),
                f"λ refined on all {_num(refine.get('n_train'))} training rows "
                f"({escape(str(refine.get('method')))}): {_num(refine.get('subsample_alpha'))} → "
                f"{_num(refine.get('alpha'))}, in {_num(refine.get('seconds'))} s.",
            )
        )
    return _section("cv", "Cross-validation", "".join(parts))


def _heldout(d: RunData) -> str:
    if d.y_true is None or d.y_pred is None:
        note = d.notes.get("heldout", "no held-out predictions")
        return _section("heldout", "Held-out set", _note(note), "heldout")
    n = len(d.y_true)
    sub = f" (an evenly spaced {F.MAX_POINTS} of them are drawn)" if n > F.MAX_POINTS else ""
    parts = [
        _figure(
            "residuals",
            F.residuals(d.y_true, d.y_pred),
            f"Residuals (predicted − true) on the {n} held-out rows{sub}, against the "
            "prediction, and their distribution.",
        ),
        _figure(
            "parity",
            F.parity(d.y_true, d.y_pred),
            f"Predicted against true y on the {n} held-out rows{sub}; the dashed line is y = x.",
        ),
    ]
    return _section("heldout", "Held-out set: residuals and parity", "".join(parts))


def _metrics(d: RunData) -> str:
    if not d.metrics:
        return _section(
            "metrics", "Metrics", _note(d.notes.get("metrics", "no metrics")), "metrics"
        )
    cols = [("this run", d.metrics)]
    if d.baseline:
        cols.append((str(d.baseline.get("name", "scikit-learn")), d.baseline.get("metrics") or {}))
    if d.mean_baseline:
        cols.append(("mean predictor (mean of y_train)", d.mean_baseline.get("metrics") or {}))
    rows = [[escape(m)] + [_num(c.get(m)) for _, c in cols] for m in d.metrics]
    parts = [
        f"<p>On the {_num(d.n_test)} held-out rows, in the original units of y.</p>",
        _table(["metric"] + [name for name, _ in cols], rows),
    ]
    if d.baseline:
        parts.append(
            "<p>Largest absolute difference from scikit-learn's predictions: "
            f"{_num(d.baseline.get('max_abs_prediction_difference'), '.3e')} (relative "
            f"{_num(d.baseline.get('max_rel_prediction_difference'), '.3e')}).</p>"
        )
    if d.baseline_note:
        parts.append(_note(d.baseline_note))
    if not d.mean_baseline:
        parts.append(_note("no mean-predictor baseline: the run's evaluate stage predates it"))
    return _section("metrics", "Metrics next to the baselines", "".join(parts))


def _compare(d: RunData) -> str:
    title = "Exactness gap: exact fits and Nyström models"
    if not d.compare:
        note = d.notes.get("compare", "no exactness comparison")
        return _section("compare", title, _note(note), "compare")
    names = [m for m in ("rmse", "mae", "r2") if all(m in (r.get("metrics") or {})
                                                     for r in d.compare)]  # fmt: skip
    rows = [
        [
            escape(str(r["kind"])),
            _num(r.get("n_train"), ","),
            _num(r.get("n_centers"), ","),
            *[_num((r.get("metrics") or {}).get(m)) for m in names],
            _num(r.get("seconds"), ".2f"),
        ]
        for r in d.compare
    ]
    parts = [
        f"<p><b>{escape(d.compare_summary or '')}</b></p>" if d.compare_summary else "",
        _table(["model", "training rows", "centres M", *names, "fit + predict (s)"], rows),
    ]
    if names:
        parts.append(
            _figure(
                "exactness-gap",
                F.exactness_gap(d.compare, names[0]),
                f"Held-out {names[0]} on the same {_num(d.n_test)} rows: the exact fit on "
                "nested subsamples of the training rows and on all of them (left), and "
                "Nyström models with the same kernel and λ against their number of centres "
                "M (right). The full exact fit's time is the solve stage's.",
            )
        )
    return _section("compare", title, "".join(parts))


def render_html(data: RunData) -> str:
    """The report page of ``data`` (a complete HTML document)."""

    F.require_matplotlib()
    title = f"krr report: {data.name}" if data.name else "krr report"
    when = (
        _dt.datetime.fromtimestamp(data.created, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if data.created
        else "?"
    )
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = "".join(
        [
            f"<h1>{escape(title)}</h1>",
            f'<p class="meta">Run directory {escape(data.run_dir)} · created {when} · '
            f"report written {now} by krr-pipeline {escape(__version__)}</p>",
            _plan(data),
            _stages(data),
            _cg(data),
            _cv(data),
            _heldout(data),
            _metrics(data),
            _compare(data),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="generator" content="{GENERATOR}">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )
