"""``ecrl-transform SRC``: choose checkpoints among a program's hints and write the program."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecrl-transform",
        description="Pick the _checkpoint() hints that become checkpoints (exact dynamic "
        "program over expected recovery time), find what to save by liveness analysis, and "
        "write a program that saves it and resumes after a crash.",
    )
    parser.add_argument("src", metavar="SRC", help="Python program with _checkpoint() hints")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", metavar="OUT", help="write the transformed program here")
    out.add_argument("--in-place", action="store_true", help="rewrite SRC")
    out.add_argument("--diff", action="store_true", help="print a unified diff")
    out.add_argument("--check", action="store_true", help="exit 1 if SRC would change")
    out.add_argument("--explain", action="store_true", help="show the schedule and live sets")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--all-hints", action="store_true", help="every hint becomes a checkpoint")
    parser.add_argument("--ckpt-dir", metavar="DIR", help="resume-state directory of the output")
    parser.add_argument("--overhead", type=float, metavar="O", help="allowance, a fraction")
    parser.add_argument("--ckpt-cost", type=float, metavar="SECONDS")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--failure-rate", type=float, metavar="P", help="failures per second")
    rate.add_argument("--mtbf", type=float, metavar="SECONDS")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print("ecrl-transform: not built yet (issues #5 and #6, transform)", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
