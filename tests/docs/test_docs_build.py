"""The API reference (``docs/api``) builds from the docstrings with warnings as errors.

``sphinx-build -W --keep-going`` fails on a docstring that Sphinx, docutils or numpydoc
cannot read, on a page that names an object that no longer exists, and on a broken
directive; so the reference cannot rot unnoticed. The pages must exist and document the
public API: every name of ``pipeline.__all__``, every parameter of ``KernelRidge`` and
``KernelRidge.fit``, the stage functions, ``FitPlan``/``plan_fit`` and each ``krr``
command with its exit codes.

Sphinx, numpydoc and sphinx-argparse are in the ``test`` extra. Where they are missing the
test is skipped with the reason, except under CI (``CI`` set), where it fails: CI installs
``.[test]``, so a skip there would hide a broken reference.

A build that passed is kept in the temporary directory under the digest of everything it
reads (``docs/api``, the ``pipeline`` sources, the Python and documentation tools'
versions): the next run with the same inputs reuses it instead of building again (the
build is a function of them). Any change to a docstring, page or tool builds afresh.
``KRR_DOCS_BUILD_CACHE=0`` always builds.
"""

from __future__ import annotations

import hashlib
import html
import importlib.metadata
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = (
    "index",
    "estimators",
    "kernels",
    "storage",
    "tiles",
    "gram",
    "solvers",
    "predict",
    "policy",
    "stages",
    "parallel",
    "cli",
)
REQUIRED = {"sphinx": "sphinx", "numpydoc": "numpydoc", "sphinxarg": "sphinx-argparse"}
#: the distributions whose versions a kept build was made with
TOOLS = ("sphinx", "numpydoc", "sphinx-argparse", "docutils", "jinja2", "alabaster")


def _require_sphinx() -> None:
    missing = [pip for mod, pip in REQUIRED.items() if importlib.util.find_spec(mod) is None]
    if not missing:
        return
    msg = f"the docs build needs {', '.join(missing)}: pip install -e '.[test]' (or '.[docs]')"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _inputs_digest() -> str:
    """The digest of what the build reads: every file under ``docs/api`` and ``pipeline``
    (names and bytes), the Python version and the documentation tools' versions."""
    h = hashlib.sha256(sys.version.encode())
    for dist in TOOLS:
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    for top in (ROOT / "docs" / "api", ROOT / "pipeline"):
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and "_build" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:32]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    _require_sphinx()
    keep = os.environ.get("KRR_DOCS_BUILD_CACHE", "1") != "0"
    kept = Path(tempfile.gettempdir()) / "krr-pipeline-docs-build" / _inputs_digest()
    if keep and (kept / "html" / "index.html").is_file():
        return kept / "html"  # a passing build of these very inputs
    out = tmp_path_factory.mktemp("docs")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html"]
    cmd += ["-d", str(out / "doctrees"), str(ROOT / "docs" / "api"), str(out / "html")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"sphinx-build failed:\n{log[-6000:]}"
    # docutils messages from nested parsers (sphinx-argparse) and numpydoc's docstring
    # warnings reach stderr without failing the build: they count as warnings too
    bad = [
        line
        for line in log.splitlines()
        if re.search(r"WARNING|ERROR|SEVERE|in the docstring of", line)
    ]
    assert not bad, "the docs build warned:\n" + "\n".join(bad[:40])
    if keep:  # kept whole or not at all: renamed into place, another run's copy wins
        kept.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=kept.parent))
        shutil.copytree(out / "html", staged / "html")
        try:
            staged.rename(kept)
        except OSError:  # another run kept the same build first
            shutil.rmtree(staged, ignore_errors=True)
    return out / "html"


def _text(page: Path) -> str:
    return html.unescape(page.read_text(encoding="utf-8"))


def _section(doc: str, anchor: str, stop: str) -> str:
    """The HTML from ``id="anchor"`` up to the next ``id="stop..."`` (or the end)."""
    i = doc.find(f'id="{anchor}"')
    assert i >= 0, f"{anchor} is not documented"
    j = doc.find(f'id="{stop}', i + len(anchor) + 5)
    return doc[i : j if j > 0 else len(doc)]


def _param_names(section: str) -> set[str]:
    """Parameter names numpydoc rendered (``<strong>a, b</strong>`` gives a and b)."""
    names: set[str] = set()
    for group in re.findall(r"<strong>([^<]+)</strong>", section):
        names.update(n.strip().lstrip("*") for n in group.split(","))
    return names


def test_docs_build_and_main_pages(built):
    for page in PAGES:
        assert (built / f"{page}.html").is_file(), f"docs/api page {page}.html was not built"
    index = _text(built / "index.html")
    for page in PAGES[1:]:
        assert f'href="{page}.html"' in index, f"index does not link {page}"


def test_public_api_is_documented(built):
    import pipeline

    doc = _text(built / "estimators.html")
    for name in pipeline.__all__:
        if name in ("__version__", "kernels"):
            continue
        assert f'id="pipeline.{name}"' in doc, f"pipeline.{name} is not in the reference"
    kernels = _text(built / "kernels.html")
    for name in ("RBF", "Laplacian", "make_kernel", "kernel_fingerprint"):
        assert f'id="pipeline.kernels.{name}"' in kernels


def test_kernel_ridge_parameters_are_documented(built):
    from pipeline import KernelRidge

    doc = _text(built / "estimators.html")
    fit = _param_names(_section(doc, "pipeline.KernelRidge.fit", "pipeline."))
    wanted = [p for p in inspect.signature(KernelRidge.fit).parameters if p != "self"]
    assert wanted and set(wanted) <= fit, f"KernelRidge.fit documents {fit}, not all of {wanted}"
    cls = _param_names(_section(doc, "pipeline.KernelRidge", "pipeline.KernelRidge."))
    params = set(KernelRidge().get_params())
    assert params <= cls, f"KernelRidge's docstring lacks {sorted(params - cls)}"


def test_stages_policy_and_cli_pages(built):
    stages = _text(built / "stages.html")
    for name in ("ingest", "select", "gram", "solve", "model", "predict", "evaluate"):
        assert f'id="pipeline.stages.{name}.run"' in stages, f"stage {name}'s run is missing"
    assert 'id="pipeline.stages.run_stages"' in stages
    policy = _text(built / "policy.html")
    for name in ("FitPlan", "plan_fit"):
        assert f'id="pipeline.plan.fit_plan.{name}"' in policy
    import argparse

    from pipeline.cli import build_parser
    from pipeline.cli.errors import EXIT_CODES

    page = _text(built / "cli.html")
    cli = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page))
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) >= {"run", "status", "predict", "validate", "unlock"}
    for command, parser in sub.choices.items():
        assert f'<section id="krr-{command}"' in page, f"the CLI page lacks `krr {command}`"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert flag in cli, f"the CLI page lacks `krr {command} {flag}`"
    for code, meaning in EXIT_CODES.items():
        assert meaning.split(":")[0] in cli, f"exit code {code} is not on the CLI page"
