"""Sphinx configuration of the krr-pipeline API reference.

Build it from the repository root with::

    python -m sphinx -W --keep-going -b html docs/api docs/_build/html

``tests/docs/test_docs_build.py`` runs the same build (warnings are errors), so a
docstring that Sphinx or numpydoc cannot read fails the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive

# the repository's own package first, whatever copy is installed
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # _krr_parser

import pipeline  # noqa: E402

project = "krr-pipeline"
author = "the krr-pipeline authors"
copyright = "the krr-pipeline authors"  # noqa: A001
version = release = pipeline.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "sphinxarg.ext",
]

# one page per topic, every object documented once, no generated stub files in the sources
autosummary_generate = False
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"show-inheritance": True}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

smartquotes = False  # keep "--force-new" as typed
html_theme = "alabaster"
html_title = f"krr-pipeline {release}"
html_static_path: list[str] = []
exclude_patterns = ["_build"]
templates_path: list[str] = []


class ExitCodes(Directive):
    """``.. krr-exit-codes::``: the table of ``pipeline.cli.errors.EXIT_CODES``."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from pipeline.cli.errors import EXIT_CODES

        table = nodes.table()
        group = nodes.tgroup(cols=2)
        table += group
        group += nodes.colspec(colwidth=1)
        group += nodes.colspec(colwidth=8)
        head = nodes.thead()
        group += head
        body = nodes.tbody()
        group += body

        def row(*cells: str) -> nodes.row:
            r = nodes.row()
            for text in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text=text)
                r += entry
            return r

        head += row("code", "meaning")
        for code, meaning in EXIT_CODES.items():
            body += row(str(code), meaning)
        return [table]


def setup(app):  # noqa: ANN001, ANN201
    app.add_directive("krr-exit-codes", ExitCodes)
    return {"parallel_read_safe": True}
