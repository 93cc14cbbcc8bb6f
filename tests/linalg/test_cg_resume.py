"""CG checkpoints: a SIGKILLed solve resumes from its last checkpoint, not from zero."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.kernels import RBF
from pipeline.linalg.cg import CGConvergenceWarning, conjugate_gradient
from pipeline.linalg.cg_checkpoint import CGCheckpoint, cg_fingerprint, resumable_cg
from pipeline.linalg.matvec import MatrixFreeKernelOperator
from pipeline.linalg.precond import IdentityPreconditioner

TOL = 1e-8
EVERY = 5


class DenseTwin:
    """The matrix-free operator's fingerprint with a dense in-memory product (fast and
    deterministic, so a killed and an uninterrupted solve take identical steps)."""

    def __init__(self, op: MatrixFreeKernelOperator) -> None:
        self.fingerprint = op.fingerprint
        self.A = op.kernel(op.X) + op.shift * np.eye(op.n)
        self.op = op

    def matvec(self, V):
        return self.A @ V


def make_problem(shift: float = 400 * 1e-5):
    """An ill-conditioned RBF system that takes a few hundred plain CG iterations."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = np.column_stack([np.sin(X.sum(1)), np.cos(X[:, 0])])
    op = MatrixFreeKernelOperator(X, RBF(gamma=0.5), shift, block_size=200)
    return DenseTwin(op), y


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_cg_resume import make_problem, TOL, EVERY
    from pipeline.linalg.cg_checkpoint import resumable_cg

    op, y = make_problem()

    class Slow:
        fingerprint = op.fingerprint
        def matvec(self, V):
            time.sleep(0.02)
            return op.matvec(V)

    resumable_cg(Slow(), y, {store!r}, tol=TOL, every=EVERY, max_iter=5000)
    print("FINISHED")
    """
)


@pytest.mark.slow
def test_sigkilled_solve_resumes_from_its_checkpoint(tmp_path):
    op, y = make_problem()
    reference = conjugate_gradient(op.matvec, y, tol=TOL, max_iter=5000)
    assert reference.converged and reference.n_iter > 60

    store = str(tmp_path / "run")
    script = CHILD.format(tests=str(Path(__file__).parent), store=store)
    fp = cg_fingerprint(op.fingerprint, IdentityPreconditioner().fingerprint, y, TOL)
    ckpt = CGCheckpoint(store, fp, every=EVERY)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            it = ckpt.iteration
            if it is not None and it >= 30:
                break
            assert proc.poll() is None, "the child finished or died before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint at iteration >= 30 within 90 s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert b"FINISHED" not in proc.stdout.read()
    saved = ckpt.iteration
    assert saved is not None and saved >= 30 and saved % EVERY == 0
    assert saved < reference.n_iter

    # resume in this process: same operator, same y, same tol
    resumed = resumable_cg(op, y, store, tol=TOL, every=EVERY, max_iter=5000)
    assert resumed.start_iter == saved  # restarted from the checkpoint, not from zero
    assert resumed.converged
    assert np.all(resumed.rel_residual <= TOL)
    true = np.linalg.norm(y - op.matvec(resumed.x), axis=0) / np.linalg.norm(y, axis=0)
    assert np.all(true <= TOL)
    # only the remaining iterations were run, and the whole solve took as many as without a kill
    assert abs(resumed.n_iter - reference.n_iter) <= 1
    assert resumed.history.shape[0] == resumed.n_iter + 1
    np.testing.assert_allclose(resumed.x, reference.x, rtol=1e-6, atol=1e-8)
    # a finished solve resumes at its end and does no further work
    again = resumable_cg(op, y, store, tol=TOL, every=EVERY, max_iter=5000)
    assert again.start_iter == again.n_iter == resumed.n_iter


def _small_problem(shift=1.0):
    op, y = make_problem(shift)
    return op, y[:, 0]


def test_checkpoint_is_guarded_by_the_fingerprint(tmp_path):
    op, y = _small_problem()
    store = str(tmp_path)
    first = resumable_cg(op, y, store, tol=1e-3, every=2)
    assert first.converged and first.n_iter >= 2
    # same solve: resumes at the end
    assert resumable_cg(op, y, store, tol=1e-3, every=2).start_iter == first.n_iter
    # the real matrix-free operator has the same fingerprint: it resumes the dense twin's solve
    real = resumable_cg(op.op, y, store, tol=1e-3, every=2)
    assert real.start_iter == first.n_iter and real.converged
    # another y, another shift (lambda), another tol: each starts from zero
    assert resumable_cg(op, 2 * y, store, tol=1e-3, every=2).start_iter == 0
    other, _ = _small_problem(shift=2.0)
    assert resumable_cg(other, y, store, tol=1e-3, every=2).start_iter == 0
    assert resumable_cg(op, y, store, tol=1e-4, every=2).start_iter == 0
    # one checkpoint per name: the last solve replaced the first one's
    assert resumable_cg(op, y, store, tol=1e-3, every=2).start_iter == 0


def test_torn_slot_falls_back(tmp_path):
    op, y = _small_problem()
    store = str(tmp_path)
    fp = cg_fingerprint(op.fingerprint, IdentityPreconditioner().fingerprint, y, 1e-12)
    ckpt = CGCheckpoint(store, fp, every=1)
    with pytest.warns(CGConvergenceWarning):
        res = conjugate_gradient(op.matvec, y, tol=1e-12, callback=ckpt, max_iter=4)
    assert res.n_iter == 4 and ckpt.iteration == 4
    rec = ckpt.markers.record("state")
    live = Path(ckpt.root) / f"slot{rec['slot']}.npz"
    spare = Path(ckpt.root) / f"slot{1 - rec['slot']}.npz"
    # a half-written spare slot (a kill during the next save) does not matter
    spare.write_bytes(b"garbage")
    state = CGCheckpoint(store, fp).load()
    assert state is not None and state.iteration == 4
    np.testing.assert_array_equal(state.x[:, 0], res.x)
    # an unreadable live slot means no usable checkpoint: start afresh, never crash
    live.write_bytes(b"garbage")
    assert CGCheckpoint(store, fp).load() is None
    ckpt.clear()
    assert ckpt.iteration is None


def test_bad_arguments(tmp_path):
    op, y = _small_problem()
    with pytest.raises(ValueError, match="every"):
        CGCheckpoint(str(tmp_path), "fp", every=0)
    yb = y.copy()
    yb[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        resumable_cg(op, yb, str(tmp_path))
    with pytest.raises(ValueError, match="fingerprint"):
        resumable_cg(lambda V: V, y, str(tmp_path))
