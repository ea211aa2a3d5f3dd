"""``ecrl-verify PATH``: verify a run directory, or every run under PATH."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_PASS, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecrl-verify",
        description="Prove exactly-once sample consumption of an ECRL run from its logs. "
        "Exit 0 PASS, 1 FAIL, 2 UNKNOWN (logs cannot support a verdict).",
    )
    parser.add_argument("path", metavar="PATH", help="a run directory or a folder of runs")
    parser.add_argument("--format", choices=["text", "json", "junit"], default="text")
    parser.add_argument("--reference", metavar="RUN", help="reference run for loss divergence")
    parser.add_argument("--report", metavar="DIR", help="write markdown, JSON and PNG plots here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print("ecrl-verify: not built yet (issue #4, verifier)", file=sys.stderr)
    return EXIT_UNKNOWN


if __name__ == "__main__":
    sys.exit(main())
