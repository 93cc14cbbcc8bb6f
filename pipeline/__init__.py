"""krr-pipeline: exact kernel ridge regression, out of core, checkpointed, on Dask."""

__version__ = "0.1.0"

from pipeline import kernels  # noqa: E402
from pipeline.estimator import KernelRidge  # noqa: E402
from pipeline.perceptron import KernelPerceptron  # noqa: E402

__all__ = ["KernelPerceptron", "KernelRidge", "__version__", "kernels"]
