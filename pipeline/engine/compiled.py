"""Loops compiled by numba: how the engine compiles them, in one place.

The engine compiles a few loops of plain arithmetic that NumPy cannot express without
a temporary or a reordering: the fused evaluators' ``exp``
(:mod:`pipeline.engine.vexp`) and the rejection step of the accelerated RPCholesky
(:mod:`pipeline.linalg.precond`). Each is compiled the same way:

- ``nogil``, so tile tasks on other threads run meanwhile; no bounds checks; NumPy's
  error model (a division by zero gives ``inf``, not an exception);
- no ``fastmath``: LLVM neither reassociates nor contracts a multiply and an add into a
  fused multiply-add, so each entry's bits are those of the same operations written in
  NumPy, in the same order (a loop that wants an FMA asks for ``llvm.fma`` itself, as
  ``vexp`` does);
- cached on disk next to its module, so a process after the first loads it instead of
  compiling it again; where no cache location is writable (a read-only install without a
  home), compiled in every process instead: the same bits.

numba is imported on the first call, not with the package, under
:data:`~pipeline.engine.parallel.native_lock` (its import loads native libraries).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.engine.parallel import native_lock

__all__ = ["lazy", "njit"]


def njit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled by numba with the engine's options (module docstring)."""
    import numba as nb

    opts = {"nogil": True, "error_model": "numpy", "boundscheck": False}
    try:
        return nb.njit(cache=True, **opts)(fn)
    except RuntimeError:  # no writable cache location (a read-only install, no home)
        return nb.njit(**opts)(fn)  # compiled in every process instead: the same bits


class lazy:  # noqa: N801 (used as a decorator, like functools.cache)
    """A function compiled by :func:`njit` on its first call (numba imported then)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            with native_lock:  # numba's import loads native libraries: never beside a scan
                if self.compiled is None:
                    self.compiled = njit(self.fn)
        return self.compiled(*args)
