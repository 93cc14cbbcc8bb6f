"""The Nyström builder's device path (pipeline.linalg.precond._pivoted_cholesky with
``_DeviceFactor``) on every device backend: the array API's reference namespace here
(CI), CuPy where it and a GPU exist (``workflows/benchmarks/gpu_check.sh``), with the
same assertions. On a DeviceKernelOperator whose backend is off the host, F stays on
that backend and every O(n·k) step runs there. Checked against the host path (the same
operator on the NumPy backend, and the CPU's matrix-free operator): the same pivots, F
to rounding, the same Woodbury apply, and no copy to the host of more than a vector or a
candidates' block per round."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine.backend import Backend, cuda_available, get_backend
from pipeline.kernels import RBF
from pipeline.linalg import precond
from pipeline.linalg.matvec import DeviceKernelOperator, MatrixFreeKernelOperator
from pipeline.linalg.precond import NystromPreconditioner, build_nystrom

N = 1003  # ragged: not a multiple of the row step (300), the kernel blocks (128) or block
SHIFT = 1e-3
KERNEL = RBF(length_scale=np.linspace(0.8, 2.5, 4))  # ARD: the per-feature scales
BUILDS = {
    "rpcholesky": dict(centres="rpcholesky", rank=150, block=40),
    "adaptive": dict(
        centres="adaptive", shift=SHIFT, max_rank=240, memory_budget=None, block=50, sample=200
    ),  # fmt: skip
}
#: how close a device result comes to the host's: array-api-strict computes with NumPy
#: (the same arithmetic), CuPy with cuBLAS (other sums); a float32 build on CuPy may draw
#: a few other pivots
TOLERANCE = {
    "array_api_strict": dict(apply=1e-10, columns=(1e-13, 1e-15), float32_pivots_equal=True),
    "cupy": dict(apply=1e-8, columns=(1e-12, 1e-14), float32_pivots_equal=False),
}
DEVICES = [
    "array_api_strict",
    pytest.param(
        "cupy",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not cuda_available()[0], reason="no CuPy/GPU")],
    ),
]


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(1).standard_normal((N, 4))


@pytest.fixture(params=DEVICES)
def ops(request, X, monkeypatch):
    """The device operator and the host one (NumPy backend), with a row step that leaves
    a ragged last block."""
    if request.param == "array_api_strict":
        pytest.importorskip("array_api_strict")
    monkeypatch.setattr(precond, "_ROW_STEP", 300)
    dev = DeviceKernelOperator(X, KERNEL, SHIFT, backend=request.param, block_rows=128)
    host = DeviceKernelOperator(X, KERNEL, SHIFT, backend="numpy", block_rows=128)
    return dev, host


def _rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _on_device(F, dev) -> bool:
    return not isinstance(F, np.ndarray) and dev.backend.holds(F)


def _tol(dev) -> dict:
    return TOLERANCE[dev.backend.name]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("centres", list(BUILDS))
def test_device_build_matches_the_host_build(ops, centres, dtype):
    dev, host = ops
    kw = {**BUILDS[centres], "dtype": dtype}
    d = build_nystrom(dev, **kw)
    h = build_nystrom(host, **kw)
    assert d.backend is dev.backend and h.backend is None
    assert _on_device(d.F, dev) and isinstance(h.F, np.ndarray)  # F never left the device
    assert d.rank > 20
    Fd = d.host_factor()
    assert isinstance(Fd, np.ndarray) and Fd.dtype == h.F.dtype == np.dtype(dtype)
    R = np.random.default_rng(2).standard_normal((N, 2))
    if dtype == np.float32 and not _tol(dev)["float32_pivots_equal"]:
        assert abs(d.rank - h.rank) <= 3
        got, want = d.woodbury(SHIFT).apply(R), h.woodbury(SHIFT).apply(R)
        assert _rel(got, want) < 1e-5
        return
    assert tuple(d.F.shape) == h.F.shape
    np.testing.assert_array_equal(d.centres, h.centres)  # the same draws, the same pivots
    assert _rel(Fd, h.F) < (1e-10 if dtype == np.float64 else 1e-6)
    if centres == "adaptive":
        assert d.info["rounds"] == h.info["rounds"]
        assert d.info["rho_estimate"] == pytest.approx(h.info["rho_estimate"], rel=1e-6)


def test_device_build_picks_the_cpu_operators_pivots(X, ops):
    dev, _ = ops
    cpu = MatrixFreeKernelOperator(X, KERNEL, SHIFT, block_size=128)
    d = build_nystrom(dev, **BUILDS["rpcholesky"])
    c = build_nystrom(cpu, **BUILDS["rpcholesky"])
    assert _on_device(d.F, dev)
    np.testing.assert_array_equal(d.centres, c.centres)
    assert _rel(d.host_factor(), c.F) < 1e-10


@pytest.mark.parametrize("centres", list(BUILDS))
def test_woodbury_of_a_device_factor(ops, centres):
    dev, host = ops
    tol = _tol(dev)["apply"]
    d = build_nystrom(dev, **BUILDS[centres])
    h = build_nystrom(host, **BUILDS[centres])
    R = np.random.default_rng(3).standard_normal((N, 3))
    want = h.woodbury(SHIFT).apply(R)
    pre = d.woodbury(SHIFT)  # applied where F lives: no copy of F through the host
    assert pre._be is dev.backend and pre.F is d.F and pre._Fd is d.F
    assert pre.nbytes == h.woodbury(SHIFT).nbytes == N * d.rank * np.dtype(h.F.dtype).itemsize
    assert _rel(pre.apply(R), want) < tol
    assert _rel(pre.apply(R[:, 0]), want[:, 0]) < tol
    # the preconditioner takes a factor already on its backend as it is
    direct = NystromPreconditioner(d.F, SHIFT, backend=dev.backend)
    assert direct.F is d.F and _rel(direct.apply(R), want) < tol
    # a host apply (the NumPy backend named) and the fold form get F on the host
    on_host = d.woodbury(SHIFT, backend=get_backend("numpy"))
    assert isinstance(on_host.F, np.ndarray) and _rel(on_host.apply(R), want) < tol
    trains = [np.arange(0, N, 2), np.arange(1, N, 2)]
    folds, folds_h = d.folds(trains), h.folds(trains)
    assert isinstance(folds.F, np.ndarray)
    fold_of, shifts = np.array([0, 1, 0]), np.array([SHIFT, 2 * SHIFT, 0.1])
    mask = np.zeros((N, 3))
    for j, f in enumerate(fold_of):
        mask[trains[f], j] = 1.0
    assert _rel(folds.apply(R, fold_of, shifts, mask), folds_h.apply(R, fold_of, shifts, mask)) < (
        tol
    )


def test_columns_on_device(ops):
    dev, host = ops
    rtol, atol = _tol(dev)["columns"]
    idx = [5, 0, N - 1, 140, 141]
    C = dev.columns(idx, on_device=True)
    assert _on_device(C, dev)
    assert isinstance(dev.columns(idx), np.ndarray)  # the default: a host copy
    assert dev.backend.to_numpy(C).dtype == np.float64
    np.testing.assert_array_equal(dev.backend.to_numpy(C), dev.columns(idx))
    np.testing.assert_allclose(dev.columns(idx), host.columns(idx), rtol=rtol, atol=atol)


@pytest.mark.parametrize("centres", list(BUILDS))
def test_no_factor_sized_copy_to_the_host(ops, centres, monkeypatch):
    """Per round only O(n) (the diagonal's fall) and O(block²), O(sample·block) blocks
    come to the host: never K's new columns (n x |T|) or F (n x k)."""
    dev, _ = ops
    sizes: list[int] = []
    to_numpy = Backend.to_numpy

    def counted(self, a):
        if self.name == dev.backend.name:
            sizes.append(int(np.prod(a.shape)))
        return to_numpy(self, a)

    draws: list[int] = []  # one submatrix of the candidates per round
    submatrix = dev.submatrix

    def counted_submatrix(idx):
        draws.append(len(idx))
        return submatrix(idx)

    monkeypatch.setattr(Backend, "to_numpy", counted)
    monkeypatch.setattr(dev, "submatrix", counted_submatrix)
    kw = dict(BUILDS[centres])
    if centres == "adaptive":
        kw.update(shift=1e-9, sample=100)  # never resolved: it runs to its rank cap
    nf = build_nystrom(dev, **kw)
    assert _on_device(nf.F, dev)
    b, m, k = kw["block"], kw.get("sample", 0), nf.rank
    rounds = draws.count(b)
    assert rounds >= 3 and sizes
    assert max(sizes) <= max(N, b * b, m * b, m * m)
    bound = rounds * (N + 3 * b * b + m * b) + N + m * m
    assert sum(sizes) <= bound < N * k  # a host copy of K's columns would be n·k
    if centres == "adaptive":
        assert k == kw["max_rank"]


def test_buffer_grows_when_device_memory_is_short(ops, monkeypatch):
    """A device whose free memory cannot hold ``cap`` columns starts F narrower and
    widens it as pivots come (the same factor); an adaptive build that stops before its
    cap ends with F exactly (n, k)."""
    dev, host = ops
    free = N * 8 * 4 * 30  # a quarter of it holds 30 float64 columns
    memory = Backend.memory
    monkeypatch.setattr(
        Backend, "memory", lambda self: (free, 2 * free) if self.name != "numpy" else memory(self)
    )
    widths: list[int] = []
    reserve = precond._DeviceFactor._reserve

    def recorded(self, k, need):
        widths.append(int(self.F.shape[1]))
        reserve(self, k, need)

    monkeypatch.setattr(precond._DeviceFactor, "_reserve", recorded)
    kw = dict(BUILDS["rpcholesky"], dtype=np.float64)
    d, h = build_nystrom(dev, **kw), build_nystrom(host, **kw)
    assert widths[0] == 30 and len(set(widths)) >= 3 and d.rank == 150
    assert tuple(d.F.shape) == (N, 150)
    np.testing.assert_array_equal(d.centres, h.centres)
    assert _rel(d.host_factor(), h.F) < 1e-10
    # stops early (resolved): the wider buffer is trimmed to the rank
    kw = dict(BUILDS["adaptive"], shift=0.05, max_rank=600, dtype=np.float64)
    d, h = build_nystrom(dev, **kw), build_nystrom(host, **kw)
    assert not d.info["capped"] and d.rank < 600
    assert tuple(d.F.shape) == (N, d.rank) and _on_device(d.F, dev)
    np.testing.assert_array_equal(d.centres, h.centres)
    assert _rel(d.host_factor(), h.F) < 1e-10
