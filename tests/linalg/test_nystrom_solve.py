"""The Nyström solver (FALKON, issue #45 item 1) against a dense numpy solve of its normal
equations ``(K_nMᵀ W K_nM + λ K_MM) β = K_nMᵀ W y``: several block sizes (ragged last
blocks), multi-output, sample weights, the centres, streaming X from a store, float32
products, bitwise reproducibility and resume from the CG checkpoint."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from pipeline.kernels import make_kernel
from pipeline.linalg.nystrom_solve import (
    FalkonPreconditioner,
    check_n_centers,
    nystrom_centres,
    nystrom_solve,
)

N, D, M = 600, 4, 80
LAM = 1e-2


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
    Y = np.c_[y, X[:, 1] ** 2 - 1.0]
    w = rng.uniform(0.2, 2.0, N)
    return X, Y, w


#: the PCG's tolerance against the dense reference: 1e-12 is past what this system's
#: rounding allows with one BLAS thread (CG stagnated at 3.5e-8 on the unweighted single
#: block, whatever the code's version); 1e-11 converges with one thread and with two
PCG_TOL = 1e-11


def _dense_reference(X, Y, kernel, lam, C, w=None):
    Knm, Kmm = kernel(X, C), kernel(C, C)
    W = np.ones(X.shape[0]) if w is None else w
    H = Knm.T @ (W[:, None] * Knm) + lam * Kmm
    return np.linalg.solve(H, Knm.T @ (W[:, None] * Y.reshape(X.shape[0], -1))), Knm


@pytest.mark.parametrize("block_size", [37, 256, N])  # 37 and 256: a ragged last block
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_dense_normal_equations(data, block_size, weighted):
    X, Y, w = data
    k = make_kernel("rbf")
    ww = w if weighted else None
    sol = nystrom_solve(
        X, Y, k, LAM, n_centers=M, block_size=block_size, sample_weight=ww, tol=PCG_TOL,
        max_iter=500,
    )  # fmt: skip
    assert sol.cg.converged and sol.coef.shape == (M, 2)
    assert sol.info["block_size"] == block_size
    np.testing.assert_array_equal(sol.X_centres, X[sol.centres])
    beta, Knm = _dense_reference(X, Y, k, LAM, sol.X_centres, ww)
    np.testing.assert_allclose(Knm @ sol.coef, Knm @ beta, rtol=0, atol=1e-8)
    np.testing.assert_allclose(sol.coef, beta, rtol=0, atol=1e-7 * np.abs(beta).max())


def test_one_output_keeps_its_shape_and_equals_the_column(data):
    X, Y, _ = data
    one = nystrom_solve(X, Y[:, 0], "rbf", LAM, n_centers=M, tol=1e-10, block_size=128)
    two = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, tol=1e-10, block_size=128)
    assert one.coef.shape == (M,)
    np.testing.assert_allclose(one.coef, two.coef[:, 0], rtol=0, atol=1e-8 * np.abs(one.coef).max())


def test_all_rows_as_centres_is_exact_kernel_ridge(data):
    # M = N: (W K + λ I) β = W y, scikit-learn's weighted KernelRidge
    from sklearn.kernel_ridge import KernelRidge as SkKR

    X, Y, w = data
    n = 150
    lam = 0.5
    for ww in (None, w[:n]):
        sol = nystrom_solve(X[:n], Y[:n], "rbf", lam, n_centers=n, sample_weight=ww, tol=1e-12)
        np.testing.assert_array_equal(sol.centres, np.arange(n))
        sk = SkKR(alpha=lam, kernel="rbf").fit(X[:n], Y[:n], sample_weight=ww)
        np.testing.assert_allclose(sol.coef, sk.dual_coef_, rtol=0, atol=1e-7)


def test_preconditioner_is_falkons_two_choleskys():
    rng = np.random.default_rng(1)
    C = rng.standard_normal((30, 3))
    Kmm = make_kernel("rbf")(C, C)
    lam_n = 1e-3
    pre = FalkonPreconditioner(Kmm, lam_n)
    T, A = pre.T, pre.A
    np.testing.assert_allclose(T.T @ T, Kmm + pre.jitter * np.eye(30), atol=1e-12)
    np.testing.assert_allclose(A.T @ A, T @ T.T / 30 + lam_n * np.eye(30), atol=1e-12)
    # B Bᵀ = (n/M K² + n λ' K)⁻¹ / n for K = K_MM + εI
    K = Kmm + pre.jitter * np.eye(30)
    BBt = pre.apply(pre.apply_t(np.eye(30)))
    np.testing.assert_allclose(BBt @ (K @ K / 30 + lam_n * K), np.eye(30), atol=1e-6)


def test_bitwise_reproducible_and_streamed_x_gives_the_same_bits(data, tmp_path):
    X, Y, w = data
    a = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, block_size=100, sample_weight=w)
    b = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, block_size=100, sample_weight=w)
    np.testing.assert_array_equal(a.coef, b.coef)
    # X from a Zarr store, read in row blocks (never held whole)
    path = str(tmp_path / "X.zarr")
    da.from_array(X, chunks=(64, D)).to_zarr(path)
    c = nystrom_solve(path, Y, "rbf", LAM, n_centers=M, block_size=100, sample_weight=w)
    np.testing.assert_array_equal(a.centres, c.centres)
    np.testing.assert_array_equal(a.coef, c.coef)
    dx = da.from_array(X, chunks=(77, D))
    e = nystrom_solve(dx, Y, "rbf", LAM, n_centers=M, block_size=100, sample_weight=w)
    np.testing.assert_array_equal(a.coef, e.coef)


def test_rpcholesky_centres(data):
    X, Y, _ = data
    k = make_kernel("rbf")
    idx = nystrom_centres(X, k, M, centers="rpcholesky", random_state=3)
    assert idx.size == M and np.unique(idx).size == M and np.all(np.diff(idx) > 0)
    sol = nystrom_solve(
        X, Y, k, LAM, n_centers=M, centers="rpcholesky", random_state=3, tol=1e-12, max_iter=500
    )
    np.testing.assert_array_equal(sol.centres, idx)
    beta, Knm = _dense_reference(X, Y, k, LAM, sol.X_centres)
    np.testing.assert_allclose(Knm @ sol.coef, Knm @ beta, rtol=0, atol=1e-8)
    # the uniform recipe is the Nyström builder's
    from pipeline.linalg.matvec import make_operator
    from pipeline.linalg.precond import build_nystrom

    op = make_operator("matrix-free", 1.0, X=X, kernel=k)
    uni = build_nystrom(op, centres="uniform", rank=M, random_state=5).centres
    np.testing.assert_array_equal(nystrom_centres(X, k, M, random_state=5), uni)


def test_float32_products_are_close(data):
    # float32 kernel blocks and products (float64 sums): their rounding bounds the
    # preconditioned residual CG can reach (about 1e-4 here), so a loose tol
    X, Y, _ = data
    f64 = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, tol=1e-10, max_iter=500)
    f32 = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, tol=1e-3, product_dtype="float32")
    assert f32.info["product_dtype"] == "float32" and f32.cg.converged
    Knm = make_kernel("rbf")(X, f64.X_centres)
    rel = np.abs(Knm @ (f32.coef - f64.coef)).max() / np.abs(Knm @ f64.coef).max()
    assert rel < 2e-2


@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True, None, np.float64(4.0)])
def test_bad_n_centers_is_a_value_error_naming_it(bad):
    with pytest.raises(ValueError, match="n_centers must be a positive integer") as err:
        check_n_centers(bad)
    assert repr(bad) in str(err.value)


def test_more_centres_than_rows_and_bad_choices_refused(data):
    X, Y, _ = data
    with pytest.raises(ValueError, match="n_centers=601 exceeds the number of samples N=600"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=N + 1)
    with pytest.raises(ValueError, match="centers='kmeans' is not valid"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=M, centers="kmeans")
    with pytest.raises(ValueError, match="product_dtype='float16' is not valid"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=M, product_dtype="float16")
    assert np.asarray(check_n_centers(np.int32(7))) == 7


def test_resumes_from_the_cg_checkpoint_with_the_same_bits(data, tmp_path):
    X, Y, w = data
    kw = dict(n_centers=M, block_size=128, sample_weight=w, tol=1e-10, checkpoint_every=2)
    whole = nystrom_solve(X, Y, "rbf", LAM, **kw, max_iter=500)
    store = str(tmp_path / "ckpt")

    class Killed(Exception):
        pass

    def kill(state):
        if state.iteration == 7:
            raise Killed

    with pytest.raises(Killed):
        nystrom_solve(X, Y, "rbf", LAM, **kw, max_iter=500, store=store, callback=kill)
    resumed = nystrom_solve(X, Y, "rbf", LAM, **kw, max_iter=500, store=store)
    assert resumed.cg.start_iter == 6 and resumed.info["start_iter"] == 6
    assert resumed.cg.n_iter == whole.cg.n_iter
    np.testing.assert_array_equal(resumed.coef, whole.coef)
    # another solve (another lambda) does not resume that checkpoint
    other = nystrom_solve(X, Y, "rbf", 2 * LAM, **kw, max_iter=500, store=store)
    assert other.cg.start_iter == 0


@pytest.mark.parametrize("product_dtype", ["float64", "float32"])
def test_kept_kernel_blocks_give_the_same_bits(data, product_dtype):
    X, Y, w = data
    kw = dict(n_centers=M, block_size=96, sample_weight=w, tol=1e-3, product_dtype=product_dtype)
    kept = nystrom_solve(X, Y, "rbf", LAM, **kw, cache_bytes=1 << 30)
    again = nystrom_solve(X, Y, "rbf", LAM, **kw, cache_bytes=0)
    assert kept.info["n_iter"] > 1
    np.testing.assert_array_equal(kept.coef, again.coef)


def test_bad_weights_and_an_indefinite_kernel_are_refused(data):
    from pipeline.errors import IndefiniteKernelError

    X, Y, w = data
    with pytest.raises(ValueError, match="sample_weight must be finite and non-negative"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=M, sample_weight=np.zeros(N))
    with pytest.raises(ValueError, match="sample_weight must be finite and non-negative"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=M, sample_weight=-w)
    with pytest.raises(IndefiniteKernelError, match="not positive semi-definite"):
        nystrom_solve(X, Y, make_kernel("sigmoid", gamma=1.0, coef0=-3.0), LAM, n_centers=M)


def _basis(monkeypatch, basis):
    """Make the direct solve's basis ``basis`` whatever the rounding estimate says."""
    from pipeline.linalg import nystrom_solve as ns

    monkeypatch.setattr(ns, "NYSTROM_MAPPED_FROM", 0.0 if basis == "mapped" else np.inf)


