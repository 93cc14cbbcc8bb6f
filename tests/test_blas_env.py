"""The package root shortens OpenBLAS's spin after each call before SciPy loads it
(:mod:`pipeline._blas_env`), unless the user set ``OPENBLAS_THREAD_TIMEOUT``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.constants as policy_constants
from pipeline import _blas_env

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import json, os, sys\n"
    "{first}\n"
    "import pipeline\n"
    "s = pipeline._blas_env.state()\n"
    "s['env'] = os.environ.get('OPENBLAS_THREAD_TIMEOUT')\n"
    "print(json.dumps(s))\n"
)


def _probe(first: str = "", value: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    if value is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = value
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_sets_the_spin_before_scipy_loads():
    s = _probe()
    want = str(policy_constants.OPENBLAS_THREAD_TIMEOUT)
    assert s == {"user_value": None, "scipy_blas_loaded_before": False, "value": want,
                 "env": want}  # fmt: skip


def test_a_users_value_wins():
    s = _probe(value="20")
    assert s["env"] == s["value"] == s["user_value"] == "20"


def test_scipy_loaded_first_is_reported():
    s = _probe(first="import scipy.linalg")
    assert s["scipy_blas_loaded_before"] is True


def test_zero_leaves_the_variable_alone(monkeypatch):
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    monkeypatch.setattr(_blas_env, "_STATE", {})
    monkeypatch.setattr(_blas_env, "OPENBLAS_THREAD_TIMEOUT", 0)
    _blas_env.apply()
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    assert _blas_env.state()["value"] is None


@pytest.mark.parametrize("value", ["4", "7"])
def test_apply_runs_once(monkeypatch, value):
    monkeypatch.setattr(_blas_env, "_STATE", {})
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", value)
    _blas_env.apply()
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "9")
    _blas_env.apply()  # a second call changes nothing
    assert _blas_env.state()["user_value"] == value
