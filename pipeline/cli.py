"""The ``krr`` command line."""

from __future__ import annotations

import argparse
import sys

from pipeline import __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="krr", description="Exact kernel ridge regression pipeline")
    p.add_argument("--version", action="version", version=f"krr-pipeline {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    del args
    build_parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