@pytest.mark.parametrize("block_size", [37, 256, N])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("basis", ["centres", "mapped"])
def test_direct_method_solves_the_same_normal_equations(
    data, block_size, weighted, basis, monkeypatch
):
    X, Y, w = data
    _basis(monkeypatch, basis)
    k = make_kernel("rbf")
    ww = w if weighted else None
    sol = nystrom_solve(X, Y, k, LAM, n_centers=M, block_size=block_size, sample_weight=ww,
                        method="direct")  # fmt: skip
    assert sol.info["method"] == "direct" and sol.info["n_iter"] == 0 and sol.cg.converged
    assert sol.info["basis"] == basis
    assert max(sol.info["rel_residual"]) < 1e-12
    beta, Knm = _dense_reference(X, Y, k, LAM, sol.X_centres, ww)
    np.testing.assert_allclose(Knm @ sol.coef, Knm @ beta, rtol=0, atol=1e-8)
    again = nystrom_solve(X, Y, k, LAM, n_centers=M, block_size=block_size, sample_weight=ww,
                          method="direct")  # fmt: skip
    np.testing.assert_array_equal(sol.coef, again.coef)  # one pass in block order: the same bits
    pcg = nystrom_solve(X, Y, k, LAM, n_centers=M, block_size=block_size, sample_weight=ww,
                        tol=PCG_TOL, max_iter=500)  # fmt: skip
    np.testing.assert_allclose(Knm @ sol.coef, Knm @ pcg.coef, rtol=0, atol=1e-8)


