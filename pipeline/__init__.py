"""krr-pipeline: exact kernel ridge regression, out of core, checkpointed, on Dask."""

__version__ = "0.1.0"

from pipeline import kernels  # noqa: E402
from pipeline.estimator import KernelRidge  # noqa: E402
from pipeline.model_io import load  # noqa: E402
from pipeline.model_selection import KernelRidgeCV  # noqa: E402
from pipeline.perceptron import KernelPerceptron  # noqa: E402

__all__ = ["KernelPerceptron", "KernelRidge", "KernelRidgeCV", "__version__", "kernels", "load"]
