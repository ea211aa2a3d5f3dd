"""Hypothesis suites: every generated correct run passes; every mutation gets its verdict.

The ``ci`` profile keeps these to a few dozen examples; ``make test-long`` (profile ``long``)
runs thousands.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from verifier_helpers import RICH, run_specs

from verifier import render_text, verify_run
from verifier._mutations import CATALOGUE, apply, judge
from verifier._testing.generate import RunSpec, committed_steps, generate_run

# Each example is cheap (a few small files): at least 240 of them even in the ci profile.
MANY = settings(max_examples=max(240, settings.default.max_examples))


@MANY
@given(run_specs())
def test_every_generated_run_gets_its_verdict(spec: RunSpec) -> None:
    """A finished run passes; an unfinished one is UNKNOWN with one reason (or PASS when its
    last durable checkpoint already commits every target step), never FAIL."""
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run")
        result = verify_run(run.root)
        text = render_text(result)
        note(text)
        end = spec.target_steps
        if not spec.finished:
            end = 0 if run.durable_step is None else min(end, run.durable_step + 1)
        assert result.verdict == ("PASS" if end == spec.target_steps else "UNKNOWN"), text
        assert not result.anomaly_counts, text
        if result.verdict == "UNKNOWN":
            assert result.unfinished is not None
            assert result.unknown == (result.unfinished.message,), text
            assert result.unfinished.message.startswith(
                f"run not finished (status {spec.end!r}"), text
        assert (result.unfinished is None) == spec.finished
        assert result.checked["committed_steps"] == end
        assert result.metrics.committed_steps == committed_steps(run.attempts) == end
        assert result.metrics.restarts == len(spec.fail_at)
        assert result.metrics.replayed_steps == run.replayed_steps
        assert result.metrics.tentative_steps == run.tentative_steps
        assert result.checked["committed_records"] == run.committed_records
        assert result.checked["records"] == run.records
        assert result.checked["fast_path_records"] == run.records


@MANY
@given(run_specs(), st.sampled_from(CATALOGUE), st.integers(0, 2**32))
def test_every_mutation_gets_its_verdict(spec: RunSpec, mutation: object, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run")
        outcome = apply(mutation, run.root, Path(tmp) / "mutant",  # type: ignore[arg-type]
                        random.Random(seed))
        if outcome is None:
            return  # does not apply to this run (e.g. nothing replayed)
        result = verify_run(Path(tmp) / "mutant")
        note(f"{outcome}\n{render_text(result)}")
        assert judge(outcome, result.verdict, list(result.anomaly_counts)), (
            f"{outcome}\n{render_text(result)}")


@pytest.fixture(scope="module")
def rich_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("rich")
    return [generate_run(spec, base / f"run{i}").root for i, spec in enumerate(RICH)]


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda m: m.name)
def test_each_mutation_on_rich_runs(mutation: object, rich_runs: list[Path],
                                    tmp_path: Path) -> None:
    applied = 0
    for i, root in enumerate(rich_runs):
        finished = RICH[i].finished
        for seed in range(3):
            target = tmp_path / f"m{i}-{seed}"
            outcome = apply(mutation, root, target, random.Random(seed))  # type: ignore[arg-type]
            if outcome is None:
                shutil.rmtree(target, ignore_errors=True)
                continue
            applied += 1
            result = verify_run(target)
            assert judge(outcome, result.verdict, list(result.anomaly_counts)), (
                f"{outcome}\n{render_text(result)}")
            if not mutation.harmful:  # type: ignore[attr-defined]
                assert result.verdict == ("PASS" if finished else "UNKNOWN")
                continue
            assert result.verdict != "PASS"
            if result.unfinished is not None and result.verdict == "UNKNOWN":
                # Unknown for another reason than the run being unfinished.
                assert result.unknown != (result.unfinished.message,)
    assert applied, "the mutation applied to none of the rich runs: the test would be vacuous"