def test_direct_method_streams_x_and_refuses_an_unknown_method(data):
    X, Y, _ = data
    a = nystrom_solve(X, Y[:, 0], "rbf", LAM, n_centers=M, block_size=100, method="direct")
    b = nystrom_solve(da.from_array(X, chunks=100), Y[:, 0], "rbf", LAM, n_centers=M,
                      block_size=100, method="direct")  # fmt: skip
    np.testing.assert_array_equal(a.coef, b.coef)
    with pytest.raises(ValueError, match="method='cholesky' is not valid.*'pcg', 'direct'"):
        nystrom_solve(X, Y, "rbf", LAM, n_centers=M, method="cholesky")


# -- the direct pass, resumable (its checkpoints follow the CG checkpoints' contract) --------
class _Killed(Exception):
    pass


def _killed_direct_pass(monkeypatch, k, X, Y, w, store):
    """A direct-method solve into ``store`` killed at the k-th kernel block of its pass."""
    restore = _kill_after(monkeypatch, k)
    with pytest.raises(_Killed):
        nystrom_solve(X, Y, "rbf", LAM, **DIRECT, sample_weight=w, store=store)
    restore()


def _kill_after(monkeypatch, k):
    """The k-th kernel block of the next pass raises (as a kill would stop it there)."""
    from pipeline.linalg import nystrom_solve as ns

    real, seen = ns.NystromNormalOperator._block, {"n": 0}

    def block(self, xb):
        seen["n"] += 1
        if seen["n"] == k:
            raise _Killed
        return real(self, xb)

    monkeypatch.setattr(ns.NystromNormalOperator, "_block", block)
    return lambda: monkeypatch.setattr(ns.NystromNormalOperator, "_block", real)


