"""Transformed programs survive SIGKILL anywhere and finish with the uninterrupted result.

Real processes and real SIGKILL: the fixtures' training scripts and hypothesis-generated programs
run under the kill-and-resume harness (random moments) and under kills the runtime injects at
chosen saves, including inside the atomic write. A control shows the harness fails a program
whose progress does not survive restarts.
"""

from __future__ import annotations

import functools
import json
import os
import random
import tempfile
from pathlib import Path

import forkserver
import killresume as kr
import pytest
from genprograms import programs
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sessionshare import made_once, session_dir

from transform.analysis import AnalysisSuccess, analyze
from transform.codegen import generate
from transform.plan import ScheduleParams

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"
LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"


def _case(name: str) -> dict[str, object]:
    path = CORPUS / name / "case.json"
    return json.loads(path.read_text()) if path.exists() else {}


RUNNABLE = sorted(p.name for p in CORPUS.iterdir() if _case(p.name).get("run"))


def transform_file(src: Path, out: Path, *args: str) -> None:
    from transform.cli import main

    assert main([str(src), "-o", str(out), *args]) == 0


def _write_original(name: str, directory: Path) -> Path:
    directory.mkdir(parents=True)
    original = directory / "original.py"
    original.write_text((CORPUS / name / "input.py").read_text())
    return original


def _reference(name: str, directory: Path) -> kr.Reference:
    original = _write_original(name, directory)
    return kr.run_original(original, cwd=directory, env=kr.environment(directory / "unused"))


class Prepared:
    """A fixture's program transformed in a directory of this worker's own (the programs write
    into their working directory); its reference run is made once for the session."""

    def __init__(self, name: str, root: Path, shared: Path) -> None:
        self.dir = root / name
        self.original = _write_original(name, self.dir)
        self.program = self.dir / "train.py"
        transform_file(self.original, self.program, *_case(name).get("transform_args", []))
        self.reference = made_once(shared, name, functools.partial(_reference, name))

    def env(self, ckpt: Path) -> dict[str, str]:
        """Each test its own resume-state directory."""
        return kr.environment(ckpt)


class _Cache(dict[str, Prepared]):
    """Each fixture transformed and run once per worker, when a test first asks for it."""

    def __init__(self, root: Path, shared: Path) -> None:
        super().__init__()
        self.root = root
        self.shared = shared

    def __missing__(self, name: str) -> Prepared:
        self[name] = Prepared(name, self.root, self.shared)
        return self[name]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Prepared]:
    return _Cache(tmp_path_factory.mktemp("fixtures"),
                  session_dir(tmp_path_factory, "transform-references"))


def test_runnable_fixtures_are_there() -> None:
    assert {"numpy-sgd", "torch-train", "closures-with-try", "while-true-break"} <= set(RUNNABLE)


def _uses_torch(name: str) -> bool:
    return forkserver.imports_torch(CORPUS / name / "input.py")


@pytest.mark.parametrize("name", RUNNABLE)
def test_fixture_survives_random_sigkills(prepared: dict[str, Prepared], name: str,
                                          tmp_path: Path) -> None:
    p = prepared[name]
    # A torch program's attempt costs seconds of start-up: one random kill, then attempts that
    # are only killed if they run past the harness's longest time (a program whose progress does
    # not survive restarts still never finishes). The others take random kills throughout.
    outcome = kr.kill_and_resume(p.program, p.reference, cwd=p.dir, env=p.env(tmp_path / "c"),
                                 rng=random.Random(name),
                                 random_kills=1 if _uses_torch(name) else None)
    kr.assert_same_result(p.reference, outcome)
    print(f"{name}: {outcome.attempts} attempts, {outcome.kills} kills, "
          f"original's work {p.reference.work:.2f} s")
    assert outcome.kills >= 1, "no attempt was killed: the test proved nothing"
    assert not (tmp_path / "c").exists(), "the resume state must go on normal completion"


KILL_POINTS = ["1", "2:before-rename", "3:before-fsync", "4"]
# Every point of the atomic write on the programs that start in a fraction of a second; the
# torch programs (seconds to import torch, each attempt a start-up) take a torn write and a kill
# after a whole save: their state's round trip is what they add, the protocol is the same code.
# One chain of attempts does both: torn at save 3 (the attempt after it resumes from save 2),
# then killed after that attempt's second save (save 4 of the run), then run to its end.
TORCH_CHAIN = "3:before-fsync,2"
INJECTED = [(name, point) for name in RUNNABLE if name != "torch-train"
            for point in ([TORCH_CHAIN] if _uses_torch(name) else KILL_POINTS)]


@pytest.mark.parametrize(("name", "kill_at"), INJECTED)
def test_fixture_resumes_from_injected_kills(prepared: dict[str, Prepared], name: str,
                                             kill_at: str, tmp_path: Path) -> None:
    """``kill_at``: the save each attempt is killed at, in turn (a comma between attempts);
    then one attempt runs to its end."""
    p = prepared[name]
    ckpt = tmp_path / "c"
    for point in kill_at.split(","):
        killed = kr.inject(p.program, point, cwd=p.dir, env=p.env(ckpt))
        assert killed.returncode == -9, (point, killed.stderr)
        kr.assert_printed_lines_agree(p.reference, killed.stdout, f"the attempt killed at {point}")
        assert (ckpt / "resume.ckpt").exists()
    done = kr.finish(p.program, cwd=p.dir, env=p.env(ckpt))
    assert done.returncode == 0, done.stderr
    kr.assert_same_result(p.reference, kr.Outcome(stdout=done.stdout, attempts=2, kills=1))
    assert not ckpt.exists()


