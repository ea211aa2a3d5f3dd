"""``ecrl-transform SRC``: choose checkpoints among a program's hints and write the program.

Thin: flags here, work in :mod:`transform.analysis`, words in :mod:`transform.report`. Writing
the program (``-o``, ``--in-place``, ``--diff``, ``--check``, ``--all-hints``) is the code
generator's; until it lands those modes still analyse (so bad input gets its message) and then
say they are not built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ecrl.errors import EcrlError

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
    parser.add_argument("--overhead", type=float, metavar="O",
                        help="allowance o, a fraction of run time (default 0.05)")
    parser.add_argument("--ckpt-cost", type=float, metavar="SECONDS",
                        help="seconds per checkpoint t_c (default 10; a profile gives per-hint "
                        "costs)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--failure-rate", type=float, metavar="P",
                      help="probability of a failure in any one second (CheckHint's p)")
    rate.add_argument("--mtbf", type=float, metavar="SECONDS",
                      help="mean time between failures (default 86400)")
    parser.add_argument("--objective", choices=["budget", "cost"], default="budget",
                        help="budget: at most ceil(o·Σt/t_c) checkpoints (CheckHint); cost: "
                        "minimise recovery + checkpoint time, no budget")
    prof = parser.add_mutually_exclusive_group()
    prof.add_argument("--profile", metavar="FILE", help="use task times and save sizes from a "
                      "profile written by --record-profile")
    prof.add_argument("--record-profile", metavar="FILE", help="run SRC once with timers at its "
                      "hints, write the profile to FILE and use it")
    parser.add_argument("--write-bandwidth", type=float, metavar="BYTES_PER_S",
                        help="turn profiled save sizes into checkpoint seconds (default 2e8)")
    return parser


def _run(args: argparse.Namespace) -> int:
    from transform.analysis import AnalysisFailure, analyze
    from transform.plan import ScheduleParams
    from transform.profile import DEFAULT_BANDWIDTH, load_profile, record_profile
    from transform.report import explain_json, explain_text, render_issue

    path = Path(args.src)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"ecrl-transform: error: cannot read {args.src}: {reason}", file=sys.stderr)
        return EXIT_ERROR
    params = ScheduleParams(overhead=args.overhead, ckpt_cost=args.ckpt_cost,
                            failure_rate=args.failure_rate, mtbf=args.mtbf,
                            objective=args.objective)
    bandwidth = args.write_bandwidth or DEFAULT_BANDWIDTH
    profile = load_profile(args.profile, bandwidth=bandwidth) if args.profile else None
    result = analyze(source, args.src, params, profile=profile)
    if args.record_profile and not isinstance(result, AnalysisFailure):
        spec = {h.id: (h.position.line, result.live[h.id].save) for h in result.hints}
        profile = record_profile(args.src, args.record_profile, hints=spec, bandwidth=bandwidth)
        result = analyze(source, args.src, params, profile=profile)
    if isinstance(result, AnalysisFailure):
        print(render_issue(result.issue, source), file=sys.stderr)
        return EXIT_ERROR
    for warning in result.warnings:
        print(f"warning: {warning.render()}", file=sys.stderr)
    if args.explain:
        print(explain_json(result) if args.format == "json" else explain_text(result))
        return EXIT_OK
    if not result.hints:
        print(f"ecrl-transform: {args.src} has no _checkpoint() hints", file=sys.stderr)
    print("ecrl-transform: writing the transformed program is not built yet (issue #6, "
          "transform-codegen); --explain works", file=sys.stderr)
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except EcrlError as exc:
        print(f"ecrl-transform: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("ecrl-transform: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
