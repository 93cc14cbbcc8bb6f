"""The installed package's version, from its metadata (``importlib.metadata``).

Modules that need the version import it from here, never from the package root
(importing ``pipeline`` loads every estimator).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("krr-pipeline")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"

__all__ = ["__version__"]
