"""The mutation self-test: does the verifier catch known ways of breaking *this* run?

``ecrl-verify RUN --self-test`` (only when asked: it verifies about forty mutated copies of each
run) applies every mutation of the catalogue (:mod:`verifier._mutations`) once to a copy of each
passing run and verifies each copy. A harmful mutation is *killed* when the verifier reports one
of the anomaly kinds it requires; a benign one must get the untouched run's verdict, or it is a
false alarm. The result is data (:class:`SelfTest`, or a reason it was not run);
:mod:`verifier.report` states it in the report and the CLI in one line per run.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifier._mutations import CATALOGUE, Mutation, Outcome, apply, judge
from verifier.check import verify_run
from verifier.result import RunResult, Verdict, VerifyResult

__all__ = ["Trial", "SelfTest", "self_test", "self_test_runs", "skip_reason", "summary_line",
           "SELF_TEST_MAX_RECORDS"]

SELF_TEST_MAX_RECORDS = 50_000
"""The self-test runs the catalogue on runs up to this many records (each mutant is verified)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Trial:
    """One mutation applied and judged."""

    outcome: Outcome
    harmful: bool
    verdict: Verdict
    kinds: tuple[str, ...]
    ok: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class SelfTest:
    trials: tuple[Trial, ...]
    skipped: tuple[str, ...]
    """Mutations that did not apply to the run."""

    @property
    def harmful(self) -> int:
        return sum(t.harmful for t in self.trials)

    @property
    def killed(self) -> int:
        return sum(t.harmful and t.ok for t in self.trials)

    @property
    def benign(self) -> int:
        return sum(not t.harmful for t in self.trials)

    @property
    def false_alarms(self) -> int:
        return sum(not t.harmful and not t.ok for t in self.trials)

    @property
    def kill_rate(self) -> float | None:
        return self.killed / self.harmful if self.harmful else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "harmful": self.harmful, "killed": self.killed, "kill_rate": self.kill_rate,
            "benign": self.benign, "false_alarms": self.false_alarms,
            "skipped": list(self.skipped),
            "trials": [{"mutation": t.outcome.mutation, "where": t.outcome.where,
                        "harmful": t.harmful, "expected": t.outcome.verdict,
                        "expected_kinds": sorted(t.outcome.kinds), "verdict": t.verdict,
                        "kinds": list(t.kinds), "ok": t.ok} for t in self.trials],
        }


def self_test(run: str | Path, *, seed: int = 0, workdir: str | Path | None = None,
              mutations: Sequence[Mutation] = CATALOGUE) -> SelfTest:
    """Apply every mutation once to a copy of ``run`` and verify each copy."""
    trials: list[Trial] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ecrl-mutants-", dir=workdir) as tmp:
        for i, m in enumerate(mutations):
            rng = random.Random(seed * 1000 + i)
            target = Path(tmp) / f"{i:02d}-{m.name}"
            outcome = apply(m, run, target, rng)
            if outcome is None:
                skipped.append(m.name)
                shutil.rmtree(target, ignore_errors=True)
                continue
            result = verify_run(target)
            kinds = tuple(result.anomaly_counts)
            trials.append(Trial(outcome=outcome, harmful=m.harmful, verdict=result.verdict,
                                kinds=kinds, ok=judge(outcome, result.verdict, kinds)))
            shutil.rmtree(target, ignore_errors=True)
    return SelfTest(trials=tuple(trials), skipped=tuple(skipped))


def skip_reason(run: RunResult) -> str | None:
    """Why the catalogue is not applied to ``run``, or None when it is."""
    if run.verdict != "PASS":
        return "the run does not pass, so mutants of it prove nothing"
    if not run.windows_checked:
        return ("an external sampler's run is audited without windows, and the catalogue's "
                "mutations are written against ECRL's windows")
    if run.metrics.records > SELF_TEST_MAX_RECORDS:
        return (f"the run has {run.metrics.records:,} records (limit "
                f"{SELF_TEST_MAX_RECORDS:,}); `ecrl bench verify` reports the kill rate on "
                "generated runs")
    return None


def self_test_runs(result: VerifyResult) -> dict[str, dict[str, Any]]:
    """Run path -> its self-test (:meth:`SelfTest.as_dict`) or ``{"skipped_reason": …}``."""
    tests: dict[str, dict[str, Any]] = {}
    for run in result.runs:
        reason = skip_reason(run)
        tests[run.path] = ({"skipped_reason": reason} if reason is not None
                           else self_test(run.path).as_dict())
    return tests


def summary_line(path: str, test: dict[str, Any]) -> str:
    """One line per run for the command line."""
    if "skipped_reason" in test:
        return f"self-test {path}: not run: {test['skipped_reason']}"
    return (f"self-test {path}: caught {test['killed']} of {test['harmful']} harmful mutations, "
            f"passed {test['benign'] - test['false_alarms']} of {test['benign']} benign ones "
            f"({test['false_alarms']} false alarms)")
