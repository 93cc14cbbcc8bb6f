"""Preconditioners for ``K + μI`` (μ = λ or nλ): none, Jacobi, Nyström.

The Nyström preconditioner follows Díaz, Epperly, Frangella, Tropp & Webber,
*Robust, randomized preconditioning for kernel ridge regression* (2023): a
rank-r factor ``F`` (``K ≈ F Fᵀ``) from randomly pivoted Cholesky (the
accelerated, rejection-sampling variant of Epperly, Tropp & Webber, 2024) or
from uniformly sampled centres, and

    P = F Fᵀ + μ I,   P⁻¹ R = (R - F (μ I + FᵀF)⁻¹ Fᵀ R) / μ,

the Woodbury identity with an r x r Cholesky of ``μ I + FᵀF`` (as in FALKON).
Building it touches K only through ``diagonal``, ``columns`` and ``submatrix``
of an operator (:mod:`pipeline.linalg.matvec`), each computed blockwise: K is
never formed. Memory is O(N·r). On an operator with a device backend (a GPU's
:class:`~pipeline.linalg.matvec.DeviceKernelOperator`) the RPCholesky builds keep F on
the device and do their O(N·r) work there, and the one apply uses it there.

The adaptive rank, for small shifts (``make_preconditioner(..., "adaptive")``,
``build_nystrom(centres="adaptive")``): with ``P = F Fᵀ + μ I`` the preconditioned
system has condition number at most ``1 + ‖K - F Fᵀ‖₂ / μ`` (Díaz et al. 2023,
above). A fixed rank therefore fails as μ shrinks: on diamonds (N = 10,000, RBF
γ = 0.1, μ = 1e-2) rank 500 leaves ‖K - F Fᵀ‖/μ ≈ 76 and CG needs 30 iterations,
rank 2,000 leaves 0.4 and CG needs 4. The adaptive build grows the factor in
blocks of pivots until an estimate of ``ρ = ‖K - F Fᵀ‖₂`` is at most
``factor · μ``, or until the factor fills its memory budget (then it stops with a
log line and reports ``capped=True``). The estimate is cheap: the top eigenvalue
of the residual on a fixed random subsample S of m rows, ``(N/m) λ_max(K_SS - F_S
F_Sᵀ)`` (the classic subsample estimate of an integral operator's eigenvalues),
which never touches the N x N matrix. :func:`residual_norm` gives the honest
power-iteration figure with the operator's product when one wants to check it.

The adaptive factor is stored in float32 by default (half the memory); the apply
upcasts it to float64 block by block, so ``P⁻¹`` is an exactly symmetric positive
definite linear map (that of the stored factor) and CG's theory holds.

This module is the one home of Nyström, in three pieces:

- one builder, :func:`build_nystrom` (centres ``"uniform"`` | ``"rpcholesky"`` |
  ``"adaptive"``), giving a :class:`NystromFactor` (F, its centres, the build's
  record). Both RPCholesky builds run the one pivoted Cholesky loop
  (``_pivoted_cholesky``): the fixed-rank one stops at its rank, the adaptive one
  also at its residual target;
- one apply of ``(F Fᵀ + μ I)⁻¹`` for one operator, :class:`NystromPreconditioner`
  (``NystromFactor.woodbury``; what ``make_preconditioner("nystrom" | "adaptive")``
  gives), the Cholesky form in F's own dtype: it builds faster and applies more
  accurately than the eigen form it replaced
  (docs/PERFORMANCE.md#the-nyström-preconditioners-apply);
- one fold form, :class:`FoldNystromBlock` (``NystromFactor.folds``): every fold and
  shift of the block CV and of the CV path that solves one λ at a time.

The products with F one row block at a time (``_ft_times``, ``_f_times``, ``_gram``,
``_woodbury``) are defined here only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

import pipeline.constants as C
from pipeline.blas_guard import gram_t
from pipeline.constants import FACTOR_ROW_STEP
from pipeline.engine import available_cores, compiled
from pipeline.engine.backend import Backend
from pipeline.engine.parallel import blas_threads
from pipeline.linalg.dense_dual import cho_factor
from pipeline.linalg.dense_memory import available_memory
from pipeline.linalg.matvec import check_shift
from pipeline.options import PRECONDITIONERS as OPTION_PRECONDITIONERS
from pipeline.storage import fingerprint_blocks, fingerprint_obj

__all__ = [
    "CENTRES",
    "FoldNystromBlock",
    "IdentityPreconditioner",
    "JacobiPreconditioner",
    "NystromFactor",
    "NystromPreconditioner",
    "build_nystrom",
    "make_preconditioner",
    "nystrom_fingerprint",
    "residual_norm",
    "uniform_centre_indices",
]

log = logging.getLogger(__name__)

PRECONDITIONERS = OPTION_PRECONDITIONERS  # (pipeline.options: the one vocabulary)

# -- products with a factor F (n x r, float32 or float64), one row block at a time ------
#: rows of F upcast to float64 at once (bounds the temporaries; pipeline.constants)
_ROW_STEP = FACTOR_ROW_STEP


def _ft_times(F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``Fᵀ R`` in float64, F upcast one row block at a time (no n x r float64 copy)."""
    out = np.zeros((F.shape[1], R.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out += np.asarray(F[s : s + _ROW_STEP], dtype=np.float64).T @ R[s : s + _ROW_STEP]
    return out


def _f_times(F: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``F C`` in float64, F upcast one row block at a time."""
    out = np.empty((F.shape[0], C.shape[1]))
    for s in range(0, F.shape[0], _ROW_STEP):
        out[s : s + _ROW_STEP] = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64) @ C
    return out


def _gram(F: np.ndarray) -> np.ndarray:
    """``Fᵀ F`` (r x r, float64), F upcast one row block at a time; refuses NaN/inf."""
    G = np.zeros((F.shape[1],) * 2)
    for s in range(0, F.shape[0], _ROW_STEP):
        Fb = np.asarray(F[s : s + _ROW_STEP], dtype=np.float64)
        G += gram_t(Fb)
    if not np.all(np.isfinite(G)):
        raise ValueError("the Nyström factor F contains NaN or infinite values")
    return G


def _for_applies(F: np.ndarray) -> np.ndarray:
    """The factor the applies multiply by: a float32 ``F`` as a float64 copy when that
    copy takes at most :data:`~pipeline.constants.PRECOND_F64_COPY_BYTES` (the same
    values the applies upcast to, row block by row block: the same products bit for
    bit, at about half the time), else ``F`` itself."""
    if F.dtype == np.float32 and F.size * 8 <= C.PRECOND_F64_COPY_BYTES:
        return F.astype(np.float64)
    return F


def _woodbury(
    F: np.ndarray, R: np.ndarray, inner: Any, shift: Any, mask: np.ndarray | None = None
) -> np.ndarray:
    """``(R - F inner(Fᵀ R)) / shift`` (rows outside ``mask`` keep ``R / shift``): the
    Woodbury apply of ``(F Fᵀ + μ I)⁻¹`` with ``inner`` applying ``(μ I + FᵀF)⁻¹`` (one
    operator) or a fold's ``(s I + F_TᵀF_T)⁻¹`` per column (``shift`` then per column).
    A factor of rank 0 (no pivot kept) applies ``R / shift``, without calling ``inner``
    (SciPy before 1.14 refuses an empty factor in ``cho_solve``)."""
    if F.shape[1] == 0:
        return np.divide(R, shift, dtype=np.float64)
    Y = _f_times(F, inner(_ft_times(F, R)))
    if mask is not None:
        Y *= mask
    np.subtract(R, Y, out=Y)
    Y /= shift
    return Y


class IdentityPreconditioner:
    """No preconditioning: ``apply(R) = R``."""

    def apply(self, R: np.ndarray) -> np.ndarray:
        return np.array(R, dtype=np.float64, copy=True)

    @property
    def fingerprint(self) -> str:
        return fingerprint_obj({"preconditioner": "none"})

    def __repr__(self) -> str:
        return "IdentityPreconditioner()"


class JacobiPreconditioner:
    """``M = diag(K) + μ``: rescales rows of very different magnitude.

    For a stationary kernel (RBF, Laplacian) diag(K) is constant, so Jacobi is a
    multiple of the identity and does not change CG's iterates.
    """

    def __init__(self, diag: np.ndarray, shift: float) -> None:
        d = np.asarray(diag, dtype=np.float64).ravel() + check_shift(shift)
        if not np.all(d > 0):
            raise ValueError(
                f"Jacobi needs diag(K) + shift > 0, got minimum {d.min():.3e}; "
                "the kernel diagonal must be non-negative"
            )
        self.inv_diag = 1.0 / d
        self.shift = float(shift)

    @classmethod
    def from_operator(cls, op: Any) -> JacobiPreconditioner:
        return cls(op.diagonal(), op.shift)

    def apply(self, R: np.ndarray) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        return R * (self.inv_diag if R.ndim == 1 else self.inv_diag[:, None])

    @property
    def fingerprint(self) -> str:
        return fingerprint_obj(
            {
                "preconditioner": "jacobi",
                "d": fingerprint_blocks([self.inv_diag]),
                "shift": self.shift,
            }
        )

    def __repr__(self) -> str:
        return f"JacobiPreconditioner(n={self.inv_diag.size}, shift={self.shift!r})"


#: the apply a Nyström fingerprint names: the Cholesky-form Woodbury of
#: :class:`NystromPreconditioner`. Added when the eigen form (U from ``eigh(FᵀF)``) was
#: retired, so that a CG checkpoint written with the eigen form is never resumed with
#: this one (its iterates differ in the last bits): such a run restarts from iteration 0
NYSTROM_FORM = "woodbury-cholesky"


def nystrom_fingerprint(
    shift: float,
    rank: int,
    summary: np.ndarray,
    info: dict,
    *,
    exclude: tuple[str, ...] = ("pivots", "history", "seconds"),
) -> str:
    """Fingerprint of a Nyström preconditioner (CG checkpoints key on it): its apply
    form (:data:`NYSTROM_FORM`), shift, rank, the 8 leading values of its summary of F
    and the build info (less ``exclude``: the pivots, the adaptive build's history and
    its timing)."""
    return fingerprint_obj(
        {
            "preconditioner": "nystrom",
            "form": NYSTROM_FORM,
            "shift": shift,
            "rank": rank,
            "eig": [float(v) for v in summary[:8]],
            **{k: v for k, v in info.items() if k not in exclude},
        }
    )


def _itemsize(F: Any) -> int:
    """Bytes per entry of ``F`` (a NumPy or CuPy dtype's ``itemsize``; the array API's
    ``finfo(dtype).bits`` for the others)."""
    size = getattr(F.dtype, "itemsize", None)
    return int(size) if size is not None else F.__array_namespace__().finfo(F.dtype).bits // 8


class NystromPreconditioner:
    """``(F Fᵀ + μ I)⁻¹`` for a factor F (n x r) kept in its own dtype: the one apply.

    ``P⁻¹ R = (R - F (μI + FᵀF)⁻¹ Fᵀ R) / μ`` (Woodbury, as in FALKON), with the
    r x r Cholesky of ``μI + FᵀF`` computed in float64. F is upcast to float64 one
    row block at a time, so the map is linear and, for the stored F, exactly
    ``(F Fᵀ + μ I)⁻¹`` up to float64 rounding: symmetric positive definite. A float32
    F halves the memory; a float64 one applies about twice as fast.

    Parameters
    ----------
    F : array, shape (n, r), float32 or float64
        Low-rank factor with ``K ≈ F Fᵀ`` (other dtypes are converted to float64): a
        host array, or an array of ``backend`` (already on its device: used as it is,
        with no copy through the host).
    shift : float
        μ, the value added to K's diagonal in the system being solved.
    info : dict, optional
        What built F (method, rank, seed...), kept for the fingerprint (its
        ``pivots``, ``history`` and ``seconds`` excluded).
    backend : Backend, optional
        Where the apply runs (:mod:`pipeline.engine.backend`): a device backend keeps F on
        the device (uploaded once, in its dtype), forms FᵀF and both products of every
        apply there, row block by row block in float64, and only the r x r solve on the
        host: a GPU fit's CG then moves one vector each way per apply. Default: the host.

    Attributes
    ----------
    summary : ndarray, shape (r,)
        ``diag(C)² - μ`` in decreasing order (C the Cholesky factor of ``μI + FᵀF``):
        a cheap summary of F for the fingerprint (FᵀF's eigenvalues when F's columns
        are orthogonal).
    """

    def __init__(
        self, F: np.ndarray, shift: float, info: dict | None = None, backend: Backend | None = None
    ) -> None:
        self._be = None if backend is None or backend.is_host else backend
        if self._be is not None and self._be.holds(F):  # on the device already
            xp = self._be.xp
            if F.dtype not in (xp.float32, xp.float64):
                F = xp.astype(F, xp.float64)
        else:
            F = F if isinstance(F, np.ndarray) else np.asarray(F)
            if F.dtype not in (np.float32, np.float64):
                F = F.astype(np.float64)
        if F.ndim != 2:
            raise ValueError(f"F must be 2-D (n, r), got shape {tuple(F.shape)}")
        self.shift = check_shift(shift)
        # F uploaded once in its dtype (as it is when it lives on the backend already)
        self._Fd = None if self._be is None else F if self._be.holds(F) else self._be.asarray(F)
        G = _gram(F) if self._be is None else self._device_gram()
        # Woodbury with a Cholesky of μI + FᵀF (r³/3 flops), not an eigendecomposition
        G[np.diag_indices_from(G)] += self.shift
        self._chol = cho_factor(G, overwrite_a=True)
        d = np.diag(self._chol[0])
        self.F = F
        self._Fa = _for_applies(F) if self._be is None else None  # F for the host applies
        self.summary = np.sort(d**2 - self.shift)[::-1]
        self.rank = int(F.shape[1])
        self.info = dict(info or {})

    @property
    def nbytes(self) -> int:
        """F's bytes (what the memory budget caps; the applies' float64 copy, at most
        :data:`~pipeline.constants.PRECOND_F64_COPY_BYTES`, is not counted)."""
        return int(self.F.shape[0] * self.F.shape[1] * _itemsize(self.F))

    def _device_blocks(self):
        xp = self._be.xp
        n = int(self._Fd.shape[0])
        for s in range(0, n, _ROW_STEP):
            yield s, xp.astype(self._Fd[s : min(n, s + _ROW_STEP), :], xp.float64)

    def _device_gram(self) -> np.ndarray:
        xp = self._be.xp
        G = None
        for _, Fb in self._device_blocks():
            P = xp.matmul(xp.matrix_transpose(Fb), Fb)
            G = P if G is None else G + P
        G = self._be.to_numpy(G)
        if not np.all(np.isfinite(G)):
            raise ValueError("the Nyström factor F contains NaN or infinite values")
        return G

    def _device_apply(self, R2: np.ndarray) -> np.ndarray:
        """The same Woodbury apply with F's products on the device (row blocks in order)."""
        be, xp = self._be, self._be.xp
        Rd = be.asarray(np.ascontiguousarray(R2), dtype="float64")
        T = None
        for s, Fb in self._device_blocks():
            P = xp.matmul(xp.matrix_transpose(Fb), Rd[s : s + int(Fb.shape[0]), :])
            T = P if T is None else T + P
        C = be.asarray(scipy.linalg.cho_solve(self._chol, be.to_numpy(T), check_finite=False))
        out = np.empty(R2.shape, dtype=np.float64)
        for s, Fb in self._device_blocks():
            e = s + int(Fb.shape[0])
            out[s:e] = be.to_numpy((Rd[s:e, :] - xp.matmul(Fb, C)) / self.shift)
        return out

    def apply(self, R: np.ndarray) -> np.ndarray:
        R = np.asarray(R, dtype=np.float64)
        one_d = R.ndim == 1
        R2 = R.reshape(R.shape[0], -1)
        if self._be is not None:
            out = self._device_apply(R2)
            return out[:, 0] if one_d else out
        out = _woodbury(
            self._Fa, R2, lambda T: scipy.linalg.cho_solve(self._chol, T, check_finite=False),
            self.shift,
        )  # fmt: skip
        return out[:, 0] if one_d else out

    @property
    def fingerprint(self) -> str:
        return nystrom_fingerprint(self.shift, self.rank, self.summary, self.info)

    def __repr__(self) -> str:
        return (
            f"NystromPreconditioner(n={self.F.shape[0]}, rank={self.rank}, "
            f"shift={self.shift!r}, dtype={self.F.dtype}, method={self.info.get('method')!r})"
        )


# ---------------------------------------------------------------------------
# low-rank factors
# ---------------------------------------------------------------------------
def _check_rank(rank: int, n: int) -> int:
    if int(rank) != rank or rank < 1:
        raise ValueError(f"rank must be an integer >= 1, got {rank!r}")
    if rank > n:
        raise ValueError(f"rank {rank} is larger than the number of samples N={n}; use rank <= N")
    return int(rank)


def _rejection_cholesky(H: np.ndarray, d: np.ndarray, u: np.ndarray, lmax: int) -> list[int]:
    """Accept candidate j with probability (Schur diag)_jj / d_j, updating the Schur
    complement of the candidates' block ``H`` (scratch: its lower triangle is updated in
    place) as each is accepted: the rejection step of accelerated RPCholesky, at most
    ``lmax`` accepted. Compiled: :func:`_rejection_loop`."""
    H = np.ascontiguousarray(H, dtype=np.float64)
    accepted = np.empty(H.shape[0], dtype=np.int64)
    n_accepted = _rejection_loop(
        H, np.asarray(d, dtype=np.float64), np.asarray(u, dtype=np.float64), int(lmax), accepted
    )
    return accepted[:n_accepted].tolist()


@compiled.lazy
def _rejection_loop(H, d, u, lmax, accepted):  # pragma: no cover (compiled by numba)
    """The rejection step's loop: for each candidate j in turn, accept it when
    ``u_j d_j <= H_jj`` (H_jj > 0), then subtract ``c cᵀ`` (``c = H[j+1:, j] / √H_jj``)
    from the lower triangle of the trailing block. Each entry gets the operations NumPy's
    ``H[j+1:, j+1:] -= np.outer(c, c)`` gives it, in the same order: the same bits, a
    fifth of the time (no b x b temporary, half the entries). Writes the accepted
    candidates into ``accepted`` and returns their count."""
    b = H.shape[0]
    col = np.empty(b)
    count = 0
    for j in range(b):
        hjj = H[j, j]
        if not (hjj > 0) or u[j] * d[j] > hjj:
            continue
        accepted[count] = j
        count += 1
        if count == lmax:
            break
        s = np.sqrt(hjj)
        for i in range(j + 1, b):
            col[i] = H[i, j] / s
        for i in range(j + 1, b):
            ci = col[i]
            for k in range(j + 1, i + 1):
                H[i, k] -= ci * col[k]
    return count


@compiled.warms_up
def _warm_up() -> None:
    """Compile the rejection step's loop (:func:`pipeline.engine.compiled.warm_up`)."""
    _rejection_cholesky(np.eye(4), np.ones(4), np.zeros(4), 2)


class _NoStop:
    """No stopping rule besides the rank: the fixed-rank ``_rpcholesky``."""

    def done(self) -> bool:
        return False

    def grew(self, store: Any, k0: int, k1: int) -> None:
        pass

    def exhausted(self) -> None:
        pass


def _device_backend(op: Any) -> Backend | None:
    """The device backend whose arrays ``op`` can hand out (``op.backend`` when it is a
    :class:`~pipeline.engine.backend.Backend` off the host: CuPy, or array_api_strict in
    the tests), else None: the pivoted Cholesky then keeps its factor there."""
    be = getattr(op, "backend", None)
    return be if isinstance(be, Backend) and not be.is_host else None


class _HostFactor:
    """The pivoted Cholesky's factor F (n x cap) in host memory, and the loop's steps
    that touch it (NumPy; untouched pages of the buffer cost no memory)."""

    def __init__(self, n: int, cap: int, dtype: Any) -> None:
        self.F = np.zeros((n, cap), dtype=dtype)

    def gram(self, idx: np.ndarray, k: int) -> np.ndarray:
        """``F[idx, :k] F[idx, :k]ᵀ`` in float64 (host)."""
        Fc = np.asarray(self.F[idx, :k], dtype=np.float64)
        return Fc @ Fc.T

    def rows(self, idx: np.ndarray, k0: int, k1: int) -> np.ndarray:
        """``F[idx, k0:k1]`` as stored, upcast to float64 (host)."""
        return np.asarray(self.F[idx, k0:k1], dtype=np.float64)

    def add(self, op: Any, T: np.ndarray, k: int) -> np.ndarray:
        """Store the pivots ``T``'s columns ``F[:, k:k+|T|] = (K[:, T] - F Fᵀ[:, T]) L⁻ᵀ``
        (``L`` the Cholesky of that residual's rows T) and return their squared row
        norms (n,): what the residual diagonal loses."""
        n = self.F.shape[0]
        G = np.asarray(op.columns(T), dtype=np.float64)  # a new array: updated in place
        if k:
            FT = np.asarray(self.F[T, :k], dtype=np.float64)
            for s in range(0, n, _ROW_STEP):
                G[s : s + _ROW_STEP] -= np.asarray(self.F[s : s + _ROW_STEP, :k], np.float64) @ FT.T
        L = _safe_cholesky(G[T])
        Fn = scipy.linalg.solve_triangular(L, G.T, lower=True, check_finite=False).T
        del G
        self.F[:, k : k + T.size] = Fn
        return np.einsum("ij,ij->i", Fn, Fn)

    def result(self, k: int) -> np.ndarray:
        return self.F[:, :k]


class _DeviceFactor:
    """The pivoted Cholesky's factor F on a device backend (``be``), and the same steps
    there: every O(n·k) product (the update of the new columns by F in float64 row
    blocks, their triangular solve, their squared row norms) runs on the device; only
    the candidates' and pivots' small blocks and one n-vector per round cross to the
    host. The buffer holds all ``cap`` columns when they take at most half the free
    device memory, else it starts smaller and doubles as the rank grows."""

    def __init__(self, be: Backend, n: int, cap: int, dtype: Any) -> None:
        self.be, self.xp, self.n, self.cap = be, be.xp, n, cap
        self.dtype = be.dtype(dtype)
        col = n * np.dtype(dtype).itemsize
        mem = be.memory()
        width = (
            cap if mem is None or cap * col <= mem[0] // 2 else max(1, min(cap, mem[0] // 4 // col))
        )
        self.F = self.xp.zeros((n, width), dtype=self.dtype)

    def _index(self, idx: np.ndarray) -> Any:
        return self.be.asarray(np.asarray(idx, dtype=np.int64))

    def _take(self, idx: np.ndarray, k0: int, k1: int) -> Any:
        return self.xp.take(self.F[:, k0:k1], self._index(idx), axis=0)

    def gram(self, idx: np.ndarray, k: int) -> np.ndarray:
        """``F[idx, :k] F[idx, :k]ᵀ`` in float64, formed on the device, on the host."""
        xp = self.xp
        if not k:
            return np.zeros((idx.size, idx.size))
        Fc = xp.astype(self._take(idx, 0, k), xp.float64)
        return self.be.to_numpy(xp.matmul(Fc, xp.matrix_transpose(Fc)))

    def rows(self, idx: np.ndarray, k0: int, k1: int) -> np.ndarray:
        """``F[idx, k0:k1]`` as stored (gathered on the device), float64 on the host."""
        return np.asarray(self.be.to_numpy(self._take(idx, k0, k1)), dtype=np.float64)

    def _reserve(self, k: int, need: int) -> None:
        """Widen the buffer (doubling, at most ``cap`` columns) to hold ``need`` columns."""
        width = int(self.F.shape[1])
        if need <= width:
            return
        wider = self.xp.zeros((self.n, min(self.cap, max(2 * width, need))), dtype=self.dtype)
        wider[:, :k] = self.F[:, :k]
        self.F = wider

    def add(self, op: Any, T: np.ndarray, k: int) -> np.ndarray:
        """As :meth:`_HostFactor.add`, on the device; returns the squared row norms (n,)
        on the host (the one O(n) copy of a round)."""
        be, xp, n = self.be, self.xp, self.n
        self._reserve(k, k + T.size)
        G = op.columns(T, on_device=True)  # a new device array: updated in place
        Td = self._index(T)
        if k:
            FT = xp.astype(xp.take(self.F[:, :k], Td, axis=0), xp.float64)
            for s in range(0, n, _ROW_STEP):
                e = min(n, s + _ROW_STEP)  # (the array API has no slice past the end)
                Gb = G[s:e, :]
                Ub = be.gemm_nt_sub(Gb, xp.astype(self.F[s:e, :k], xp.float64), FT)
                if Ub is not Gb:  # (CuPy updates the row block in place)
                    G[s:e, :] = Ub
        L = _safe_cholesky(be.to_numpy(xp.take(G, Td, axis=0)))
        Fn = be.trsm_right_lower_t(be.asarray(L), G)  # (L⁻¹ Gᵀ)ᵀ
        del G
        self.F[:, k : k + T.size] = xp.astype(Fn, self.dtype, copy=False)
        return be.to_numpy(xp.sum(Fn * Fn, axis=1))

    def result(self, k: int) -> Any:
        """``F[:, :k]``: a new array when the buffer is wider (its memory is freed)."""
        if k == int(self.F.shape[1]):
            return self.F
        F = self.xp.empty((self.n, k), dtype=self.dtype)
        F[:, :] = self.F[:, :k]
        self.F = F
        return F


def _pivoted_cholesky(
    op: Any,
    cap: int,
    rng: np.random.Generator,
    *,
    block: int,
    dtype: Any = np.float64,
    max_rounds: int | None = None,
    max_stalls: int | None = None,
    stop: Any = None,
) -> tuple[Any, np.ndarray, dict]:
    """The one randomly pivoted Cholesky (accelerated, blockwise; Epperly, Tropp & Webber):
    ``K ≈ F Fᵀ`` with at most ``cap`` pivots, F stored in ``dtype``.

    Each round draws ``block`` candidates with probability proportional to the residual
    diagonal, accepts some by rejection sampling, and adds their columns (one ``columns``
    call). It ends at ``cap`` pivots, when the residual trace vanishes (``1e-14`` of the
    initial one), after ``max_rounds`` rounds or ``max_stalls`` consecutive rounds that
    accepted no pivot, or when ``stop.done()`` says so (checked before each round;
    ``stop.grew(store, k0, k1)`` is told of the new columns ``k0:k1``, which
    ``store.rows`` reads as stored, and ``stop.exhausted()`` of a vanished trace): the
    adaptive stopping rule of ``_adaptive_rpcholesky``.

    On an operator with a device backend (``op.backend`` off the host: a GPU through
    CuPy) F stays on the device and every O(n·k) step runs there (``_DeviceFactor``):
    per round the host sends the candidates and pivots (and the pivots' r x r Cholesky
    factor) and receives the candidates' and the pivots' small blocks and the n-vector
    by which the residual diagonal falls. The random draws, the rejection step and the
    diagonal stay on the host, in the same order, so both paths pick the same pivots
    for the same rounding. Returns ``(F[:, :k], pivots, {"rounds", "trace",
    "trace0"})``, F an array of that backend.
    """
    stop = stop if stop is not None else _NoStop()
    n = int(op.n)
    d = np.array(op.diagonal(), dtype=np.float64)
    trace0 = float(d.sum())
    be = _device_backend(op)
    store = _HostFactor(n, cap, dtype) if be is None else _DeviceFactor(be, n, cap, dtype)
    pivots: list[int] = []
    k = 0
    rounds = stalls = 0
    while k < cap and (max_rounds is None or rounds < max_rounds):
        if stop.done():
            break
        total = d.sum()
        if not (total > trace0 * 1e-14):
            stop.exhausted()
            break
        rounds += 1
        cand = rng.choice(n, size=block, replace=True, p=d / total)
        H = op.submatrix(cand) - store.gram(cand, k)
        accepted = _rejection_cholesky(H, d[cand], rng.random(cand.size), cap - k)
        if not accepted:
            stalls += 1
            if max_stalls is not None and stalls > max_stalls:
                break
            continue
        stalls = 0
        T = np.unique(cand[accepted])  # duplicates have zero Schur diagonal after the first
        d -= store.add(op, T, k)
        np.maximum(d, 0.0, out=d)
        d[T] = 0.0
        pivots.extend(int(t) for t in T)
        stop.grew(store, k, k + T.size)
        k += T.size
    record = {"rounds": rounds, "trace": float(d.sum()), "trace0": trace0}
    return store.result(k), np.asarray(pivots, dtype=np.int64), record


def _rpcholesky(
    op: Any,
    rank: int,
    *,
    block: int | None = None,
    random_state: int | np.random.Generator | None = 0,
    max_rounds: int | None = None,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """Randomly pivoted Cholesky (accelerated, blockwise): ``K ≈ F Fᵀ``, F of shape (n, r).

    The fixed-rank call of the one pivoted Cholesky (``_pivoted_cholesky``;
    ``_adaptive_rpcholesky`` is its adaptive-stopping call), for
    ``build_nystrom(centres="rpcholesky")``.

    Parameters
    ----------
    op : KernelOperator (or anything with ``n``, ``diagonal``, ``columns``, ``submatrix``)
    rank : int
        Number of pivots r (1 <= r <= N).
    block : int, optional
        Candidates drawn per round (default ``ceil(r/2)``, at most 1000). Each
        accepted batch costs one blockwise ``columns`` call of N x batch.
    random_state : int or Generator
    max_rounds : int, optional
        Stop after this many rounds even if fewer than r pivots were accepted
        (default ``20 + 4 r / block``).
    dtype : float32 or float64
        Storage dtype of F (the loop reads back the stored columns).

    Returns
    -------
    F : array, shape (n, k), k <= rank (fewer only if the residual vanished)
        NumPy; on the operator's device when it has a device backend.
    pivots : ndarray of int, shape (k,)
    """
    n = int(op.n)
    rank = _check_rank(rank, n)
    rng = np.random.default_rng(random_state)
    b = int(block) if block is not None else min(1000, max(1, -(-rank // 2)))
    max_rounds = max_rounds if max_rounds is not None else 20 + 4 * (-(-rank // b))
    F, pivots, rec = _pivoted_cholesky(op, rank, rng, block=b, max_rounds=max_rounds, dtype=dtype)
    log.info(
        "RPCholesky: rank %d in %d rounds, residual trace %.3e of %.3e",
        F.shape[1],
        rec["rounds"],
        rec["trace"],
        rec["trace0"],
    )
    return F, pivots


def _safe_cholesky(S: np.ndarray) -> np.ndarray:
    S = 0.5 * (S + S.T)
    jitter = 0.0
    scale = max(float(np.max(np.diag(S))), np.finfo(float).tiny)
    for _ in range(8):
        try:
            return scipy.linalg.cholesky(S + jitter * np.eye(S.shape[0]), lower=True)
        except np.linalg.LinAlgError:
            jitter = scale * 1e-12 if jitter == 0 else jitter * 100
    raise np.linalg.LinAlgError("pivot block is not positive definite even with jitter")


def uniform_centre_indices(
    n: int, rank: int, *, random_state: int | np.random.Generator | None = 0
) -> np.ndarray:
    """The ``rank`` uniformly sampled centres (sorted row indices of ``0..n-1``) of
    ``build_nystrom(centres="uniform")``, without evaluating K: the one sampling recipe,
    also the centres of the Nyström solver (:mod:`pipeline.linalg.nystrom_solve`)."""
    rank = _check_rank(rank, int(n))
    rng = np.random.default_rng(random_state)
    return np.sort(rng.choice(int(n), size=rank, replace=False))


def _uniform_centres(
    op: Any,
    rank: int,
    *,
    random_state: int | np.random.Generator | None = 0,
    dtype: Any = np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """Nyström factor from r uniformly sampled centres S: ``F = K[:, S] L⁻ᵀ``, ``K_SS = L Lᵀ``.

    Returns ``(F, centres)``. The centre block gets a tiny relative jitter when it
    is numerically singular (duplicate points).
    """
    S = uniform_centre_indices(int(op.n), rank, random_state=random_state)
    C = op.columns(S)
    W = 0.5 * (C[S] + C[S].T)
    # eigen-based square root: robust when K_SS is singular
    w, V = scipy.linalg.eigh(W)
    keep = w > max(w.max(), 0) * 1e-12 * rank
    F = (C @ V[:, keep]) / np.sqrt(w[keep])
    return F.astype(dtype, copy=False), S


# -- adaptive rank ----------------------------------------------------------------------


def _subsample_rho(op: Any, E: np.ndarray, v0: np.ndarray | None) -> tuple[float, np.ndarray]:
    """``(N/m) λ_max(E)`` for the residual ``E = K_SS - F_S F_Sᵀ`` on the subsample S,
    and the top eigenvector (the warm start of the next round's Lanczos)."""
    m = E.shape[0]
    if m <= 64:
        w, V = np.linalg.eigh(E)
        top, vec = float(w[-1]), V[:, -1]
    else:  # Lanczos on the m x m residual (a full eigh costs seconds at m = 2000)
        if v0 is None:
            v0 = np.random.default_rng(m).standard_normal(m)
        w, V = scipy.sparse.linalg.eigsh(E, k=1, which="LA", v0=v0, tol=1e-2)
        top, vec = float(w[0]), V[:, 0]
    return max(top, 0.0) * op.n / m, vec


def residual_norm(op: Any, F: np.ndarray, *, iterations: int = 8, random_state: Any = 0) -> float:
    """Power-iteration estimate of ``‖K - F Fᵀ‖₂`` with the operator's product
    (``iterations`` products; ``op.matvec`` includes the shift, removed here)."""
    rng = np.random.default_rng(random_state)
    v = rng.standard_normal(op.n)
    v /= np.linalg.norm(v)
    rho = 0.0
    for _ in range(int(iterations)):
        w = np.asarray(op.matvec(v), dtype=np.float64) - op.shift * v
        w -= _f_times(F, _ft_times(F, v[:, None]))[:, 0]
        rho = float(np.linalg.norm(w))
        if rho == 0.0:
            break
        v = w / rho
    return rho


def _adaptive_rpcholesky(
    op: Any,
    shift: float,
    *,
    factor: float = C.ADAPTIVE_FACTOR,
    block: int = 250,
    memory_budget: int | None = C.ADAPTIVE_MEMORY_BUDGET,
    max_rank: int | None = None,
    dtype: Any = np.float32,
    sample: int = 1500,
    random_state: int | np.random.Generator | None = 0,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Grow a randomly pivoted Cholesky factor until ``ρ̂ <= factor · shift``.

    Parameters
    ----------
    op : KernelOperator (``n``, ``diagonal``, ``columns``, ``submatrix``)
    shift : float
        μ, the diagonal shift of the system CG will solve.
    factor : float
        Target ``ρ̂ / μ`` (the preconditioned condition number is ``<= 1 + factor``).
    block : int
        Candidate pivots drawn per round (one ``columns`` call per round).
    memory_budget : int or None
        Bytes the factor may occupy; the rank is capped at
        ``memory_budget // (N · itemsize)`` and a capped build logs a warning. None:
        ``max_rank`` is the only cap (a caller whose rank cap already priced the memory,
        :func:`~pipeline.constants.preconditioner_rank` or the CV's ``cg_rank``).
    max_rank : int, optional
        A further cap on the rank (default N).
    dtype : float32 or float64
        Storage dtype of F.
    sample : int
        Rows of the subsample on which ``ρ`` is estimated (at most N).
    random_state : int or Generator

    Returns
    -------
    F : array, shape (N, k)
        A view of the first k columns of the (N, cap) buffer (pages past k are
        never touched, so they take no memory); on the operator's device when it has
        a device backend (there a new (N, k) array when the buffer was wider).
    pivots : ndarray of int, shape (k,)
    info : dict
        ``rank``, ``rho_estimate``, ``target``, ``capped``, ``cap``, ``rounds``,
        ``seconds``, ``history`` (rank, ρ̂) per round.
    """
    n = int(op.n)
    mu = check_shift(shift)
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a positive number, got {factor!r} (e.g. factor=5)")
    if int(block) < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    budget_rank = n if memory_budget is None else int(memory_budget) // (n * dtype.itemsize)
    if budget_rank < 1:
        raise ValueError(
            f"memory_budget={memory_budget} bytes cannot hold even one column of the "
            f"{n} x r factor ({n * dtype.itemsize} bytes per column); raise it"
        )
    cap = min(n, budget_rank, int(max_rank) if max_rank is not None else n)
    rng = np.random.default_rng(random_state)
    t0 = time.perf_counter()
    sample_rows = rng.choice(n, size=min(int(sample), n), replace=False)
    stop = _ResidualStop(op, sample_rows, factor * mu, mu)
    F, pivots, rec = _pivoted_cholesky(
        op, cap, rng, block=int(block), dtype=dtype, max_stalls=20, stop=stop
    )
    k, rho, target, rounds, history = F.shape[1], stop.rho, stop.target, rec["rounds"], stop.history
    capped = rho > target and k >= cap
    by_memory = cap == budget_rank and cap < min(n, int(max_rank) if max_rank is not None else n)
    info = {
        "method": "rpcholesky-adaptive",
        "rank": k,
        "rho_estimate": float(rho),
        "target": float(target),
        "factor": float(factor),
        "capped": bool(capped),
        "cap": int(cap),
        "rounds": rounds,
        "seconds": time.perf_counter() - t0,
        "history": history,
        "dtype": str(dtype),
    }
    if capped and not by_memory:  # the rank cap asked for (the plan's: it scales with N)
        log.info(
            "adaptive RPCholesky: stopped at its rank cap %d (%.1f s): estimated "
            "|K - F F^T| / shift = %.3g (target %.3g), so CG needs a few more iterations",
            k,
            info["seconds"],
            rho / mu,
            factor,
        )
    elif capped:
        log.warning(
            "adaptive RPCholesky capped at rank %d (memory budget %.2f GB for N=%d in %s): "
            "estimated |K - F F^T| / shift = %.3g > target %.3g, so CG may need more "
            "iterations; raise the memory budget, raise lambda, or use the Cholesky solver",
            k,
            memory_budget / 1e9,
            n,
            dtype,
            rho / mu,
            factor,
        )
    elif rho > target:  # no pivot accepted in 20 tries: the residual is numerically exhausted
        log.info(
            "adaptive RPCholesky: stopped at rank %d after %d rounds (%.1f s): no new pivot "
            "was accepted in 20 tries; estimated |K - F F^T| / shift = %.3g (target %.3g)",
            k,
            rounds,
            info["seconds"],
            rho / mu,
            factor,
        )
    else:
        log.info(
            "adaptive RPCholesky: rank %d in %d rounds (%.1f s), estimated |K - F F^T| / shift "
            "= %.3g <= %.3g",
            k,
            rounds,
            info["seconds"],
            rho / mu,
            factor,
        )
    return F, pivots, info


class _ResidualStop:
    """The adaptive stopping rule: stop once the subsample estimate ``ρ̂`` of
    ``‖K - F Fᵀ‖₂`` is at most ``target`` (see ``_adaptive_rpcholesky``); keeps the
    residual ``K_SS - F_S F_Sᵀ`` on the fixed random subsample S up to date."""

    def __init__(self, op: Any, sample: np.ndarray, target: float, shift: float) -> None:
        self.op, self.S, self.target, self.shift = op, np.sort(sample), target, shift
        self.E_SS = np.array(op.submatrix(self.S), dtype=np.float64)
        self.rho, self.v_top = _subsample_rho(op, self.E_SS, None)
        self.history: list[tuple[int, float]] = []

    def done(self) -> bool:
        return self.rho <= self.target

    def grew(self, store: Any, k0: int, k1: int) -> None:
        FnS = store.rows(self.S, k0, k1)  # as stored, float64 on the host
        self.E_SS -= FnS @ FnS.T
        self.rho, self.v_top = _subsample_rho(self.op, self.E_SS, self.v_top)
        self.history.append((k1, self.rho))
        log.debug(
            "adaptive RPCholesky: rank %d, estimated rho/shift %.3g", k1, self.rho / self.shift
        )

    def exhausted(self) -> None:
        self.rho = 0.0


# -- the fold variants: one factor of the full K, restricted to each fold's rows ----------
class FoldNystromBlock:
    """``(F_T F_Tᵀ + s I)⁻¹`` for each column's fold T and shift s, on padded columns.

    The one fold form: the preconditioner of the block PCG over every
    (λ, fold) system (:func:`pipeline.models.selection.blockcg.block_pcg`) and, on the
    stacked fold vectors padded to n rows, of the CV path that solves one λ at a time
    (:func:`pipeline.models.selection.cgpath.cg_fold_predictions`). One factor F of the full
    K, restricted to each fold by Woodbury, ``(F_T F_Tᵀ + s I)⁻¹ = (I - F_T (s I +
    F_Tᵀ F_T)⁻¹ F_Tᵀ) / s``, with ``F_Tᵀ F_T = V diag(w) Vᵀ`` (one r x r
    eigendecomposition per fold, shared by every λ: only ``1/(w + s)`` changes).

    Parameters
    ----------
    F : ndarray (n, r), float32 or float64, or None
        Nyström factor of the full K (None or r = 0: the scaled identity ``I / s``).
    trains : list of index arrays
        Each fold's training rows; ``F_Tᵀ F_T`` is ``FᵀF`` minus the other rows' part.
    """

    def __init__(self, F: np.ndarray | None, trains: Sequence[np.ndarray]) -> None:
        self.F = None if F is None or F.shape[1] == 0 else F
        self.eig: list[tuple[np.ndarray, np.ndarray]] = []
        if self.F is None:
            return
        self._Fa = _for_applies(self.F)
        G = _gram(self.F)
        n = self.F.shape[0]

        def fold_eig(tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out = np.ones(n, dtype=bool)
            out[np.asarray(tr)] = False
            Fv = np.asarray(self.F[out], dtype=np.float64)
            w, V = scipy.linalg.eigh(G - gram_t(Fv), check_finite=False)
            return np.maximum(w, 0.0), V

        # one r x r eigendecomposition per fold, the folds on a thread pool with BLAS at
        # one thread each (LAPACK releases the GIL; a 2-thread OpenBLAS eigh on a busy
        # 2-core machine ran 15-30x slower than one thread)
        workers = max(1, min(available_cores(), len(trains)))
        with blas_threads(1), ThreadPoolExecutor(workers) as pool:
            self.eig = list(pool.map(fold_eig, trains))

    @property
    def rank(self) -> int:
        return 0 if self.F is None else int(self.F.shape[1])

    @property
    def nbytes(self) -> int:
        if self.F is None:
            return 0
        return int(self.F.nbytes + sum(V.nbytes for _, V in self.eig))

    def apply(
        self, R: np.ndarray, folds: np.ndarray, shifts: np.ndarray, mask: np.ndarray
    ) -> np.ndarray:
        """``M⁻¹ R`` column by column; ``mask`` (n, k) is 1 on each column's training rows."""
        if self.F is None:
            return R / shifts

        def inner(T: np.ndarray) -> np.ndarray:
            C = np.empty_like(T)
            for f in np.unique(folds):
                cols = np.flatnonzero(folds == f)
                w, V = self.eig[int(f)]
                C[:, cols] = V @ ((V.T @ T[:, cols]) / (w[:, None] + shifts[cols][None, :]))
            return C

        return _woodbury(self._Fa, R, inner, shifts, mask)


# -- the one builder -----------------------------------------------------------------------
#: how the centres (the pivots of F) are chosen: uniformly at random (FALKON's), by
#: randomly pivoted Cholesky at a fixed rank, or by RPCholesky grown until it resolves K
#: at the shift (``_adaptive_rpcholesky``)
CENTRES = ("uniform", "rpcholesky", "adaptive")


@dataclass
class NystromFactor:
    """A Nyström factor ``F`` (n x r, ``K ≈ F Fᵀ``), its centres and how it was built.

    ``centres`` are the rows of K that span F (the pivots, or the uniformly sampled
    points); ``info`` holds the build's record (``method``, ``random_state``,
    ``dtype``, ``seconds``; with ``"adaptive"`` also its ρ estimate, cap, history...).
    ``backend`` is the device backend F lives on when an RPCholesky build ran there
    (an operator with a device backend, e.g. a GPU's
    :class:`~pipeline.linalg.matvec.DeviceKernelOperator`), else None: F is a NumPy
    array. :meth:`woodbury` and :meth:`folds` give the apply of ``(F Fᵀ + μ I)⁻¹``
    for one operator or per fold; :meth:`host_factor` F on the host.
    """

    F: Any
    centres: np.ndarray
    info: dict = field(default_factory=dict)
    backend: Backend | None = None

    @property
    def rank(self) -> int:
        return int(self.F.shape[1])

    def host_factor(self) -> np.ndarray:
        """F as a NumPy array (a copy from the device when F lives there)."""
        return self.F if self.backend is None else self.backend.to_numpy(self.F)

    def woodbury(self, shift: float, backend: Backend | None = None) -> NystromPreconditioner:
        """``(F Fᵀ + shift I)⁻¹`` for one operator (F kept in its own dtype) on
        ``backend``'s device when it names one; by default where F lives (a factor
        built on a device is applied there, with no copy of F through the host). Name
        the NumPy backend for a host apply of such a factor."""
        be = self.backend if backend is None else backend
        F = self.F if be is self.backend else self.host_factor()
        return NystromPreconditioner(F, shift, info=self.info, backend=be)

    def folds(self, trains: Sequence[np.ndarray]) -> FoldNystromBlock:
        """``(F_T F_Tᵀ + s I)⁻¹`` per fold T (training rows ``trains``), any shift s: on
        the host (F copied there when it lives on a device)."""
        return FoldNystromBlock(self.host_factor(), trains)


def build_nystrom(
    op: Any,
    *,
    centres: str = "rpcholesky",
    rank: int | None = None,
    shift: float | None = None,
    max_rank: int | None = None,
    memory_budget: int | None = C.ADAPTIVE_MEMORY_BUDGET,
    factor: float = C.ADAPTIVE_FACTOR,
    block: int | None = None,
    sample: int = 1500,
    dtype: Any = None,
    random_state: Any = 0,
) -> NystromFactor:
    """The one Nyström builder: ``K ≈ F Fᵀ`` from the operator ``op``
    (``n``, ``diagonal``, ``columns``, ``submatrix``), K never formed.

    Parameters
    ----------
    op : KernelOperator (or anything with ``n``, ``diagonal``, ``columns``, ``submatrix``)
    centres : {"uniform", "rpcholesky", "adaptive"}
        ``"uniform"``: ``rank`` centres sampled uniformly, ``F = K[:, S] L⁻ᵀ``;
        ``"rpcholesky"``: ``rank`` pivots by randomly pivoted Cholesky;
        ``"adaptive"``: RPCholesky grown until ``ρ̂ = ‖K - F Fᵀ‖ <= factor · shift``
        (estimated on a subsample of ``sample`` rows) or ``max_rank`` /
        ``memory_budget`` (then ``info["capped"]`` and a warning). Both RPCholesky
        builds are the one pivoted Cholesky loop.
    rank : int
        The rank of the fixed-rank methods (1 <= rank <= N).
    shift : float
        μ, the shift the factor must resolve K at (``"adaptive"`` only).
    max_rank, memory_budget : int
        The adaptive build's caps (the rank is at most ``memory_budget // (N ·
        itemsize)``; a budget too small for one column is refused; None: ``max_rank``
        alone, for a cap that already priced the memory).
    factor : float
        The adaptive build's target ``ρ̂ / μ`` (preconditioned κ ``<= 1 + factor``).
    block : int, optional
        Candidate pivots drawn per round, one ``columns`` call per round (default
        ``ceil(rank/2)`` at most 1000 for ``"rpcholesky"``, 250 for ``"adaptive"``).
    sample : int
        Rows of the adaptive build's ρ subsample (at most N).
    dtype : float32 or float64, optional
        Storage dtype of F (default float64 for the fixed-rank methods, float32 for
        ``"adaptive"``).
    random_state : int or Generator

    Returns
    -------
    NystromFactor
        ``F`` (n x k), ``centres`` (k pivots or sampled rows) and ``info``. The
        RPCholesky builds on an operator with a device backend (``op.backend`` off the
        host, e.g. :class:`~pipeline.linalg.matvec.DeviceKernelOperator` on CuPy) run
        their O(N·r) work on that device and leave F there (``backend`` set).
    """
    if centres == "adaptive":
        if shift is None:
            raise ValueError("centres='adaptive' needs shift= (the smallest shift to resolve)")
    elif centres not in ("rpcholesky", "uniform"):
        raise ValueError(f"unknown Nyström centres {centres!r}; use one of {CENTRES}")
    elif rank is None:
        raise ValueError(f"centres={centres!r} needs rank= (the number of centres)")
    seed = random_state if not isinstance(random_state, np.random.Generator) else None
    if centres == "adaptive":
        F, piv, info = _adaptive_rpcholesky(
            op,
            shift,
            factor=factor,
            block=250 if block is None else block,
            memory_budget=memory_budget,
            max_rank=max_rank,
            dtype=np.float32 if dtype is None else dtype,
            sample=sample,
            random_state=random_state,
        )
        info["random_state"] = seed
        return NystromFactor(F, piv, info, backend=_device_backend(op))
    dtype = np.dtype(np.float64 if dtype is None else dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    t0 = time.perf_counter()
    be = None
    if centres == "rpcholesky":
        F, piv = _rpcholesky(op, rank, block=block, random_state=random_state, dtype=dtype)
        be = _device_backend(op)  # where the pivoted Cholesky kept F
    else:
        F, piv = _uniform_centres(op, rank, random_state=random_state, dtype=dtype)
    info = {
        "method": centres,
        "requested_rank": int(rank),
        "random_state": seed,
        "dtype": str(dtype),
        "seconds": time.perf_counter() - t0,
    }
    return NystromFactor(F, piv, info, backend=be)


def make_preconditioner(
    name: str | None,
    op: Any,
    *,
    rank: int | None = None,
    method: str = "rpcholesky",
    random_state: int | None = 0,
) -> IdentityPreconditioner | JacobiPreconditioner | NystromPreconditioner:
    """Build the preconditioner ``name`` (``"none"``, ``"jacobi"``, ``"nystrom"``,
    ``"adaptive"``) for the operator ``op`` (its ``shift`` is μ).

    ``"nystrom"``: a rank-``rank`` factor (default
    :data:`~pipeline.constants.DEFAULT_RANK`, capped at N) by ``method``
    (``"rpcholesky"`` or ``"uniform"``), float64; ``"adaptive"``: RPCholesky grown
    until ``‖K - F Fᵀ‖ <= ADAPTIVE_FIT_FACTOR · shift`` (one solve's target), float32, with at most ``rank`` columns (default
    :func:`~pipeline.constants.preconditioner_rank` with the memory available now: the
    rule the plan records). Both through :func:`build_nystrom`,
    applied by :class:`NystromPreconditioner`.
    """
    if name is None or name == "none":
        return IdentityPreconditioner()
    if name == "jacobi":
        return JacobiPreconditioner.from_operator(op)
    if name == "nystrom":
        rank = _check_rank(C.DEFAULT_RANK if rank is None else rank, int(op.n))
        if method not in ("rpcholesky", "uniform"):
            raise ValueError(f"unknown Nyström method {method!r}; use 'rpcholesky' or 'uniform'")
        nf = build_nystrom(op, centres=method, rank=rank, random_state=random_state)
        return nf.woodbury(op.shift)
    if name == "adaptive":
        # the rank grows until |K - F F^T| <= ADAPTIVE_FIT_FACTOR * shift or its cap
        n = int(op.n)
        if rank is None:  # the plan's rule (a fit passes the rank its plan recorded)
            cap = C.preconditioner_rank(name, None, n, available_memory())
        else:
            cap = _check_rank(min(int(rank), n), n)
        nf = build_nystrom(
            op, centres="adaptive", shift=op.shift, max_rank=cap, memory_budget=None,
            factor=C.ADAPTIVE_FIT_FACTOR, random_state=random_state,
        )  # fmt: skip
        return nf.woodbury(op.shift)
    raise ValueError(f"unknown preconditioner {name!r}; use one of {PRECONDITIONERS}")
