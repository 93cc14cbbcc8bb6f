"""krr-pipeline: exact kernel ridge regression, out of core, checkpointed, on Dask.

The public names are loaded on first use (PEP 562), so importing a submodule
(``pipeline.artifact``, ``pipeline.policy``) does not import every estimator.
"""

from __future__ import annotations

import importlib
from typing import Any

from pipeline._version import __version__

_PUBLIC = {
    "KernelPerceptron": "pipeline.perceptron",
    "KernelRidge": "pipeline.estimator",
    "KernelRidgeCV": "pipeline.model_selection",
    "load": "pipeline.estimator",
}

__all__ = ["KernelPerceptron", "KernelRidge", "KernelRidgeCV", "__version__", "kernels", "load"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    if name == "kernels":
        return importlib.import_module("pipeline.kernels")
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