def test_harness_fails_a_program_that_restarts_from_scratch(
        prepared: dict[str, Prepared], tmp_path: Path) -> None:
    p = prepared["while-true-break"]
    with pytest.raises(kr.AttemptLimit):
        kr.kill_and_resume(p.program, p.reference, cwd=p.dir, env=p.env(tmp_path / "c"),
                           rng=random.Random(1), max_attempts=4, from_scratch=True)


def test_what_a_killed_attempt_printed_is_judged() -> None:
    reference = kr.Reference(stdout="step 1\nstep 2\nstep 3\nresult 6\n", work=1.0)
    kr.assert_printed_lines_agree(reference, "step 2\nstep 3\nres", "resumed at 2, cut")
    kr.assert_printed_lines_agree(reference, "ste", "cut in its first line")
    for wrong in ("step 2\nstep 2\n", "step 1\nstep 3\n", "step 4\n"):
        with pytest.raises(AssertionError, match="never printed in that order"):
            kr.assert_printed_lines_agree(reference, wrong, "a wrong resume")


def test_only_rank_zero_writes(prepared: dict[str, Prepared], tmp_path: Path) -> None:
    p = prepared["while-true-break"]
    ckpt = tmp_path / "c"
    killed = kr.inject(p.program, "3", cwd=p.dir, env={**p.env(ckpt), "RANK": "1"})
    assert killed.returncode == -9
    assert not (ckpt / "resume.ckpt").exists()
    killed = kr.inject(p.program, "3", cwd=p.dir, env={**p.env(ckpt), "RANK": "0"})
    assert (ckpt / "resume.ckpt").exists()


# ---------------------------------------------------------------- generated programs


def _write_generated(source: str, root: Path) -> tuple[Path, Path]:
    original = root / "original.py"
    original.write_text(source)
    first = analyze(source, str(original))
    assert isinstance(first, AnalysisSuccess), first
    total = sum(s.total_time for s in first.schedules)
    # About fifteen checkpoints per run, whatever the program's modelled length.
    params = ScheduleParams(overhead=0.1, ckpt_cost=0.1 * total / 15, mtbf=max(total, 1.0))
    result = analyze(source, str(original), params)
    assert isinstance(result, AnalysisSuccess)
    program = root / "train.py"
    program.write_text(generate(result).code)
    return original, program


EXAMPLES = settings(max_examples=60 if LONG else 6, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@EXAMPLES
@given(programs(), st.integers(0, 2**16))
def test_generated_programs_survive_random_sigkills(source: str, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        original, program = _write_generated(source, root)
        env = kr.environment(root / "ckpt")
        reference = kr.run_original(original, cwd=root, env=env)
        outcome = kr.kill_and_resume(program, reference, cwd=root, env=env,
                                     rng=random.Random(seed))
        kr.assert_same_result(reference, outcome)
        assert outcome.kills >= 1


INJECTIONS = settings(max_examples=100 if LONG else 12, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@INJECTIONS
@given(programs(), st.integers(1, 6),
       st.sampled_from(["after", "before-write", "before-fsync", "before-rename",
                        "before-dir-fsync"]))
def test_generated_programs_resume_from_any_save(source: str, save: int, point: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        original, program = _write_generated(source, root)
        env = kr.environment(root / "ckpt")
        reference = kr.run_original(original, cwd=root, env=env)
        killed = kr.inject(program, f"{save}:{point}", cwd=root, env=env)
        assert killed.returncode in (0, -9), killed.stderr
        # A program with fewer saves ran to its end: a trial without a kill proves nothing.
        assume(killed.returncode == -9)
        kr.assert_printed_lines_agree(reference, killed.stdout, "the killed attempt")
        done = kr.finish(program, cwd=root, env=env)
        assert done.returncode == 0, done.stderr
        kr.assert_same_result(reference, kr.Outcome(stdout=done.stdout, attempts=2, kills=1))


@pytest.mark.gpu
def test_cuda_random_state_survives(tmp_path: Path) -> None:
    source = (CORPUS / "torch-train" / "input.py").read_text()
    # The model, its batches and so its dropout on the device; the parameters back to the host
    # for the printed digest.
    for host, device in (("model = make_model()", "model = make_model().cuda()"),
                         ("loss = nn.functional.mse_loss(model(x), y)",
                          "loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())"),
                         ("p.detach().numpy()", "p.detach().cpu().numpy()")):
        assert source.count(host) == 1, host
        source = source.replace(host, device)
    original = tmp_path / "original.py"
    original.write_text(source)
    program = tmp_path / "train.py"
    transform_file(original, program, "--all-hints")
    env = kr.environment(tmp_path / "c")
    reference = kr.run_original(original, cwd=tmp_path, env=env)
    killed = kr.inject(program, "40", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    kr.assert_same_result(reference, kr.Outcome(stdout=done.stdout, attempts=2, kills=1))
