"""krr-pipeline: exact kernel ridge regression, out of core, checkpointed, on Dask.

The public names are loaded on first use (PEP 562), so importing a submodule
(``pipeline.models.artifact``, ``pipeline.plan``, ``pipeline.cli``) does not import every
estimator, nor numpy and Dask.

Besides the estimators, the package root holds what a user needs to drive a batch
run from Python as ``krr`` does from the shell: :func:`load_config` (``krr
validate``), :func:`run` (``krr run``: the run directory's lock and the resumable
stages, returning a :class:`~pipeline.stages.RunReport`), :func:`run_status` (``krr
status``), :func:`latest_model`, :func:`write_report` (``krr report``),
:func:`read_run` (a run's stages, times, peak memory and metrics, as the report
reads them) and :func:`plot_cv_results`. Scripts and notebooks should import only
``pipeline`` and ``pipeline.cli``; the submodules are internals.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline import _blas_env
from pipeline._version import __version__

_blas_env.apply()  # before anything here imports SciPy (its OpenBLAS reads it on load)

#: public name -> (module, name there)
_PUBLIC = {
    "KernelPerceptron": ("pipeline.models.perceptron", "KernelPerceptron"),
    "KernelRidge": ("pipeline.models.estimator", "KernelRidge"),
    "KernelRidgeCV": ("pipeline.models.selection", "KernelRidgeCV"),
    "load": ("pipeline.models.estimator", "load"),
    "load_config": ("pipeline.stages.config", "load_config"),
    "run": ("pipeline.stages", "run_config"),
    "run_status": ("pipeline.stages", "run_status"),
    "latest_model": ("pipeline.stages", "latest_model"),
    "write_report": ("pipeline.report", "write_report"),
    "read_run": ("pipeline.report.gather", "gather"),
    "plot_cv_results": ("pipeline.models.selection", "plot_cv_results"),
}

__all__ = [
    "KernelPerceptron",
    "KernelRidge",
    "KernelRidgeCV",
    "__version__",
    "kernels",
    "latest_model",
    "load",
    "load_config",
    "plot_cv_results",
    "read_run",
    "run",
    "run_status",
    "write_report",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name == "kernels":
        return importlib.import_module("pipeline.kernels")
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
