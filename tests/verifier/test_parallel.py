"""``--jobs N``: rank logs scanned in worker processes give the very report of one process.

One pool serves the whole module (what ``verify(jobs=2)`` opens per call), so that the
hypothesis examples pay for no process start-up; the CLI test runs the flag itself.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from verifier_helpers import RICH, run_specs

from verifier import render_json, render_junit, render_text, verify
from verifier._mutations import CATALOGUE, apply
from verifier._parallel import Submit
from verifier._testing.generate import RunSpec, generate_run
from verifier.check import workers

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
FEW = settings(max_examples=min(25, settings.default.max_examples))


@pytest.fixture(scope="module")
def submit() -> Iterator[Submit]:
    with workers(2) as submit:
        yield submit


def assert_same(run: Path, submit: Submit) -> str:
    """The JSON, JUnit and text reports of ``run`` scanned in process and by the pool."""
    alone, pooled = verify(run), verify(run, submit=submit)
    assert render_json(pooled) == render_json(alone)
    assert render_junit(pooled) == render_junit(alone)
    assert render_text(pooled) == render_text(alone)
    return render_text(alone)


@pytest.mark.parametrize("case", sorted(p.name for p in FIXTURES.iterdir()))
def test_every_fixture_run_gets_the_same_report(case: str, submit: Submit) -> None:
    assert_same(FIXTURES / case, submit)


# Runs on which every mutation of the catalogue applies (verifier_helpers.RICH).


@pytest.fixture(scope="module")
def rich_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("rich")
    return [generate_run(spec, base / f"run{i}").root for i, spec in enumerate(RICH)]


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda m: m.name)
def test_every_mutation_gets_the_same_report(mutation: object, rich_runs: list[Path],
                                             submit: Submit, tmp_path: Path) -> None:
    applied = 0
    for i, root in enumerate(rich_runs):
        target = tmp_path / f"m{i}"
        if apply(mutation, root, target, random.Random(i)) is None:  # type: ignore[arg-type]
            continue
        applied += 1
        assert_same(target, submit)
    assert applied, "the mutation applied to none of the runs: the test would be vacuous"


@FEW
@given(run_specs(), st.sampled_from(CATALOGUE), st.integers(0, 2**32), st.booleans())
def test_generated_and_mutated_runs_get_the_same_report(
        submit: Submit, spec: RunSpec, mutation: object, seed: int, mutate: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run").root
        if mutate and apply(mutation, run, Path(tmp) / "mutant",  # type: ignore[arg-type]
                            random.Random(seed)) is not None:
            run = Path(tmp) / "mutant"
        note(assert_same(run, submit))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verifier.cli", *args], capture_output=True,
                          text=True)


def test_jobs_flag(rich_runs: list[Path], tmp_path: Path) -> None:
    apply("repeat_record", rich_runs[0], tmp_path / "bad", random.Random(0))
    one = cli(str(tmp_path / "bad"), "--format", "json", "--jobs", "1")
    two = cli(str(tmp_path / "bad"), "--format", "json", "--jobs", "2")
    assert one.returncode == two.returncode == 1, one.stderr + two.stderr
    assert '"verdict": "FAIL"' in one.stdout
    assert two.stdout == one.stdout
    bad = cli(str(tmp_path / "bad"), "--jobs", "0")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "ecrl-verify: error: --jobs 0: give at least 1 (the number of worker processes)"]
