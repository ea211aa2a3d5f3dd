"""``ecrl-transform SRC``: choose checkpoints among a program's hints and write the program.

Thin: flags here, work in :mod:`transform.analysis` and :mod:`transform.codegen`, words in
:mod:`transform.report`. Without a mode the transformed program goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from ecrl.contract.cli import run_main

EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2
"""A reader that closed our output (``ecrl-transform --diff | head``): stop, as SIGPIPE would."""


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
    parser.add_argument("--explain", action="store_true",
                        help="show the schedule and live sets (with -o or --in-place, and write)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if SRC (or OUT, with -o) would change")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--all-hints", action="store_true",
                        help="every hint becomes a checkpoint at every execution (for testing)")
    parser.add_argument("--ckpt-dir", metavar="DIR",
                        help="resume-state directory of the written program (default "
                        ".ecrl-ckpt/<script stem>/; ECRL_CKPT_DIR overrides both at run time)")
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
    from transform.errors import SourceError
    from transform.plan import ScheduleParams
    from transform.profile import DEFAULT_BANDWIDTH, load_profile, record_profile
    from transform.report import explain_json, explain_text, render_issue

    if args.check and (args.in_place or args.diff or args.explain):
        print("ecrl-transform: error: --check goes alone or with -o OUT", file=sys.stderr)
        return EXIT_ERROR
    if args.explain and args.diff:
        print("ecrl-transform: error: --explain and --diff both print to stdout: use one, or "
              "--explain with -o OUT", file=sys.stderr)
        return EXIT_ERROR
    from transform.sourcetext import read_source

    try:
        file = read_source(args.src)
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
            exc.msg if isinstance(exc, SyntaxError) else str(exc))
        print(f"ecrl-transform: error: cannot read {args.src}: {reason}", file=sys.stderr)
        return EXIT_ERROR
    source = file.text
    from transform.codegen import already_transformed

    written = source
    done = already_transformed(source, args.src)
    if done is not None:
        # A program ecrl-transform wrote: work from its original, so running again is
        # idempotent and --check can compare.
        from transform.strip import looks_generated, strip

        source = strip(source)
        if looks_generated(source):
            print(render_issue(done, written), file=sys.stderr)
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
    if not args.explain:  # --explain reports them itself, once
        for warning in result.warnings:
            print(f"warning: {warning.render()}", file=sys.stderr)
    if args.explain:
        print(explain_json(result) if args.format == "json" else explain_text(result))
        if not (args.output or args.in_place):
            return EXIT_OK  # the report alone: the program is not printed after it
    from transform.codegen import generate

    try:
        generated = generate(result, all_hints=args.all_hints, ckpt_dir=args.ckpt_dir)
    except SourceError as exc:
        print(render_issue(exc.issue, source), file=sys.stderr)
        return EXIT_ERROR
    if generated.note:
        print(f"ecrl-transform: {generated.note}", file=sys.stderr)
    return _write(args, written, generated.code, file.encode(generated.code))


def _write_file(target: Path, data: bytes, *, mode_of: Path) -> None:
    """Write atomically, keeping the permissions a user expects: an existing target keeps its
    own, a new one gets the source's (the atomic write's temporary file is owner-only)."""
    from ecrl.contract.atomicio import atomic_write_bytes

    try:
        mode = stat.S_IMODE((target if target.exists() else mode_of).stat().st_mode)
    except OSError:
        mode = None
    atomic_write_bytes(target, data)
    if mode is not None:
        os.chmod(target, mode)


def _write(args: argparse.Namespace, source: str, code: str, data: bytes) -> int:
    """Act on the generated program: ``code`` as text, ``data`` as the file's bytes (the
    source's encoding and line endings)."""
    if args.check:
        target = Path(args.output) if args.output else Path(args.src)
        try:
            current: bytes | None = target.read_bytes()
        except FileNotFoundError:
            current = None
        if current != data:
            print(f"ecrl-transform: {target} would change", file=sys.stderr)
            return EXIT_DIFFERENT
        return EXIT_OK
    if args.diff:
        import difflib

        sys.stdout.writelines(difflib.unified_diff(
            source.splitlines(keepends=True), code.splitlines(keepends=True),
            fromfile=args.src, tofile=f"{args.src} (transformed)"))
        return EXIT_OK
    if args.in_place:
        if code != source:
            _write_file(Path(args.src), data, mode_of=Path(args.src))
        return EXIT_OK
    if args.output:
        _write_file(Path(args.output), data, mode_of=Path(args.src))
        return EXIT_OK
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:  # a text-only stream (an embedding application's): the text, as is
        sys.stdout.write(code)
        return EXIT_OK
    sys.stdout.flush()
    binary.write(data)
    binary.flush()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main("ecrl-transform", lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
