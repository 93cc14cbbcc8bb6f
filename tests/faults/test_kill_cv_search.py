"""Issue #18, item 3: `krr run` with a `cv:` section, SIGKILLed in the middle of its
search (a setting's data stored, its marker not yet), resumes from its finished
settings and selects exactly what an uninterrupted run selects.

The clean and the resumed run stop after the select stage (``--until select``): every
assertion is on that stage's outputs, and the stages after it (a Cholesky fit, predict,
evaluate: about 5 s a run on 2 cores) do not touch them."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import yaml

INJECT = Path(__file__).resolve().parents[1] / "faultinject"

sys.path.insert(0, str(INJECT.parent))
from _diabetes_run import CV, RUN  # noqa: E402

# 2 folds, not 3: the 4 settings (one per gamma, its alphas together), the kill at the 3rd
# and the resume are the same, at two thirds of the work
CONFIG = {**RUN, "cv": {**CV, "folds": 2}}


@pytest.mark.slow
def test_sigkilled_search_resumes_and_selects_the_same(tmp_path, krr_run):
    # every run in a fresh process, as a user's are: the search's last bits follow the BLAS
    # width of the process (OpenBLAS on an AMD EPYC), and the test runner's own process may
    # carry another width than a fresh one (0.5012692326649727 vs ...694 in a full suite)
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(CONFIG))
    clean = krr_run.run(conf, tmp_path / "clean", "--until", "select", json=True)
    assert clean.returncode == 0, clean.stderr[-3000:]

    run = tmp_path / "run"
    # dies writing the 3rd setting's marker
    killed = krr_run.run(conf, run, json=True, inject=True, env={"KRR_KILL_SETTING_AT": "3"},
                         timeout=600)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    done = sorted(p.name for p in (run / "select" / "settings").glob("setting_*.json"))
    assert done == ["setting_000.json", "setting_001.json"]  # the 3rd has data, no marker

    resumed = krr_run.run(conf, run, "--until", "select", json=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = json.loads((tmp_path / "clean" / "select" / "cv_search.json").read_text())
    got = json.loads((run / "select" / "cv_search.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    sel = manifest["stages"]["select"]["outputs"]
    assert sel["settings_resumed"] == 2
    assert got["best_params"] == want["best_params"]
    assert got["best_score"] == want["best_score"]
