"""Random-point SIGKILLs with corruption injected between runs.

Each scenario (seeded, so a failure is reproducible) kills ``krr run`` at a random
completion marker of a random array, flips one byte in a random stored chunk of
the run directory, kills it again at another random point, and finally lets it
finish. The final α and predictions must be bitwise identical to those of an
uninterrupted run: every damaged chunk is either never needed again or detected
by its checksum and recomputed by the stage that owns it.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


#: (marker-name substring, how many such markers the run writes at least)
KILL_POINTS = [("X_train/", 6), ("gram/", 21), ("chol/", 21), ("predictions/", 10)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, krr_main, run_results, fault_run):
    d = tmp_path_factory.mktemp("killcorrupt")
    conf = fault_run(d, "killcorrupt", n=800, d=4, seed=1, target=np.cos, n_new=700)
    ref = d / "ref"
    r = krr_main.run(conf, ref)
    assert r.returncode == 0, r.stderr[-3000:]
    return conf, run_results(ref)


def _chunk_files(run_dir: Path) -> list[Path]:
    """Stored data chunks (Zarr v3 ``c/...`` keys) of every array in the run directory.

    The temporary file of a write the kill interrupted (``*.tmp``, ``*.partial``; it
    may be empty) is not a stored chunk: the next run sweeps it, so it is left out.
    """
    return sorted(
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and "c" in p.relative_to(run_dir).parts
        and "_markers" not in p.parts
        and p.suffix not in (".tmp", ".partial")
    )


def _flip_byte(path: Path, rnd: random.Random) -> None:
    data = bytearray(path.read_bytes())
    pos = rnd.randrange(len(data))
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_kills_with_corruption_between_runs(
    setup, tmp_path, seed, krr_run, krr_main, run_results
):
    conf, want = setup
    rnd = random.Random(seed)
    run_dir = tmp_path / "run"
    history = []
    for _attempt in range(2):
        match, most = rnd.choice(KILL_POINTS)
        at = rnd.randint(1, most)
        r = krr_run.run(conf, run_dir, kill=(match, at), timeout=600)
        history.append((match, at, r.returncode))
        # a kill point past the end of that array's markers lets the run finish
        assert r.returncode in (0, -signal.SIGKILL), (history, r.stderr[-3000:])
        chunks = _chunk_files(run_dir)
        if chunks:
            victim = rnd.choice(chunks)
            _flip_byte(victim, rnd)
            history.append(("flipped", str(victim.relative_to(run_dir))))
    final = krr_main.run(conf, run_dir)
    assert final.returncode == 0, (history, final.stderr[-3000:])
    # what the killed writers left half-written was swept when its store was reopened
    left = [p for p in run_dir.rglob("*") if p.suffix in (".tmp", ".partial")]
    assert left == [], (history, left)
    got = run_results(run_dir)
    assert got.keys() == want.keys(), history
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{key}: {history}")


@pytest.mark.parametrize("target", ["model/model/dual_coef", "predict/predictions.zarr/test"])
def test_damaged_final_output_of_a_complete_run_is_recomputed(
    setup, tmp_path, target, krr_main, run_results
):
    """A rerun of a complete run re-reads its final outputs and repairs a flipped byte."""
    conf, want = setup
    run_dir = tmp_path / "run"
    assert krr_main.run(conf, run_dir).returncode == 0
    victim = next(p for p in _chunk_files(run_dir) if target in str(p.relative_to(run_dir)))
    _flip_byte(victim, random.Random(0))
    again = krr_main.run(conf, run_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "failed verification" in again.stderr + again.stdout
    got = run_results(run_dir)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
