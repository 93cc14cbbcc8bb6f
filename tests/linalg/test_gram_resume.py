"""Kill-and-resume: a Gram build SIGKILLed mid-way resumes without redoing finished tiles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.gram import build_gram, open_gram, read_sym_tile

N, D, BLOCK, GAMMA = 600, 6, 60, 0.1
N_TILES = 55  # 10 row blocks -> 10 * 11 / 2 lower tiles

# The child waits 50 ms before recording each finished tile (its completion marker:
# TileMarkers.mark records every tile), so the parent can kill the build while it is
# half done. The kernel is the plain RBF: its tiles come from the fused evaluators,
# which never call RBF._eval (a slowed ``_eval`` slowed nothing).
CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from pipeline.linalg.gram import build_gram
    from pipeline.kernels import RBF
    from pipeline.storage.markers import TileMarkers

    _mark = TileMarkers.mark

    def slow_mark(self, *args, **kwargs):
        time.sleep(0.05)
        return _mark(self, *args, **kwargs)

    TileMarkers.mark = slow_mark
    x_path, store, block, gamma = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    build_gram(x_path, RBF(gamma=gamma), store, block, progress=False)
    print("FINISHED", flush=True)
    """
)


def _assemble(g):
    out = np.empty(g.shape)
    for i in range(g.grid.n_row_blocks):
        for j in range(g.grid.n_col_blocks):
            out[g.grid.row_slice(i), g.grid.col_slice(j)] = read_sym_tile(g, i, j)
    return out


def _n_markers(marker_dir: str) -> int:
    try:
        return sum(1 for f in os.listdir(marker_dir) if not f.endswith(".tmp"))
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_sigkill_mid_build_then_resume(tmp_path):
    X = np.random.default_rng(3).standard_normal((N, D))
    x_path = str(tmp_path / "x.npy")
    np.save(x_path, X)
    store = str(tmp_path / "store")
    marker_dir = os.path.join(store, "_markers", "gram")

    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, x_path, store, str(BLOCK), str(GAMMA)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while _n_markers(marker_dir) < 8:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the child never completed 8 tiles"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    out, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert b"FINISHED" not in out

    g = open_gram(store)
    done_before = g.markers.done()
    records_before = {t: g.markers.record(t) for t in done_before}
    assert 8 <= len(done_before) < N_TILES, len(done_before)

    g2, stats = build_gram(x_path, RBF(gamma=GAMMA), store, BLOCK, return_stats=True)
    assert g2 == g
    # nothing completed before the kill was computed again ...
    assert stats.n_skipped == len(done_before)
    assert stats.n_computed == N_TILES - len(done_before)
    assert set(stats.computed).isdisjoint(done_before)
    assert set(stats.computed) | done_before == set(g.grid.lower_tiles())
    # ... and their completion records are the ones the killed run wrote
    for t, rec in records_before.items():
        assert g2.markers.record(t) == rec
    assert g2.markers.done() == set(g.grid.lower_tiles())

    # identical to an uninterrupted build, and to the dense kernel
    fresh = build_gram(x_path, RBF(gamma=GAMMA), str(tmp_path / "fresh"), BLOCK)
    K = _assemble(g2)
    np.testing.assert_array_equal(K, _assemble(fresh))
    np.testing.assert_allclose(K, RBF(gamma=GAMMA)(X), rtol=0, atol=1e-12)
    _, again = build_gram(x_path, RBF(gamma=GAMMA), store, BLOCK, return_stats=True)
    assert again.n_computed == 0
