"""``ecrl-verify PATH``: verify a run directory, or every run under PATH (thin entry point)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from ecrl.contract.cli import print_quietly, run_main
from ecrl.contract.extras import require
from verifier._parallel import Submit
from verifier.anomalies import Anomaly
from verifier.errors import VerifierError
from verifier.replay import DEFAULT_TOLERANCE
from verifier.result import RunResult, VerifyResult

EXIT_PASS, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecrl-verify",
        description="Prove exactly-once sample consumption of an ECRL run from its logs. "
        "Exit 0 PASS, 1 FAIL, 2 UNKNOWN (logs cannot support a verdict).",
    )
    parser.add_argument("path", metavar="PATH", help="a run directory or a folder of runs")
    parser.add_argument("--format", choices=["text", "json", "junit"], default="text",
                        help="output on stdout: text for people (default), json, or junit XML")
    parser.add_argument("--reference", metavar="RUN",
                        help="reference run for loss divergence (max/mean |loss difference|)")
    parser.add_argument("--report", metavar="DIR",
                        help="write report.md, report.json and PNG plots here")
    parser.add_argument("--same-order", metavar="RUN2",
                        help="a run that should consume the same global windows (same seed, "
                             "other world sizes or failures): compared step by step, the first "
                             "differing step is the witness")
    parser.add_argument("--replay-tolerance", metavar="REL", type=float,
                        default=DEFAULT_TOLERANCE,
                        help="relative tolerance for replayed losses where bit-identical ones "
                             "are not expected (another world size, or a run that declares "
                             f"deterministic false); default {DEFAULT_TOLERANCE:g}")
    parser.add_argument("--self-test", action="store_true",
                        help="also apply the mutation catalogue to a copy of each passing run "
                             "and say how many harmful mutations the verifier caught (one line "
                             "per run on stderr, and in the report with --report); slow: it "
                             "verifies each of about forty mutants")
    parser.add_argument("--jobs", metavar="N", type=int, default=None,
                        help="worker processes that scan the rank logs side by side (default: "
                             "the machine's cores; 1: all in this process); the verdict and "
                             "every report are the same for every N")
    parser.add_argument("--ray", metavar="ADDRESS", nargs="?", const="local", default=None,
                        help="scan the rank logs as tasks on a Ray cluster: ADDRESS, auto (the "
                             "cluster this machine belongs to), or without one a Ray started "
                             "here with --jobs CPUs; the logs must be on a file system every "
                             "node mounts at the same path; needs pip install 'ecrl[ray]' "
                             "(write PATH first: ecrl-verify RUN --ray)")
    parser.add_argument("--follow", action="store_true",
                        help="PATH is a run that is training: verify it as it writes (each "
                             "anomaly on stderr as soon as it is proved, a progress line per "
                             "change) until its supervisor says it ended, then print the "
                             "verdict; Ctrl-C prints the verdict so far (UNKNOWN unless an "
                             "anomaly was found)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from verifier import render_json, render_junit, render_text, verify, write_report
    from verifier._parallel import default_jobs

    def progress(message: str) -> None:
        print(f"[ecrl-verify] {message}", file=sys.stderr, flush=True)

    def work() -> int:
        if args.follow and (args.reference or args.same_order or args.self_test):
            parser.error("--follow verifies one run as it trains: leave out --reference, "
                         "--same-order and --self-test (run them on the finished run)")
        if args.report:  # its plots: refuse before verifying, not after
            require("matplotlib", what="--report")
        jobs = default_jobs() if args.jobs is None else args.jobs
        if jobs < 1:
            raise VerifierError(f"--jobs {jobs}: give at least 1 (the number of worker "
                                "processes)")
        with contextlib.ExitStack() as stack:
            submit = None
            if args.ray is not None:
                from verifier._ray import ray_workers

                submit = stack.enter_context(ray_workers(args.ray, jobs=jobs))
            if args.follow:
                result = _follow(args.path, jobs=jobs, submit=submit)
            else:
                result = verify(args.path, reference=args.reference, series=bool(args.report),
                                progress=progress if sys.stderr.isatty() else None,
                                same_order=args.same_order,
                                replay_tolerance=args.replay_tolerance, jobs=jobs,
                                submit=submit)
        render = {"text": render_text, "json": render_json, "junit": render_junit}[args.format]
        # A reader that stops early (`ecrl-verify RUN | head`) keeps the verdict's exit code.
        print_quietly(render(result))
        self_tests = None
        if args.self_test:
            from verifier.selftest import self_test_runs, summary_line

            self_tests = self_test_runs(result)
            for path, test in self_tests.items():
                print(f"ecrl-verify: {summary_line(path, test)}", file=sys.stderr)
        if args.report:
            written = write_report(result, args.report, self_tests=self_tests)
            print(f"ecrl-verify: wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
        return result.exit_code

    return run_main("ecrl-verify", work,
                    os_error=lambda exc: f"{exc.filename or args.path}: {exc.strerror}")


def _follow(path: str, *, jobs: int, submit: Submit | None) -> VerifyResult:
    from verifier.follow import FollowState, follow
    from verifier.report import render_anomaly_line, render_progress_line

    def say(line: str) -> None:
        print(f"[ecrl-verify --follow] {line}", file=sys.stderr, flush=True)

    def on_anomaly(run: RunResult, anomaly: Anomaly) -> None:
        say(f"FAIL {render_anomaly_line(run, anomaly)}")

    shown: list[str] = []

    def on_progress(state: FollowState) -> None:
        line = render_progress_line(state.result, status=state.status, anomalies=state.anomalies)
        if shown[-1:] != [line]:  # the torchrun log changes too: say only what is new
            shown.append(line)
            say(line)

    return follow(path, jobs=jobs, on_anomaly=on_anomaly, on_progress=on_progress,
                  submit=submit)


if __name__ == "__main__":
    sys.exit(main())
