"""Kill-and-resume of a batch prediction: SIGKILL mid-run, rerun computes only what is missing."""

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
from pipeline.linalg.blockwise import predict

M, N, D, BLOCK, TRAIN_BLOCK = 1000, 200, 4, 50, 100
N_BLOCKS = M // BLOCK

# The child waits 0.1 s before recording each finished row block (its completion
# marker: every tile of every array is recorded by TileMarkers.mark), so the kill
# lands while row blocks are still being done. The kernel is the plain RBF (its
# tiles come from the fused evaluators, which never call RBF._eval: a slowed
# ``_eval`` slowed nothing, and under load all 20 blocks were done at the kill).
CHILD = textwrap.dedent(
    f"""
    import sys, time
    import numpy as np
    from pipeline.kernels import RBF
    from pipeline.linalg.blockwise import predict
    from pipeline.storage.markers import TileMarkers

    _mark = TileMarkers.mark

    def slow_mark(self, *args, **kwargs):
        time.sleep(0.1)
        return _mark(self, *args, **kwargs)

    TileMarkers.mark = slow_mark
    d = sys.argv[1]
    X, Xt, a = (np.load(f"{{d}}/{{n}}.npy") for n in ("x", "xt", "a"))
    predict(X, Xt, a, RBF(gamma=0.5), out=d + "/out", block_size={BLOCK},
            train_block_size={TRAIN_BLOCK}, progress=False)
    print("finished")
    """
)


def _marker_dir(d):
    return d / "out" / "_markers" / "predictions"


def _markers(d) -> dict[str, tuple[int, bytes]]:
    md = _marker_dir(d)
    if not md.exists():
        return {}
    out = {}
    for p in md.iterdir():
        if p.name.endswith(".tmp"):
            continue
        try:
            out[p.name] = (p.stat().st_mtime_ns, p.read_bytes())
        except FileNotFoundError:
            continue
    return out


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path):
    rng = np.random.default_rng(7)
    X = rng.standard_normal((M, D))
    Xt = rng.standard_normal((N, D))
    a = rng.standard_normal(N)
    for name, arr in (("x", X), ("xt", Xt), ("a", a)):
        np.save(tmp_path / f"{name}.npy", arr)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_markers(tmp_path)) < 3:
            assert child.poll() is None, f"child ended early: {child.communicate()}"
            assert time.monotonic() < deadline, "no markers appeared in time"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    before = _markers(tmp_path)
    assert 3 <= len(before) < N_BLOCKS, f"{len(before)} of {N_BLOCKS} blocks done at the kill"

    k = RBF(gamma=0.5)
    res = predict(
        X, Xt, a, k, out=str(tmp_path / "out"), block_size=BLOCK, train_block_size=TRAIN_BLOCK,
        progress=False,
    )  # fmt: skip
    assert res.n_skipped == len(before)
    assert res.n_computed == N_BLOCKS - len(before)
    after = _markers(tmp_path)
    assert len(after) == N_BLOCKS
    for key, rec in before.items():
        assert after[key] == rec, f"completed block {key} was recomputed"

    clean = predict(
        X, Xt, a, k, out=str(tmp_path / "clean"), block_size=BLOCK, train_block_size=TRAIN_BLOCK,
        progress=False,
    )  # fmt: skip
    np.testing.assert_array_equal(res.to_numpy(), clean.to_numpy())
    np.testing.assert_allclose(res.to_numpy(), k(X, Xt) @ a, rtol=1e-10, atol=1e-10)


def test_resume_with_another_block_size_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    X, Xt, a = rng.standard_normal((120, 2)), rng.standard_normal((30, 2)), rng.standard_normal(30)
    predict(X, Xt, a, RBF(), out=str(tmp_path), block_size=50, progress=False)
    with pytest.raises(ValueError, match="pass overwrite=True"):
        predict(X, Xt, a, RBF(), out=str(tmp_path), block_size=40, progress=False)
