"""Lazy imports of the modules stages call, with a clear error while one is missing.

Stages are wired to the public functions of :mod:`pipeline.gram`,
:mod:`pipeline.solvers`, :mod:`pipeline.predict` and :mod:`pipeline.artifact`.
:func:`require` imports one of them when the stage runs, so a stage that is not
needed for a config never imports its module, and a missing one fails with a
message naming what is missing instead of an ImportError traceback.
"""

from __future__ import annotations

import importlib
from typing import Any


def require(module: str, name: str, what: str) -> Any:
    """``module.name``, or NotImplementedError naming the missing module and its issue."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        if e.name and not module.startswith(e.name) and e.name != module:
            raise  # the module exists but one of its own imports failed
        raise NotImplementedError(
            f"{what} needs {module}.{name}, and {module} is not available yet in this installation"
        ) from e
    try:
        return getattr(mod, name)
    except AttributeError:
        raise NotImplementedError(
            f"{what} needs {module}.{name}, which {module} does not provide yet"
        ) from None
