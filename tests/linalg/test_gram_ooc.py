"""Out-of-core: a Gram several times larger than the memory the build may use.

Method. ``resource.setrlimit(RLIMIT_AS)`` is unreliable here (OpenBLAS and the
thread pools reserve large virtual ranges without touching them), so the test
measures instead: a fresh subprocess imports everything, creates X and a tiny
warm-up Gram (so that import- and first-use costs are in the baseline), records
its resident set size (RSS) as the baseline, builds the big Gram, and reports
the peak RSS of its whole life (``getrusage(RUSAGE_SELF).ru_maxrss``). The peak
above the baseline must stay under ``BUDGET`` (100 MiB), and the whole process's
peak, interpreter and libraries included (about 0.3 GB), must stay under a
quarter of the stored lower-triangle tiles (1.68 GB; the full N x N matrix is
3.2 GB). Page cache is not part of RSS, so the written data does not count, as
it should not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.gram import open_gram

N, D, BLOCK = 20_000, 8, 1000
BUDGET = 100 * 2**20  # bytes above the interpreter's baseline

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    import numpy as np, psutil
    from pipeline.diagnostics import peak_rss_bytes
    from pipeline.linalg.gram import build_gram
    from pipeline.kernels import RBF

    n, d, block, store = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    X = np.random.default_rng(0).standard_normal((n, d))
    build_gram(X[:300], RBF(gamma=0.1), store + "-warmup", 100, progress=False)
    base = psutil.Process().memory_info().rss
    g, stats = build_gram(X, RBF(gamma=0.1), store, block, progress=False, return_stats=True)
    peak = peak_rss_bytes()  # VmHWM: ru_maxrss would inherit the parent pytest peak
    print(json.dumps({"base": base, "peak": peak, "n_computed": stats.n_computed}))
    """
)


@pytest.mark.slow
def test_peak_rss_is_a_fraction_of_the_gram(tmp_path):
    store = str(tmp_path / "store")
    try:
        _run_and_check(store)
    finally:
        shutil.rmtree(store, ignore_errors=True)  # pytest keeps recent tmp dirs: free 1.7 GB


def _run_and_check(store: str) -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(N), str(D), str(BLOCK), store],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    nb = -(-N // BLOCK)
    stored_bytes = nb * (nb + 1) // 2 * BLOCK * BLOCK * 8
    assert stored_bytes >= 16 * BUDGET
    extra = out["peak"] - out["base"]
    assert out["n_computed"] == nb * (nb + 1) // 2
    assert extra <= BUDGET, (
        f"build used {extra / 2**20:.0f} MiB above baseline, budget {BUDGET / 2**20:.0f} MiB "
        f"for a {stored_bytes / 2**20:.0f} MiB Gram"
    )
    assert 4 * out["peak"] <= stored_bytes, (
        f"process peak RSS {out['peak'] / 2**20:.0f} MiB is more than a quarter of the "
        f"{stored_bytes / 2**20:.0f} MiB Gram"
    )
    # the data really is on disk and correct (spot-check tiles, not the whole thing)
    X = np.random.default_rng(0).standard_normal((N, D))
    g = open_gram(store)
    k = RBF(gamma=0.1)
    for i, j in [(0, 0), (7, 3), (19, 19), (19, 0)]:
        r, c = g.grid.row_slice(i), g.grid.col_slice(j)
        np.testing.assert_allclose(g.read_tile(i, j), k(X[r], X[c]), rtol=0, atol=1e-12)
