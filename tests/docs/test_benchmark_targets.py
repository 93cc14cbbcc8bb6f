"""The benchmarks' targets decide their exit code (issue #43).

``workflows/benchmarks/targets.py`` checks each measured figure against its stated
bound, prints one ``TARGET`` line per target and gives the exit code: 1 when any
target was missed. These tests check that module, and that every benchmark which
checks targets exits with the code it returns and prints no verdict of its own.
"""

from __future__ import annotations

import math
import re

import pytest
from _workflows import BENCH, load_workflow

T = load_workflow("benchmarks/targets.py")


@pytest.mark.parametrize(
    ("value", "op", "bound", "met"),
    [
        (3.0, "<=", 5.0, True),
        (5.0, "<=", 5.0, True),
        (5.5, "<=", 5.0, False),
        (0.95, ">=", 0.9, True),
        (0.9, ">=", 0.9, True),
        (0.85, ">=", 0.9, False),
        (1.99, "<", 2.0, True),
        (2.0, "<", 2.0, False),
        (math.nan, "<=", 5.0, False),
        (math.nan, ">=", 0.9, False),
    ],
)
def test_check_met_and_not_met(value, op, bound, met, capsys):
    t = T.Targets()
    assert t.check("figure", value, op, bound) is met
    out = capsys.readouterr().out
    assert out.rstrip().endswith(": met" if met else ": NOT met")
    assert len(t.checked) == 1 and t.checked[0].met is met
    assert t.exit_code() == (0 if met else 1)


def test_line_names_the_figure_its_value_and_bound(capsys):
    t = T.Targets()
    t.check("search / fit with the defaults", 23.5, "<=", 5, "x")
    line = capsys.readouterr().out.strip()
    assert line.startswith("TARGET  search / fit with the defaults:")
    assert "23.5x" in line
    assert "(target <= 5x)" in line
    assert line.endswith("NOT met")


def test_lines_align_their_values(capsys):
    t = T.Targets()
    t.check("a", 1.0, "<=", 2, " s")
    t.check("a longer name", 3.0, ">=", 2, " s")
    first, second = capsys.readouterr().out.splitlines()
    assert first.index("1 s") == second.index("3 s")


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="op must be"):
        T.Targets().check("figure", 1.0, "==", 1.0)


def test_exit_code_is_1_on_any_miss(capsys):
    t = T.Targets()
    t.check("one", 1.0, "<=", 2.0)
    t.check("two", 3.0, ">=", 2.0)
    assert t.exit_code() == 0
    t.check("three", 3.0, "<=", 2.0)
    t.check("four", 1.0, "<=", 2.0)
    assert t.exit_code() == 1
    assert [c.name for c in t.missed] == ["three"]
    assert t.finish() == 1
    assert capsys.readouterr().out.splitlines()[-1] == "targets: 3 met, 1 NOT met"


def test_no_targets_exit_0(capsys):
    t = T.Targets()
    assert t.exit_code() == 0
    assert t.finish() == 0
    assert capsys.readouterr().out.strip() == "targets: 0 met, 0 NOT met"


def test_skipped_targets_are_said_and_not_counted(capsys):
    t = T.Targets()
    t.skip("seconds", "at N = 40,000 only")
    t.check("residual", 1e-12, "<=", 1e-11)
    assert t.finish() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("TARGET  seconds:")
    assert out[0].endswith("not checked (at N = 40,000 only)")
    assert out[-1] == "targets: 1 met, 0 NOT met, 1 not checked"


def test_as_json_records_each_check(capsys):
    t = T.Targets()
    t.check("peak RSS", 2.5, "<=", 2, " GB")
    assert t.as_json() == [
        {"name": "peak RSS", "value": 2.5, "op": "<=", "bound": 2.0, "unit": " GB", "met": False}
    ]


SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name != "targets.py")
VERDICT = re.compile(r"""['"](?:[^'"]*\b)?(?:NOT met|NOT MET|MISSED|targets? met)\b""")
EXITS_WITH_MAIN = re.compile(r"(?:sys\.exit|raise SystemExit)\(main\(")


def test_benchmarks_print_no_verdict_of_their_own():
    hits = [
        f"{p.name}:{n}: {line.strip()}"
        for p in SCRIPTS
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if VERDICT.search(line)
    ]
    assert not hits, "check targets with targets.Targets.check:\n" + "\n".join(hits)


def test_benchmarks_with_targets_exit_with_them():
    using = [p for p in SCRIPTS if "Targets()" in p.read_text(encoding="utf-8")]
    assert len(using) >= 10, [p.name for p in using]
    bad = []
    for p in using:
        src = p.read_text(encoding="utf-8")
        main_block = src.split('if __name__ == "__main__":')[-1]
        if "return targets.finish()" not in src and "code = targets.finish()" not in src:
            bad.append(f"{p.name}: main does not return targets.finish()")
        if not EXITS_WITH_MAIN.search(main_block):
            bad.append(f"{p.name}: the script does not exit with main()'s return value")
    assert not bad, "\n".join(bad)
