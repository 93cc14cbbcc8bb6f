"""Benchmark: exact KRR on one GPU (issue #46), each figure beside a baseline of the same run.

Sections (``--only`` picks some; each stops at its share of ``--budget`` seconds, shared
among the chosen sections by their expected cost):

- ``products``: our device products, G kernel entries per second: the matrix-free
  ``K v`` (:func:`pipeline.engine.device.matvec`, RBF, D = 8, float32 entries with
  float64 sums) and prediction (:func:`pipeline.engine.device.predict`), against CuPy's
  dense ``K @ v`` on one tile that already exists (the issue's baseline);
- ``exact``: the exact fit on the device, complete (Gram on the device, tile Cholesky in
  place, solve), RBF, D = 8, float64, at growing N up to 100,000, with the relative
  residual ``‖(K + λI)α - y‖ / ‖y‖`` from a float64 device product; the factor's
  GFLOP/s against ``cupy.linalg.cholesky`` (cuSOLVER POTRF on the whole matrix) at the
  largest N that holds the matrix and its factor together;
- ``ooc``: the same factor with its tiles capped to a fraction of their bytes on the
  device (``memory_limit``): the panel schedule streams the earlier tile columns from
  pinned host copies while it multiplies (and, for comparison, the tile schedule,
  which evicts and uploads one tile per update), each Gram tile made when asked,
  against the in-memory rate at the same N; and the host <-> device copy rates. (A Gram truly past this machine's device memory is not possible here: the
  H200's 141 GB exceed the host's 128 GB of RAM and its 64 GB disk, so the cap stands
  for the device's memory);
- ``pcg``: matrix-free PCG at N = 1,000,000, D = 8, to 1e-6 (the package's mixed-precision
  CG on :class:`pipeline.linalg.matvec.DeviceKernelOperator`: float32 entries with float64
  sums inside, a float64 residual per outer step, both by the fused raw kernel; the
  adaptive RPCholesky preconditioner built from device columns), against GPyTorch's
  ``linear_cg`` on the same kernel, λ and GPU, in row chunks (KeOps is absent), given
  the time left (a capped solve records the residual it reached);
- ``kin40k``: ``KernelRidge(device="cuda")`` on kin40k split 0 (36,000 rows, RBF
  γ = 0.25, λ = 3.2e-3, the CV choice), test RMSE and seconds, against the same fit with
  ``device="cpu"`` on this machine's cores.

It imports internals (``pipeline.engine.device``, ``pipeline.linalg.cholesky_device``,
``pipeline.linalg.matvec``) because it times the Gram, the factor and the solve of the
device fit apart, and the PCG on the device operator, which no public function exposes.

Every figure goes to ``--out`` as JSON lines as it is measured (a run cut short keeps
what it had). Run by ``workflows/benchmarks/gpu_check.sh`` on the GPU machine.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import Recorder, cuda_seconds, elapsed, probe_gpytorch, probe_transfer  # noqa: E402
from targets import Targets  # noqa: E402

from pipeline.engine import device as dev  # noqa: E402
from pipeline.engine.backend import get_backend  # noqa: E402
from pipeline.kernels import RBF  # noqa: E402
from pipeline.linalg import cholesky_device as cd  # noqa: E402

GAMMA = 0.25
LAM = 1e-2


def _rbf():
    return RBF(gamma=GAMMA)


def _data(n, d=8, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1] * X[:, 2]) + 0.1 * rng.standard_normal(n)
    return X, y


def _free(cp, pinned=True):
    cp.get_default_memory_pool().free_all_blocks()
    if pinned:  # (kept: a second capped factor reuses the page-locked host copies)
        cp.get_default_pinned_memory_pool().free_all_blocks()


def section_products(be, cp, rec, budget):
    k = _rbf()
    n = 1_000_000 if budget > 60 else 200_000
    X, _ = _data(n)
    v = np.random.default_rng(1).standard_normal(n)
    Xd = be.asarray(X)
    # float64 entries run at a fraction of the float32 rate: a smaller N keeps the
    # section short (the figure is a rate)
    for kd, nk in (("float32", n), ("float64", min(n, 300_000))):
        dev.matvec(be, k, Xd[:20000], v[:20000], kernel_dtype=kd)  # warm-up / compile
        be.synchronize()
        t = time.perf_counter()
        dev.matvec(be, k, Xd[:nk], v[:nk], kernel_dtype=kd)
        be.synchronize()
        s = time.perf_counter() - t
        rec(section="products", op="matvec", n=nk, kernel_dtype=kd, seconds=s,
            g_entries_per_s=nk * nk / s / 1e9)  # fmt: skip
        if elapsed() > budget:
            return
    m = n // 2
    t = time.perf_counter()
    dev.predict(be, k, Xd, v, Xd[:m], kernel_dtype="float32")
    be.synchronize()
    s = time.perf_counter() - t
    rec(section="products", op="predict", n_train=n, n_new=m, kernel_dtype="float32",
        seconds=s, g_entries_per_s=n * m / s / 1e9)  # fmt: skip
    # the baseline: CuPy's dense K @ v on one tile that already exists
    x = cp.asarray(X[:8192], dtype=cp.float32)
    y = cp.asarray(X[:131072], dtype=cp.float32)
    for dt in (cp.float32, cp.float64):
        K = cp.exp(-GAMMA * ((x[:, None, :1] - y[None, :, :1]) ** 2).sum(-1)).astype(dt)
        vv = cp.asarray(v[:131072], dtype=dt)
        s = cuda_seconds(cp, lambda K=K, vv=vv: K @ vv)
        rec(section="products", op="baseline_dense_tile_gemv", shape=[8192, 131072],
            dtype=np.dtype(dt).name, seconds=s, g_entries_per_s=K.size / s / 1e9)  # fmt: skip
        del K
    _free(cp)


def _exact(be, cp, n, block=None, memory_limit=None, schedule="auto", keep_pinned=False):
    """Complete exact fit on the device; returns the record."""
    k = _rbf()
    X, y = _data(n)
    be.synchronize()
    t0 = time.perf_counter()
    Xd = be.asarray(X)
    b = block or cd.device_block(n, be)
    cd.check_device_memory(be, n, b, "float64")
    nb = -(-n // b)
    sl = [slice(i * b, min(n, (i + 1) * b)) for i in range(nb)]
    tiles = {}
    if memory_limit is None:  # the Gram, on the device, lower tiles
        for i in range(nb):
            for j in range(i + 1):
                tiles[i, j] = dev.kernel_block(be, k, Xd[sl[i]], None if i == j else Xd[sl[j]])

    def tile_fn(i, j):  # capped: each Gram tile made when the factor asks (timed with it)
        if (i, j) in tiles:
            return tiles.pop((i, j))
        return dev.kernel_block(be, k, Xd[sl[i]], None if i == j else Xd[sl[j]])

    be.synchronize()
    t1 = time.perf_counter()
    f = cd.device_cholesky(be, tile_fn, n, b, shift=LAM, memory_limit=memory_limit, lam=LAM,
                           schedule=schedule)  # fmt: skip
    be.synchronize()
    t2 = time.perf_counter()
    alpha = f.solve(y)
    be.synchronize()
    t3 = time.perf_counter()
    f.free()
    _free(cp, pinned=not keep_pinned)
    r = dev.matvec(be, k, Xd, alpha, shift=LAM, kernel_dtype="float64") - y
    rel = float(np.linalg.norm(r) / np.linalg.norm(y))
    Xd = None  # (the Gram tiles' closure holds it too)
    _free(cp, pinned=not keep_pinned)
    return dict(n=n, block=b, gram_s=t1 - t0, factor_s=t2 - t1, solve_s=t3 - t2,
                total_s=t3 - t0, factor_gflops=n**3 / 3 / (t2 - t1) / 1e9,
                relative_residual=rel, info={k_: v for k_, v in f.info.items()
                                             if isinstance(v, int | float | str)})  # fmt: skip


def section_exact(be, cp, rec, budget, sizes):
    for n in sizes:
        if elapsed() > budget:
            rec(section="exact", n=n, skipped="time")
            return
        try:
            rec(section="exact", **_exact(be, cp, n))
        except Exception as exc:
            rec(section="exact", n=n, error=repr(exc)[:400], tb=traceback.format_exc()[-800:])
            _free(cp)
    # the baseline: cuSOLVER on the whole matrix (it needs the matrix and its factor)
    free = cp.cuda.runtime.memGetInfo()[0]
    for n in (65_536, 81_920):
        if 2.2 * 8 * n * n > free or elapsed() > budget:
            rec(section="exact_baseline", n=n, skipped="memory or time")
            continue
        x = cp.asarray(_data(n)[0])
        sq = (x * x).sum(1)
        A = x @ x.T
        A *= -2
        A += sq[:, None]
        A += sq[None, :]
        A *= -GAMMA
        cp.exp(A, out=A)
        A[cp.diag_indices(n)] += LAM
        del x, sq
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        L = cp.linalg.cholesky(A)
        cp.cuda.Device().synchronize()
        s = time.perf_counter() - t
        del L, A
        _free(cp)
        rec(section="exact_baseline", op="cupy.linalg.cholesky", n=n, seconds=s,
            gflops=n**3 / 3 / s / 1e9)  # fmt: skip
        try:
            r = _exact(be, cp, n)
            rec(
                section="exact_same_n", ratio_to_cupy=r["factor_gflops"] / (n**3 / 3 / s / 1e9), **r
            )
        except Exception as exc:
            rec(section="exact_same_n", n=n, error=repr(exc)[:400])
            _free(cp)


def section_ooc(be, cp, rec, budget, n=65_536):
    """The factor with ``memory_limit`` below its size (the panel schedule streams the
    earlier columns; the tile schedule, evicting and uploading one tile per update, for
    comparison at the smaller limit), against the in-memory rate at the same N."""
    if elapsed() > budget:
        rec(section="ooc", skipped="time")
        return
    try:
        probe_transfer(cp, rec, sizes=(1024,), pageable=True)
    except Exception as exc:
        rec(section="ooc", op="copy_rates", error=repr(exc)[:300])
    b = cd.device_block(n, be)
    try:
        inmem = _exact(be, cp, n, block=b)
        rec(section="ooc", mode="in_memory", **inmem)
        # "warm": the same factor again, its page-locked host copies reused from CuPy's
        # pinned pool (page-locking fresh host memory ran at about 2.2 GB/s on the
        # H200 machine, 8 s of the 12.6 s the first capped factor at 65,536 took)
        runs = [
            (0.5, b, "auto", False),
            (0.5, b, "auto", True),
            (0.25, b, "auto", False),
            (0.25, b, "auto", True),
            (0.25, b // 2, "auto", False),
            (0.25, b, "tiles", False),
        ]
        for frac, blk, sched, warm in runs:
            if elapsed() > budget:
                rec(section="ooc", frac=frac, block=blk, schedule=sched, skipped="time")
                continue
            nb = -(-n // blk)
            lower_bytes = nb * (nb + 1) // 2 * blk * blk * 8
            r = _exact(be, cp, n, block=blk, memory_limit=int(frac * lower_bytes), schedule=sched,
                       keep_pinned=True)  # fmt: skip
            rec(section="ooc", mode=f"memory_limit={frac:g} of the factor", schedule_asked=sched,
                host_copies="reused" if warm else "fresh",
                rate_vs_in_memory=inmem["factor_s"] / r["factor_s"], **r)  # fmt: skip
            if warm:
                _free(cp)
    except Exception as exc:
        rec(section="ooc", error=repr(exc)[:400], tb=traceback.format_exc()[-800:])
        _free(cp)


def section_pcg(be, cp, rec, budget, n, rank=12_000, precision="mixed"):
    """``precision="mixed"``: the fit's mixed-precision solve (float32 products with float64
    sums inside, float64 residuals outside, and float64 products from the last accepted
    iterate when the float32 ones stall, :func:`pipeline.linalg.cg_mixed_fit.mixed_cg_fit`);
    ``"float64"``: float64 products throughout."""
    from pipeline.linalg.cg import conjugate_gradient
    from pipeline.linalg.cg_mixed_fit import mixed_cg_fit
    from pipeline.linalg.matvec import DeviceKernelOperator
    from pipeline.linalg.precond import build_nystrom

    X, y = _data(n)
    op64 = DeviceKernelOperator(X, _rbf(), LAM, backend=be, kernel_dtype="float64")
    op32 = DeviceKernelOperator(X, _rbf(), LAM, backend=be, kernel_dtype="float32")
    t0 = time.perf_counter()
    nf = build_nystrom(op32, centres="adaptive", shift=LAM, memory_budget=64 * 2**30,
                       max_rank=rank, random_state=0)  # fmt: skip
    t1 = time.perf_counter()
    rec(section="pcg", step="preconditioner", n=n, rank=nf.rank, seconds=t1 - t0,
        f_on=type(nf.F).__module__,
        info={k: v for k, v in nf.info.items() if isinstance(v, int | float | str | bool)})  # fmt: skip
    pre = nf.woodbury(LAM)  # F built on the GPU stays there: an apply moves one vector each way
    t = time.perf_counter()
    op32.matvec(y)
    t32 = time.perf_counter() - t
    t = time.perf_counter()
    op64.matvec(y)
    t64 = time.perf_counter() - t
    rec(section="pcg", step="products", n=n, float32_s=t32, float64_s=t64)
    left = max(30.0, budget - elapsed())
    t1 = time.perf_counter()

    def progress(st):  # (returns None: a true value would stop the CG)
        if precision == "mixed" or st.iteration % 10 == 0:
            rec(section="pcg", step="iteration", iteration=int(st.iteration),
                rel_residual=float(np.max(st.history[-1])),
                seconds=time.perf_counter() - t1)  # fmt: skip

    if precision == "mixed":  # the fit's solve: float64 products from where float32 stalls
        res = mixed_cg_fit(op64, y, preconditioner=pre, tol=1e-6, low=op32, callback=progress,
                           max_iter=max(10, int(left / (1.15 * t32))))  # fmt: skip
    else:
        res = conjugate_gradient(op64.matvec, y, preconditioner=pre, tol=1e-6, warn=False,
                                 max_iter=max(10, int(left / (1.1 * t64))),
                                 callback=progress)  # fmt: skip
    t2 = time.perf_counter()
    r = op64.matvec(res.x) - y
    rec(section="pcg", step="solve", n=n, precision=precision, iterations=int(res.n_iter),
        n_matvec=int(res.n_matvec), converged=bool(np.all(res.converged)), cg_s=t2 - t1,
        total_s=t2 - t0, relative_residual=float(np.linalg.norm(r) / np.linalg.norm(y)))  # fmt: skip
    return t2 - t0


def section_kin40k(rec, budget):
    from pipeline import KernelRidge

    here = os.path.join(os.path.dirname(__file__), "..", "data", "kin40k")
    with gzip.open(os.path.join(here, "data.csv.gz"), "rt") as f:
        D = np.loadtxt(f, delimiter=",")
    with gzip.open(os.path.join(here, "test_mask.csv.gz"), "rt") as f:
        test = np.loadtxt(f, delimiter=",")[:, 0].astype(bool)
    X, y = D[:, :-1], D[:, -1]
    mu, sd = X[~test].mean(0), X[~test].std(0)
    ym, ys = y[~test].mean(), y[~test].std()
    Xs, yz = (X - mu) / sd, (y - ym) / ys
    for device in ("cuda", "cpu"):
        if device == "cpu" and elapsed() > budget:
            rec(section="kin40k", device=device, skipped="time")
            continue
        t = time.perf_counter()
        m = KernelRidge(kernel="rbf", gamma=0.25, alpha=3.2e-3, device=device)
        m.fit(Xs[~test], yz[~test])
        pred = m.predict(Xs[test])
        s = time.perf_counter() - t
        rmse = float(np.sqrt(np.mean((pred - yz[test]) ** 2)))
        rec(section="kin40k", device=device, n_train=int((~test).sum()), seconds=s,
            test_rmse=rmse, cores=os.cpu_count())  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_gpu.jsonl")
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--only", default="products,exact,ooc,pcg,gpytorch,kin40k")
    ap.add_argument("--sizes", default="20000,50000,100000")
    ap.add_argument("--pcg-n", type=int, default=1_000_000)
    ap.add_argument("--pcg-rank", type=int, default=12_000)
    ap.add_argument("--pcg-precision", choices=("mixed", "float64"), default="mixed")
    ap.add_argument("--weights", default="", help="budget weights, e.g. pcg=5,ooc=1.5")
    args = ap.parse_args(argv)
    recorder, rows = Recorder(args.out), []

    def rec(**row):
        rows.append(dict(row))
        recorder(**row)

    only = set(args.only.split(","))
    import cupy as cp

    be = get_backend("cupy")
    props = cp.cuda.runtime.getDeviceProperties(0)
    rec(section="machine", gpu=props["name"].decode(), memory=be.memory(),
        cc=f"{props['major']}.{props['minor']}", cupy=cp.__version__, cores=os.cpu_count())  # fmt: skip
    B = args.budget
    sizes = [int(s) for s in args.sizes.split(",")]
    # each chosen section ends at its share of the budget (weights by expected cost)
    weights = {"products": 1, "exact": 3.5, "ooc": 1.5, "pcg": 3, "gpytorch": 1.5, "kin40k": 1}
    for item in filter(None, args.weights.split(",")):
        name, w = item.split("=")
        weights[name] = float(w)
    chosen = [k for k in args.only.split(",") if k in weights]  # in the order given
    total = sum(weights[k] for k in chosen) or 1
    end, acc = {}, 0.0
    for k in chosen:
        acc += weights[k]
        end[k] = B * acc / total
    steps = [
        ("products", lambda: section_products(be, cp, rec, end["products"])),
        ("exact", lambda: section_exact(be, cp, rec, end["exact"], sizes)),
        ("ooc", lambda: section_ooc(be, cp, rec, end["ooc"])),
        (
            "pcg",
            lambda: section_pcg(
                be, cp, rec, end["pcg"], args.pcg_n, args.pcg_rank, args.pcg_precision
            ),
        ),
        ("gpytorch", lambda: probe_gpytorch(rec, end["gpytorch"], [args.pcg_n], LAM, 1e-6)),
        ("kin40k", lambda: section_kin40k(rec, end["kin40k"])),
    ]
    for name, fn in sorted(steps, key=lambda st: chosen.index(st[0]) if st[0] in chosen else 99):
        if name not in only:
            continue
        try:
            fn()
        except Exception as exc:
            rec(section=name, error=repr(exc)[:400], tb=traceback.format_exc()[-1500:])
        _free(cp)
    rec(section="done", seconds=elapsed())
    targets = verdicts(rows)
    return targets.finish()


def verdicts(rows: list[dict]) -> Targets:
    """#46's targets checked on the recorded figures (a target whose section did not run,
    or failed, is said to be unchecked)."""
    t = Targets()

    def pick(**match):
        return [r for r in rows if all(r.get(k) == v for k, v in match.items())]

    fit = [r for r in pick(section="exact", n=100_000) if "total_s" in r]
    if fit:
        t.check("exact fit, N = 100,000, complete", fit[-1]["total_s"], "<=", 60.0, " s")
    else:
        t.skip("exact fit, N = 100,000", "the exact section did not measure it")
    same = [r for r in pick(section="exact_same_n") if "ratio_to_cupy" in r]
    if same:
        big = max(same, key=lambda r: r["n"])
        t.check(f"factor / cupy.linalg.cholesky, N = {big['n']}", big["ratio_to_cupy"], ">=", 0.8)
    else:
        t.skip("factor / cupy.linalg.cholesky", "no baseline measured")
    capped = [r for r in pick(section="ooc", schedule_asked="auto") if "rate_vs_in_memory" in r]
    for r in capped:
        t.check(f"capped factor, {r['mode']}, block {r['block']}, host copies "
                f"{r.get('host_copies', 'fresh')}", r["rate_vs_in_memory"], ">=", 0.7)  # fmt: skip
    if not capped:
        t.skip("capped factor", "the ooc section did not measure it")
    solve = [r for r in pick(section="pcg", step="solve") if r.get("n") == 1_000_000]
    if solve:
        done = solve[-1]["converged"] and solve[-1]["relative_residual"] <= 1e-6
        t.check("PCG, N = 1,000,000, to 1e-6", solve[-1]["total_s"] if done else float("nan"),
                "<=", 300.0, " s")  # fmt: skip
    else:
        t.skip("PCG, N = 1,000,000", "no 1M solve finished")
    return t


if __name__ == "__main__":
    raise SystemExit(main())
