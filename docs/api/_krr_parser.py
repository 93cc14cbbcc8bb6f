"""The ``krr`` parser as the CLI page shows it: without the plain-text exit-code epilogs.

The epilogs are laid out for a terminal; the page renders the same codes as a table from
``pipeline.cli.errors.EXIT_CODES`` (the ``krr-exit-codes`` directive in ``conf.py``).
"""

from __future__ import annotations

import argparse


def parser() -> argparse.ArgumentParser:
    """Return ``pipeline.cli.build_parser()`` with every epilog removed."""
    from pipeline.cli import build_parser

    p = build_parser()
    p.epilog = None
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.epilog = None
    return p