DIRECT = dict(n_centers=M, block_size=64, method="direct", checkpoint_every=3)  # 10 blocks


@pytest.mark.parametrize(("streamed", "basis"), [(False, "centres"), (True, "centres"),
                                                 (False, "mapped")])  # fmt: skip
def test_direct_pass_killed_after_k_blocks_resumes_with_the_same_bits(
    data, tmp_path, monkeypatch, streamed, basis, caplog
):
    X, Y, w = data
    _basis(monkeypatch, basis)
    Xs = X
    if streamed:  # X from a Zarr store: its blocks' fingerprints are saved with the state
        Xs = str(tmp_path / "X.zarr")
        da.from_array(X, chunks=(64, D)).to_zarr(Xs)
    whole = nystrom_solve(Xs, Y, "rbf", LAM, **DIRECT, sample_weight=w)
    assert whole.info["n_blocks"] == 10 and not whole.info["resumed"]
    assert whole.info["basis"] == basis
    store = str(tmp_path / "ckpt")
    _killed_direct_pass(monkeypatch, 8, Xs, Y, w, store)  # dies in block 7: last state, block 6
    with caplog.at_level("INFO", logger="pipeline.linalg.nystrom_solve"):
        resumed = nystrom_solve(Xs, Y, "rbf", LAM, **DIRECT, sample_weight=w, store=store)
    assert "resuming the Nyström pass from block 6 of 10" in caplog.text
    assert resumed.info["resumed"] and resumed.info["start_block"] == 6
    np.testing.assert_array_equal(resumed.coef, whole.coef)
    # the solved state is kept: the same solve again is a pure resume, no block read
    restore = _kill_after(monkeypatch, 1)
    again = nystrom_solve(Xs, Y, "rbf", LAM, **DIRECT, sample_weight=w, store=store)
    restore()
    assert again.info["resumed"] and again.info["start_block"] == 10
    np.testing.assert_array_equal(again.coef, whole.coef)


