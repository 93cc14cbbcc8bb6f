"""The one reuse rule: every mechanism that reuses stored work decides "same work?" with
:func:`pipeline.storage.fingerprint.same_work`, a function of two fingerprints.

History (issue #43, "Five reuse mechanisms, each with its own identity rule"): the
stored arrays (Gram, factor, predictions, ingest rows), their tile markers, the CG
checkpoints and their adoption from another store, the CV search's checkpoints, the
runner's stage skip/resume/invalidate and its adoption of another configuration's
stage, the run directory's data identity, the ingest's changed-source check and the
prediction-store verification each compared fingerprints (or identities) their own way
(``==``, ``!=``, ``not in (None, ...)``, a dict's ``!=``), so an empty or missing
fingerprint was "the same work" at some and not at others.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline.storage import StoreMismatchError, TileMarkers, open_tiled_array, same_work

ROOT = Path(__file__).resolve().parents[2] / "pipeline"

#: comparisons of fingerprint-like values that decide no reuse, each with its reason
NOT_REUSE = {
    # the artifact's metadata checksum: an integrity check of what was read
    ("models/artifact.py", "fingerprint_obj(body) != meta.get('meta_checksum')"),
    # a kernel's spec loads back as the same class: no stored work involved
    (
        "kernels/base.py",
        "kernel_identity(kernel_from_spec(kernel.to_spec())) == kernel_identity(kernel)",
    ),
}
_NAMES = re.compile(r"fingerprint|\bfp\b|_fp\b|identity|tiling")


def test_the_rule():
    assert same_work("3f2a", "3f2a")
    assert not same_work("3f2a", "3f2b")
    # a result without a fingerprint (an older writer's) is never the same work
    assert not same_work(None, "3f2a")
    # and a request that names no work reuses nothing, even a result recorded the same way
    assert not same_work(None, None)
    assert not same_work("", "")


def _own_comparisons() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "storage/fingerprint.py":  # the rule's home
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            if not any(isinstance(o, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for o in node.ops):
                continue
            if isinstance(node.left, ast.Constant):  # "fingerprint" in attrs: a key present
                continue
            sides = [ast.unparse(x) for x in (node.left, *node.comparators)]
            if any(_NAMES.search(s) for s in sides):
                src = ast.unparse(node)
                if (rel, src) not in NOT_REUSE:
                    out.append((rel, node.lineno, src))
    return out


def test_no_mechanism_compares_fingerprints_itself():
    assert _own_comparisons() == []


def test_the_not_reuse_list_is_exact():
    # an entry that no longer occurs must go (the list can only shrink)
    found = set()
    for rel, src in NOT_REUSE:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Compare) and ast.unparse(n) == src for n in ast.walk(tree)):
            found.add((rel, src))
    assert found == NOT_REUSE


def test_an_array_stored_under_no_fingerprint_is_not_resumed(tmp_path):
    # "" names no work: a second writer that names none either must not resume the first's
    store = str(tmp_path / "s")
    a = open_tiled_array(store, "x", (8, 2), 4, np.float64, "")
    a.write_tile(0, 0, np.ones((4, 2)))
    with pytest.raises(StoreMismatchError):
        open_tiled_array(store, "x", (8, 2), 4, np.float64, "")


def test_a_tile_marked_under_no_fingerprint_is_not_done(tmp_path):
    m = TileMarkers(str(tmp_path / "s"), "x", "")
    m.mark((0, 0))
    assert not m.is_done((0, 0))
    named = TileMarkers(str(tmp_path / "t"), "x", "3f2a")
    named.mark((0, 0))
    assert named.is_done((0, 0))
    assert not TileMarkers(str(tmp_path / "t"), "x", "3f2b").is_done((0, 0))
