"""The documentation and the code speak of the repository only.

No absolute path of a developer's machine (``/work/...``, ``/home/...``, ``/Users/...``;
in the documentation also ``/tmp/...``), and no citation of a document the repository does
not contain: every ``*.md`` file the docs, the code, the configs or the workflows name
exists in the repository (measured machine facts live in ``docs/PERFORMANCE.md``), and
every section cited as ``NAME.md#anchor`` is a heading of that document.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = {".md", ".rst", ".py", ".txt", ".yaml", ".yml", ".sh", ".toml", ".cfg", ".ipynb"}
SKIP_DIRS = {".venv", ".git", "_build", "__pycache__", ".pytest_cache", ".ruff_cache", "runs"}
# built from pieces, so that this file does not match itself
MACHINE = re.compile("/" + "(?:work|home|Users|root)" + r"/[\w.-]")
TMP = re.compile("/" + r"tmp/[\w.-]")
DOC_NAME = re.compile(r"[\w./-]*\b[\w-]+\.md\b")
#: a citation of a section: ``PERFORMANCE.md#known-traps``
DOC_ANCHOR = re.compile(r"\b([\w-]+\.md)#([\w-]+)")
HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.M)
OUTSIDE_NOTES = "NOTES" + ".md"


def _files(*parts: str, suffixes: set[str] = TEXT) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        p = ROOT / part
        if p.is_file():
            out.append(p)
            continue
        for f in sorted(p.rglob("*")):
            rel = f.relative_to(ROOT).parts
            if f.is_file() and f.suffix in suffixes and not SKIP_DIRS.intersection(rel):
                out.append(f)
    return out


def _hits(files: list[Path], pattern: re.Pattern[str]) -> list[str]:
    found = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    return found


def test_no_machine_paths_in_docs_and_code():
    docs = _files("docs", "README.md")
    code = _files("pipeline", "conf", suffixes=TEXT - {".ipynb"})
    assert docs and code
    hits = _hits(docs + code, MACHINE) + _hits(docs, TMP)
    assert not hits, "machine paths in the repository's docs or code:\n" + "\n".join(hits)


def test_no_citation_of_notes_outside_the_repository():
    files = _files("docs", "README.md", "pipeline", "conf", "workflows", "tests", ".ci")
    hits = _hits(files, re.compile(re.escape(OUTSIDE_NOTES)))
    assert not hits, (
        f"{OUTSIDE_NOTES} is not in the repository; cite docs/PERFORMANCE.md or state the "
        "measured fact inline:\n" + "\n".join(hits)
    )


def test_every_cited_document_exists():
    missing = []
    for f in _files(
        "docs", "README.md", "pipeline", "conf", "workflows", suffixes=TEXT - {".ipynb"}
    ):
        text = f.read_text(encoding="utf-8", errors="replace")
        for name in set(DOC_NAME.findall(text)):
            candidates = [ROOT / name, f.parent / name, ROOT / "docs" / name]
            if "//" in name or any(c.is_file() for c in candidates):
                continue
            missing.append(f"{f.relative_to(ROOT)} cites {name}")
    assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped (letters of
    any script kept), spaces turned into hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_slug_is_githubs():
    assert _slug("Known traps") == "known-traps"
    assert _slug("The engine's float64 `exp`") == "the-engines-float64-exp"
    assert _slug("Hard solves: small λ by CG") == "hard-solves-small-λ-by-cg"
    assert _slug("N = 80,000: a Gram (item 4)") == "n--80000-a-gram-item-4"


def test_every_cited_section_exists():
    docs = {p.name: p for p in (ROOT / "docs").glob("*.md")} | {"README.md": ROOT / "README.md"}
    anchors = {name: {_slug(h) for h in HEADING.findall(p.read_text())} for name, p in docs.items()}
    missing, cited = [], 0
    for f in _files(
        "docs", "README.md", "pipeline", "conf", "workflows", "tests", suffixes=TEXT - {".ipynb"}
    ):
        for name, anchor in DOC_ANCHOR.findall(f.read_text(encoding="utf-8", errors="replace")):
            if name in anchors:
                cited += 1
                if anchor not in anchors[name]:
                    missing.append(f"{f.relative_to(ROOT)} cites {name}#{anchor}")
    assert cited > 50, cited  # the code cites PERFORMANCE.md's sections throughout
    assert not missing, "sections cited but not headings of their document:\n" + "\n".join(missing)
