"""krr-pipeline: exact kernel ridge regression, out of core, checkpointed, on Dask."""

__version__ = "0.1.0"

from pipeline import kernels  # noqa: E402

__all__ = ["__version__", "kernels"]
