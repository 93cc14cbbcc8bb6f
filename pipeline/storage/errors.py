"""Typed storage errors that callers (the stage runner, the CLI) act on.

They are defined in :mod:`pipeline.errors` (one class per condition) and
importable from here as before, as the same classes.
"""

from __future__ import annotations

from pipeline.errors import ForeignPathError, IncompleteArrayError, TileRewriteError

__all__ = ["ForeignPathError", "IncompleteArrayError", "TileRewriteError"]
