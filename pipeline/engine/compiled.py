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

A module that compiles a loop registers, with :func:`warms_up`, the call that compiles
each signature it uses; :func:`warm_up` makes those calls, so one process can fill
numba's cache before others start (the test suite's controller does, before its workers:
docs/PERFORMANCE.md#the-test-suite). ``tests/engine/test_compiled.py`` checks that every
compiled loop of the package is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.engine.parallel import native_lock

__all__ = ["lazy", "njit", "warm_up", "warms_up"]

#: the registered warm-up calls, by qualified name (:func:`warms_up`)
_WARM_UPS: dict[str, Callable[[], object]] = {}


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


def warms_up(fn: Callable[[], object]) -> Callable[[], object]:
    """Register ``fn``, a call without arguments that compiles (or loads from numba's
    cache) every signature of its module's loops, for :func:`warm_up`."""
    _WARM_UPS[f"{fn.__module__}.{fn.__qualname__}"] = fn
    return fn


def warm_up() -> list[str]:
    """Compile, or load from numba's cache, every loop of the modules imported so far
    (each module registers its call with :func:`warms_up`); returns their names."""
    for fn in _WARM_UPS.values():
        fn()
    return list(_WARM_UPS)
