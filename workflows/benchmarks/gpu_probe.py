"""GPU baselines for issue #46, measured before the backend seam exists.

Issue #46 (exact KRR on one GPU) states its targets against figures of the same GPU:
``cupy.linalg.cholesky``'s GFLOP/s at the largest N it holds, CuPy's dense ``K @ v``
on one tile, and GPyTorch's CG on the same kernel and lambda. The seam itself waits
for the redesign (#43), so this script measures those baselines, and the ceilings of
the designs the seam will choose between, with CuPy alone (no ``pipeline`` import,
no Dask or Zarr on the GPU image):

- ``cholesky``: ``cupy.linalg.cholesky`` (cuSOLVER potrf) in float64 and float32 at
  growing N, until device memory or the time budget runs out;
- ``tile_cholesky``: a right-looking tile Cholesky (POTRF, TRSM, SYRK, GEMM per tile,
  cuSOLVER/cuBLAS through CuPy) with the tiles (a) on the device and (b) in pinned
  host memory, copied in and out around every tile operation with no overlap: the
  floor and the naive ceiling of the out-of-core GPU factor;
- ``rbf``: RBF kernel products ``K v``, D = 8: (a) the whole tile (GEMM for the cross
  term, ``exp``, GEMV), (b) a fused CUDA kernel (float32 products, float64
  accumulation, no tile in memory), (c) the GEMV alone on a tile that already
  exists: the issue's "CuPy's dense K @ v on one tile";
- ``gpytorch_cg``: GPyTorch/linear_operator CG on the RBF kernel at N = 100,000
  (and more while time is left), tol 1e-6 relative residual, same lambda.

Every figure goes to ``--out`` as JSON lines, written as it is measured, so a run cut
short keeps what it had. Run it through ``gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback

import numpy as np

T0 = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - T0


class Recorder:
    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def __call__(self, **row):
        row["t"] = round(elapsed(), 1)
        line = json.dumps(row, default=float)
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


def cuda_seconds(cp, fn, repeats=3):
    """Best device time of ``fn()`` over ``repeats`` runs after one warm-up."""
    best = math.inf
    for i in range(repeats + 1):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        t = cp.cuda.get_elapsed_time(start, stop) / 1e3
        if i:
            best = min(best, t)
    return best


def rbf_gram(cp, x, gamma, lam, dtype):
    """(K + lam I) for the RBF kernel, built on the device (cross term by GEMM)."""
    x = x.astype(dtype)
    sq = (x * x).sum(axis=1)
    k = x @ x.T
    k *= -2
    k += sq[:, None]
    k += sq[None, :]
    cp.maximum(k, 0, out=k)
    k *= -gamma
    cp.exp(k, out=k)
    k[cp.diag_indices(k.shape[0])] += lam
    return k


def probe_cholesky(cp, rec, budget, sizes):
    free = cp.cuda.Device().mem_info[0]
    for dtype in (np.float64, np.float32):
        for n in sizes:
            need = 2.2 * n * n * np.dtype(dtype).itemsize
            if need > 0.9 * free or elapsed() > budget:
                rec(probe="cholesky", dtype=np.dtype(dtype).name, n=n, skipped="memory or time")
                break
            rng = cp.random.default_rng(0)
            x = rng.standard_normal((n, 8), dtype=cp.float64)
            a = rbf_gram(cp, x, 0.25, 1e-3 * n, dtype)
            try:
                t = cuda_seconds(cp, lambda a=a: cp.linalg.cholesky(a), repeats=2)
                rec(
                    probe="cholesky",
                    dtype=np.dtype(dtype).name,
                    n=n,
                    seconds=t,
                    gflops=n**3 / 3 / t / 1e9,
                )
            except Exception as exc:  # cuSOLVER out of memory, etc.
                rec(probe="cholesky", dtype=np.dtype(dtype).name, n=n, error=repr(exc)[:200])
                break
            finally:
                del a
                cp.get_default_memory_pool().free_all_blocks()


def tile_cholesky(cp, tiles, nt, b, on_host, stream=None):
    """Right-looking tile Cholesky of the lower triangle held in ``tiles[(i, j)]``.

    ``on_host``: tiles live in pinned host memory; every tile operation copies its
    inputs in and its output out (no overlap): the naive out-of-core ceiling.
    """
    from cupyx.scipy.linalg import solve_triangular

    def get(key):
        return cp.asarray(tiles[key]) if on_host else tiles[key]

    def put(key, arr):
        if on_host:
            arr.get(out=tiles[key])
        else:
            tiles[key] = arr

    for k in range(nt):
        lkk = cp.linalg.cholesky(get((k, k)))
        put((k, k), lkk)
        for i in range(k + 1, nt):
            aik = get((i, k))
            # L_ik = A_ik L_kk^-T  <=>  L_kk L_ik^T = A_ik^T
            lik = solve_triangular(lkk, aik.T, lower=True).T
            put((i, k), cp.ascontiguousarray(lik))
        cols = {i: get((i, k)) for i in range(k + 1, nt)} if on_host else None
        for i in range(k + 1, nt):
            li = cols[i] if on_host else tiles[(i, k)]
            for j in range(k + 1, i + 1):
                lj = cols[j] if on_host else tiles[(j, k)]
                aij = get((i, j))
                aij -= li @ lj.T
                put((i, j), aij)
    cp.cuda.Device().synchronize()


def probe_tile_cholesky(cp, rec, budget, n, b):
    if elapsed() > budget:
        rec(probe="tile_cholesky", n=n, b=b, skipped="time")
        return
    nt = n // b
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((n, 8), dtype=cp.float64)
    full = rbf_gram(cp, x, 0.25, 1e-3 * n, np.float64)
    ref = cp.linalg.cholesky(full)
    cp.cuda.Device().synchronize()
    t_ref = cuda_seconds(cp, lambda: cp.linalg.cholesky(full), repeats=1)
    for on_host in (False, True):
        if elapsed() > budget:
            rec(probe="tile_cholesky", n=n, b=b, on_host=on_host, skipped="time")
            continue
        import cupyx

        def fresh(on_host=on_host):
            tiles = {}
            for i in range(nt):
                for j in range(i + 1):
                    blk = full[i * b : (i + 1) * b, j * b : (j + 1) * b]
                    if on_host:
                        h = cupyx.empty_pinned((b, b), dtype=np.float64)
                        blk.get(out=h)
                        tiles[(i, j)] = h
                    else:
                        tiles[(i, j)] = blk.copy()
            return tiles

        times = []
        err = None
        for rep in range(2):
            tiles = fresh()
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            tile_cholesky(cp, tiles, nt, b, on_host)
            times.append(time.perf_counter() - t)
            if rep == 0:
                worst = 0.0
                for (i, j), tl in tiles.items():
                    got = cp.asarray(tl)
                    want = ref[i * b : (i + 1) * b, j * b : (j + 1) * b]
                    if i == j:
                        got, want = cp.tril(got), cp.tril(want)
                    worst = max(worst, float(cp.abs(got - want).max()))
                err = worst / float(cp.abs(ref).max())
            del tiles
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()
        t = min(times)
        rec(
            probe="tile_cholesky",
            n=n,
            b=b,
            on_host=on_host,
            seconds=t,
            gflops=n**3 / 3 / t / 1e9,
            cupy_cholesky_seconds=t_ref,
            ratio_to_cupy=t_ref / t,
            max_rel_diff_vs_cupy=err,
        )
    full = ref = None
    cp.get_default_memory_pool().free_all_blocks()


FUSED_SRC = r"""
extern "C" __global__
void rbf_matvec_f32(const float* __restrict__ X, const float* __restrict__ Y,
                    const double* __restrict__ v, double* __restrict__ out,
                    const int m, const int n, const float gamma) {
    // R rows of X per block, D = 8 features; threads stride over the n columns.
    const int R = 8;
    const int D = 8;
    __shared__ double red[R][256];
    float xr[R][D];
    const int row0 = blockIdx.x * R;
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < D; ++k)
            xr[r][k] = (row0 + r < m) ? X[(row0 + r) * D + k] : 0.f;
    double acc[R];
    for (int r = 0; r < R; ++r) acc[r] = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float yj[D];
        for (int k = 0; k < D; ++k) yj[k] = Y[j * D + k];
        const double vj = v[j];
        for (int r = 0; r < R; ++r) {
            float d2 = 0.f;
            for (int k = 0; k < D; ++k) { float t = xr[r][k] - yj[k]; d2 = fmaf(t, t, d2); }
            acc[r] = fma((double)__expf(-gamma * d2), vj, acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) red[r][threadIdx.x] = acc[r];
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            for (int r = 0; r < R; ++r) red[r][threadIdx.x] += red[r][threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x < R && row0 + threadIdx.x < m) out[row0 + threadIdx.x] = red[threadIdx.x][0];
}
"""


def probe_rbf(cp, rec, budget, m, n):
    if elapsed() > budget:
        rec(probe="rbf", skipped="time")
        return
    rng = cp.random.default_rng(2)
    gamma = 0.25
    xm = rng.standard_normal((m, 8), dtype=cp.float64)
    yn = rng.standard_normal((n, 8), dtype=cp.float64)
    v = rng.standard_normal(n, dtype=cp.float64)
    entries = float(m) * n
    # (a) whole tile: GEMM cross term, exp, GEMV; float64 and float32 (float64 v)
    for dtype in (np.float64, np.float32):
        xa, ya = xm.astype(dtype), yn.astype(dtype)
        sx, sy = (xa * xa).sum(1), (ya * ya).sum(1)

        def whole(xa=xa, ya=ya, sx=sx, sy=sy, dtype=dtype):
            k = xa @ ya.T
            k *= -2
            k += sx[:, None]
            k += sy[None, :]
            k *= -gamma
            cp.exp(k, out=k)
            return k @ v.astype(dtype)

        t = cuda_seconds(cp, whole)
        rec(
            probe="rbf",
            method="whole_tile",
            dtype=np.dtype(dtype).name,
            m=m,
            n=n,
            seconds=t,
            g_entries_per_s=entries / t / 1e9,
        )
        cp.get_default_memory_pool().free_all_blocks()
    # (c) the GEMV alone on a tile that exists (the dense K @ v baseline)
    for dtype in (np.float64, np.float32):
        k = cp.exp(
            -gamma
            * cp.maximum((xm * xm).sum(1)[:, None] + (yn * yn).sum(1)[None, :] - 2 * xm @ yn.T, 0)
        ).astype(dtype)
        vv = v.astype(dtype)
        t = cuda_seconds(cp, lambda k=k, vv=vv: k @ vv)
        rec(
            probe="rbf",
            method="dense_Kv_existing_tile",
            dtype=np.dtype(dtype).name,
            m=m,
            n=n,
            seconds=t,
            g_entries_per_s=entries / t / 1e9,
        )
        if dtype == np.float64:
            ref = k @ v
        del k
        cp.get_default_memory_pool().free_all_blocks()
    # (b) fused kernel: float32 products, float64 accumulation, no tile in memory
    kern = cp.RawKernel(FUSED_SRC, "rbf_matvec_f32")
    x32 = cp.ascontiguousarray(xm.astype(cp.float32))
    y32 = cp.ascontiguousarray(yn.astype(cp.float32))
    out = cp.empty(m, dtype=cp.float64)
    grid = ((m + 7) // 8,)

    def fused():
        kern(grid, (256,), (x32, y32, v, out, np.int32(m), np.int32(n), np.float32(gamma)))

    t = cuda_seconds(cp, fused)
    rel = float(cp.abs(out - ref).max() / cp.abs(ref).max())
    rec(
        probe="rbf",
        method="fused_f32_f64acc",
        m=m,
        n=n,
        seconds=t,
        g_entries_per_s=entries / t / 1e9,
        max_rel_diff_vs_f64_dense=rel,
    )
    # the fused kernel at the size of a matrix-free CG product (N x N, no tile at all)
    big = int(os.environ.get("PROBE_FUSED_N", "1000000"))
    if elapsed() < budget:
        xb = rng.standard_normal((big, 8), dtype=cp.float64).astype(cp.float32)
        vb = rng.standard_normal(big, dtype=cp.float64)
        ob = cp.empty(big, dtype=cp.float64)
        gb = ((big + 7) // 8,)
        t = cuda_seconds(
            cp,
            lambda: kern(
                gb, (256,), (xb, xb, vb, ob, np.int32(big), np.int32(big), np.float32(gamma))
            ),
            repeats=1,
        )
        rec(
            probe="rbf",
            method="fused_f32_f64acc_square",
            m=big,
            n=big,
            seconds=t,
            g_entries_per_s=float(big) * big / t / 1e9,
        )


def probe_gpytorch(rec, budget, sizes, lam, tol):
    """GPyTorch's CG (linear_operator's ``linear_cg``) on GPyTorch's RBF kernel.

    Without KeOps (absent on the image) GPyTorch evaluates the kernel whole: the
    dense operator serves while the float32 N x N kernel fits on the device; past
    that, the same kernel module is evaluated in row chunks inside the closure.
    """
    try:
        import gpytorch
        import linear_operator
        import torch
    except Exception as exc:
        rec(probe="gpytorch_cg", error=repr(exc)[:200])
        return
    from linear_operator.utils import linear_cg

    dev = torch.device("cuda")
    kern = gpytorch.kernels.RBFKernel().to(dev)
    kern.lengthscale = math.sqrt(2.0)  # gamma = 0.25 <=> exp(-d^2 / (2 l^2)), l^2 = 2
    free = torch.cuda.mem_get_info()[0]
    for n in sizes:
        if elapsed() > budget:
            rec(probe="gpytorch_cg", n=n, skipped="time")
            break
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(n, 8, device=dev, dtype=torch.float32, generator=g)
            y = torch.randn(n, 1, device=dev, dtype=torch.float32, generator=g)
            with torch.no_grad():
                dense = 2.5 * n * n * 4 < free
                if dense:
                    k = kern(x).to_dense()

                    def matmul(v, k=k):
                        return k @ v + lam * v
                else:
                    chunk = max(1, int(4e9 // (4 * n)))

                    def matmul(v, x=x, chunk=chunk):
                        out = torch.empty_like(v)
                        for s in range(0, x.shape[0], chunk):
                            kb = kern(x[s : s + chunk], x).to_dense()
                            out[s : s + chunk] = kb @ v
                        return out + lam * v

                torch.cuda.synchronize()
                t = time.perf_counter()
                matmul(y)
                torch.cuda.synchronize()
                t_mv = time.perf_counter() - t
                if not dense and t_mv * 3 > budget - elapsed():
                    rec(
                        probe="gpytorch_cg",
                        n=n,
                        mode="chunked",
                        matvec_seconds=t_mv,
                        skipped="one product too slow for a CG in the time left",
                    )
                    continue
                # bounded by the time left (linear_cg cannot be interrupted): a capped
                # solve records the residual it reached in that time
                max_iter = max(1, min(2000, int((budget - elapsed()) / (1.1 * t_mv))))
                t = time.perf_counter()
                sol = linear_cg(matmul, y, tolerance=tol, max_iter=max_iter, max_tridiag_iter=0)
                torch.cuda.synchronize()
                secs = time.perf_counter() - t
                res = torch.linalg.norm(matmul(sol) - y) / torch.linalg.norm(y)
            rec(
                probe="gpytorch_cg",
                n=n,
                mode="dense" if dense else "chunked",
                lam=lam,
                tol=tol,
                max_iter=max_iter,
                seconds=secs,
                matvec_seconds=t_mv,
                relative_residual=float(res),
                g_entries_per_s_matvec=float(n) * n / t_mv / 1e9,
                gpytorch=gpytorch.__version__,
                linear_operator=linear_operator.__version__,
                dtype="float32",
            )
        except Exception as exc:
            rec(probe="gpytorch_cg", n=n, error=repr(exc)[:300])
            break
        finally:
            k = x = y = matmul = None
            torch.cuda.empty_cache()


def probe_fused_cg(cp, rec, budget, sizes, lam, tol):
    """Plain CG with the fused RBF product (float32 products, float64 sums), the
    same lambda and tolerance as the GPyTorch probe: the matrix-free ceiling."""
    kern = cp.RawKernel(FUSED_SRC, "rbf_matvec_f32")
    for n in sizes:
        if elapsed() > budget:
            rec(probe="fused_cg", n=n, skipped="time")
            break
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((n, 8), dtype=cp.float64).astype(cp.float32)
        y = rng.standard_normal(n, dtype=cp.float64)
        out = cp.empty(n, dtype=cp.float64)
        grid = ((n + 7) // 8,)

        def matvec(v, x=x, out=out, n=n, grid=grid):
            kern(
                grid,
                (256,),
                (x, x, cp.ascontiguousarray(v), out, np.int32(n), np.int32(n), np.float32(0.25)),
            )
            return out + lam * v

        t = time.perf_counter()
        a = cp.zeros(n)
        r = y.copy()
        p = r.copy()
        rr = float(r @ r)
        ny = math.sqrt(float(y @ y))
        it = 0
        while math.sqrt(rr) > tol * ny and it < 5000 and elapsed() < budget:
            q = matvec(p)
            step = rr / float(p @ q)
            a += step * p
            r -= step * q
            rr_new = float(r @ r)
            p *= rr_new / rr
            p += r
            rr = rr_new
            it += 1
        cp.cuda.Device().synchronize()
        secs = time.perf_counter() - t
        res = float(cp.linalg.norm(matvec(a) - y)) / ny
        rec(
            probe="fused_cg",
            n=n,
            lam=lam,
            tol=tol,
            iterations=it,
            seconds=secs,
            relative_residual=res,
            converged=math.sqrt(rr) <= tol * ny,
        )


def probe_transfer(cp, rec, sizes=(256, 2048), pageable=False):
    """Host <-> device copy rates, pinned (and pageable when asked): the bound on
    streaming tiles past device memory."""
    import cupyx

    for mb in sizes:
        n = mb * 2**20 // 8
        hosts = [("pinned", cupyx.empty_pinned((n,), dtype=np.float64))]
        if pageable:
            hosts.append(("pageable", np.empty(n)))
        d = cp.empty(n, dtype=cp.float64)
        for memory, h in hosts:
            h[:] = 1.0
            t_h2d = cuda_seconds(cp, lambda d=d, h=h: d.set(h))
            t_d2h = cuda_seconds(cp, lambda d=d, h=h: d.get(out=h))
            rec(
                probe="transfer",
                megabytes=mb,
                host=memory,
                h2d_gb_s=n * 8 / t_h2d / 1e9,
                d2h_gb_s=n * 8 / t_d2h / 1e9,
            )
        del hosts, h, d
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_probe.jsonl")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all probes")
    ap.add_argument("--only", default="cholesky,tile,rbf,transfer,gpytorch,fused_cg")
    args = ap.parse_args(argv)
    rec = Recorder(args.out)
    only = set(args.only.split(","))
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        rec(probe="machine", gpu=smi.stdout.strip(), python=sys.version.split()[0])
    except Exception as exc:
        rec(probe="machine", error=repr(exc))
    import cupy as cp

    rec(
        probe="versions",
        cupy=cp.__version__,
        numpy=np.__version__,
        cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
    )
    steps = [
        (
            "cholesky",
            lambda: probe_cholesky(cp, rec, 0.35 * args.budget, [8192, 16384, 32768, 49152, 65536]),
        ),
        ("tile", lambda: probe_tile_cholesky(cp, rec, 0.55 * args.budget, 32768, 8192)),
        ("rbf", lambda: probe_rbf(cp, rec, 0.75 * args.budget, 8192, 131072)),
        ("transfer", lambda: probe_transfer(cp, rec)),
        (
            "gpytorch",
            lambda: probe_gpytorch(
                rec, 0.8 * args.budget, [20_000, 100_000, 1_000_000], 1e-2, 1e-6
            ),
        ),
        (
            "fused_cg",
            lambda: probe_fused_cg(
                cp, rec, 0.95 * args.budget, [20_000, 100_000, 1_000_000], 1e-2, 1e-6
            ),
        ),
    ]
    for name, step in steps:
        if name not in only:
            continue
        try:
            step()
        except Exception:
            rec(probe=name, error=traceback.format_exc()[-600:])
    rec(probe="done")


if __name__ == "__main__":
    main()