@pytest.mark.parametrize("change", ["lambda", "y", "weights", "block_size"])
def test_direct_pass_checkpoint_is_resumed_only_by_the_same_solve(
    data, tmp_path, monkeypatch, change
):
    X, Y, w = data
    store = str(tmp_path / "ckpt")
    _killed_direct_pass(monkeypatch, 5, X, Y, w, store)
    lam, Y2, kw = LAM, Y, {**DIRECT, "sample_weight": w}
    if change == "lambda":
        lam = 2 * LAM
    elif change == "y":
        Y2 = Y.copy()
        Y2[-1, 0] += 1e-9
    elif change == "weights":
        kw["sample_weight"] = w * 1.5
    else:
        kw["block_size"] = 60
    other = nystrom_solve(X, Y2, "rbf", lam, **kw, store=store)
    assert not other.info["resumed"] and other.info["start_block"] == 0
    np.testing.assert_array_equal(other.coef, nystrom_solve(X, Y2, "rbf", lam, **kw).coef)


def test_a_corrupt_direct_pass_slot_is_not_resumed(data, tmp_path, monkeypatch, caplog):
    import json
    import pathlib

    X, Y, w = data
    store = str(tmp_path / "ckpt")
    _killed_direct_pass(monkeypatch, 8, X, Y, w, store)
    marker = json.loads((pathlib.Path(store) / "_markers/nystrom-pass/state").read_text())
    assert marker["block"] == 6 and "crc32c" in marker
    slot = pathlib.Path(store) / f"_nystrom/pass/slot{marker['slot']}.npz"
    raw = bytearray(slot.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the saved sums
    slot.write_bytes(bytes(raw))
    with caplog.at_level("WARNING"):
        sol = nystrom_solve(X, Y, "rbf", LAM, **DIRECT, sample_weight=w, store=store)
    assert "Nyström pass checkpoint" in caplog.text and "is corrupt" in caplog.text
    assert not sol.info["resumed"] and sol.info["start_block"] == 0
    whole = nystrom_solve(X, Y, "rbf", LAM, **DIRECT, sample_weight=w)
    np.testing.assert_array_equal(sol.coef, whole.coef)


def test_direct_method_reports_a_residual_past_tol_as_unconverged(data, monkeypatch):
    # a singular preconditioned system falls back to least squares; a residual past tol must
    # be reported as such (a run then fails), never as solved
    from pipeline.linalg import nystrom_solve as ns

    X, Y, _ = data
    real = ns.NystromNormalOperator.solve_direct

    def loose(self, normal, b):
        g, rel = real(self, normal, b)
        return g, rel + 1e-3

    monkeypatch.setattr(ns.NystromNormalOperator, "solve_direct", loose)
    sol = nystrom_solve(X, Y, "rbf", LAM, n_centers=M, method="direct", tol=1e-6)
    assert not sol.cg.converged and sol.info["converged"] is False
    assert list(sol.cg.column_converged) == [False, False]


def test_the_direct_solve_maps_the_blocks_where_the_centres_basis_rounds(data, monkeypatch):
    """Near-duplicate rows (X rounded to 0.1), a smooth kernel and a small λ make K_MM
    nearly singular, and ``K_nMᵀ K_nM`` formed in the centres' basis rounds past use once
    FALKON's ``T⁻¹`` maps it (diamonds: a fold's held-out R² of -10.6 against
    scikit-learn's 0.9795 on the same centres). The direct solve then sums the mapped
    blocks ``G T⁻¹``, as scikit-learn forms its features first: predictions agree with
    ``Nystroem`` + ``Ridge`` on the same centres. Well-conditioned data keeps the
    centres' basis (and its bits and fingerprints)."""
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import Ridge

    from pipeline.engine.dense import kernel_matrix

    X0, Y0, _ = data
    kept = nystrom_solve(X0, Y0, "rbf", LAM, n_centers=M, method="direct")
    assert kept.info["basis"] == "centres"
    rng = np.random.default_rng(2)
    X = np.round(rng.normal(size=(800, 2)), 1)
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(800)
    Xt = rng.normal(size=(200, 2))
    k = make_kernel("rbf", gamma=0.05)
    sol = nystrom_solve(X, y, k, 1e-5, n_centers=150, method="direct")
    assert sol.info["basis"] == "mapped"
    ny = Nystroem(kernel="rbf", gamma=0.05, n_components=150).fit(sol.X_centres)
    sk = Ridge(alpha=1e-5, fit_intercept=False).fit(ny.transform(X), y)
    want = sk.predict(ny.transform(Xt))
    got = np.asarray(kernel_matrix(k, Xt, sol.X_centres)) @ sol.coef
    assert np.max(np.abs(got - want)) < 2e-3  # measured 5.4e-4 (the system's conditioning)
    _basis(monkeypatch, "centres")  # the old way, for the record: off by 0.16
    raw = nystrom_solve(X, y, k, 1e-5, n_centers=150, method="direct")
    assert raw.info["basis"] == "centres"
    raw_pred = np.asarray(kernel_matrix(k, Xt, raw.X_centres)) @ raw.coef
    assert np.max(np.abs(raw_pred - want)) > 2e-2


def test_the_basis_rule_weighs_the_formed_matrixs_rounding_against_the_shift(monkeypatch):
    """The centres' basis rounds ``K_nMᵀ K_nM`` by about ``eps · N · ‖T⁻¹‖²`` (here 4e-5,
    below the 1e-4 that session 41's rule, blind to λ, mapped from); the solution's
    error is that over λ. At λ = 1e-5 the centres' basis misses the predictions of a
    least-squares solve that forms no normal matrix by more than 1e-2 (the mapped blocks:
    within 1e-4), and the rule maps the blocks; at λ = 1 it keeps the centres' (faster) basis, which agrees there."""
    from pipeline.linalg import nystrom_solve as ns

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=4000)
    k = make_kernel("rbf", gamma=0.3)
    kw = dict(n_centers=400, centers="rpcholesky", method="direct")
    for lam, basis in ((1e-5, "mapped"), (1.0, "centres")):
        sol = nystrom_solve(X, y, k, lam, **kw)
        assert sol.info["basis"] == basis
        pre = FalkonPreconditioner(k(sol.X_centres, sol.X_centres), 1.0)
        assert 1e-5 < pre.basis_rounding(4000) < 1e-4
        # min ‖K_nM β - y‖² + λ ‖T β‖² by QR (TᵀT = K_MM + ε I): no normal matrix formed
        Knm = k(X, sol.X_centres)
        A = np.vstack([Knm, np.sqrt(lam) * pre.T])
        ref = Knm @ np.linalg.lstsq(A, np.concatenate([y, np.zeros(400)]), rcond=None)[0]
        # (the normal matrix's own conditioning, about N / λ, leaves 1e-5 at λ = 1e-5)
        np.testing.assert_allclose(Knm @ sol.coef, ref, rtol=0, atol=1e-4)
        monkeypatch.setattr(ns, "NYSTROM_MAPPED_FROM", np.inf)  # the centres' basis, forced
        off = np.abs(Knm @ nystrom_solve(X, y, k, lam, **kw).coef - ref).max()
        monkeypatch.undo()
        assert off > 1e-2 if basis == "mapped" else off < 1e-4
