"""A Nyström solve SIGKILLed mid-way resumes from its last checkpoint and ends with the
bits of an uninterrupted solve (issue #45 item 1): FALKON's CG mid-iteration, and the
direct method mid-pass (its row blocks' sums)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from pipeline.linalg.nystrom_solve import nystrom_solve

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from pipeline.linalg.nystrom_solve import nystrom_solve

    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3))
    y = np.sin(X[:, 0])

    def die(state):
        if state.iteration == 9:
            os.kill(os.getpid(), signal.SIGKILL)

    nystrom_solve(X, y, "rbf", 1e-2, n_centers=70, block_size=64, tol=1e-10,
                  checkpoint_every=4, store=sys.argv[1], callback=die)
    """
)


def test_sigkill_mid_solve_resumes_with_the_same_bits(tmp_path):
    store = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, store], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()[-2000:]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3))
    y = np.sin(X[:, 0])
    kw = dict(n_centers=70, block_size=64, tol=1e-10, checkpoint_every=4)
    resumed = nystrom_solve(X, y, "rbf", 1e-2, **kw, store=store)
    assert resumed.cg.start_iter == 8  # the last checkpoint before the kill
    whole = nystrom_solve(X, y, "rbf", 1e-2, **kw)
    assert resumed.cg.n_iter == whole.cg.n_iter and resumed.cg.converged
    np.testing.assert_array_equal(resumed.coef, whole.coef)


DIRECT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from pipeline.linalg import nystrom_solve as ns

    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3))
    y = np.sin(X[:, 0])
    real, seen = ns.NystromNormalOperator._block, [0]

    def block(self, xb):
        seen[0] += 1
        if seen[0] == 6:  # in block 5 of 8: the last state is at block 4
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, xb)

    ns.NystromNormalOperator._block = block
    ns.nystrom_solve(X, y, "rbf", 1e-2, n_centers=70, block_size=64, method="direct",
                     checkpoint_every=2, store=sys.argv[1])
    """
)


def test_sigkill_mid_direct_pass_resumes_with_the_same_bits(tmp_path):
    store = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", DIRECT_SCRIPT, store], env=env, capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr.decode()[-2000:]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3))
    y = np.sin(X[:, 0])
    kw = dict(n_centers=70, block_size=64, method="direct", checkpoint_every=2)
    resumed = nystrom_solve(X, y, "rbf", 1e-2, **kw, store=store)
    assert resumed.info["resumed"] and resumed.info["start_block"] == 4
    assert resumed.info["n_blocks"] == 8
    whole = nystrom_solve(X, y, "rbf", 1e-2, **kw)
    np.testing.assert_array_equal(resumed.coef, whole.coef)
