"""The kill-and-resume harness: real processes, real SIGKILL, restarts until the program exits 0.

Every run goes through :class:`transform._testing.drive.DrivenRun`: the kill clock starts when the
program's imports are done, so kills land in the program itself (reading the resume state, the
walk back, the work), not in interpreter start-up.

``run_original`` runs the untransformed program once: its output is the reference, its time from
``ready`` to exit the yardstick. ``kill_and_resume`` runs the transformed program and SIGKILLs
every attempt after a random fraction (below one) of that yardstick, so an attempt that starts
from scratch never has the time to finish: a program whose progress does not survive restarts
runs out of attempts (:class:`AttemptLimit`) — the harness can fail. What a killed attempt
printed before its kill is judged too (:func:`assert_printed_lines_agree`).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import forkserver

from transform._testing.drive import DrivenRun

SRC_ROOT = Path(__file__).resolve().parents[2]


class AttemptLimit(AssertionError):
    """The program never finished: every attempt was killed before it could."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Reference:
    stdout: str
    work: float
    """Seconds from ``ready`` to exit: the program's own work."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    stdout: str
    """Output of the attempt that finished."""
    attempts: int
    kills: int


def environment(ckpt_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ECRL_CKPT_DIR"] = str(ckpt_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC_ROOT), env.get("PYTHONPATH")]))
    env.pop("ECRL_TRANSFORM_KILL_AT", None)
    return env


def run_original(program: Path, *, cwd: Path, env: dict[str, str],
                 timeout: float = 120.0) -> Reference:
    run = DrivenRun(program, cwd, env, popen=forkserver.popen)
    run.wait_ready(timeout)
    out, _, work = run.finish(timeout)
    assert run.proc.returncode == 0, run.stderr
    return Reference(stdout=out, work=work)


def kill_and_resume(program: Path, reference: Reference, *, cwd: Path, env: dict[str, str],
                    rng: random.Random, max_attempts: int = 25,
                    fractions: tuple[float, float] = (0.25, 0.7),
                    from_scratch: bool = False, random_kills: int | None = None,
                    timeout: float = 120.0) -> Outcome:
    """Run ``program`` under SIGKILL at random moments until one attempt exits 0.

    ``from_scratch`` deletes the resume state before every attempt: the control that proves a
    program without surviving progress cannot pass.

    ``random_kills``: after that many kills, each further attempt gets the longest time of
    ``fractions`` instead of a random one. It is still killed at its end: a program whose
    progress does not survive restarts runs out of attempts as before, while one that resumes
    finishes in an attempt or two fewer (each a process start, seconds for torch).
    """
    kills = 0
    work = reference.work
    for attempt in range(1, max_attempts + 1):
        if from_scratch:
            shutil.rmtree(env["ECRL_CKPT_DIR"], ignore_errors=True)
        run = DrivenRun(program, cwd, env, popen=forkserver.popen)
        run.wait_ready(timeout)
        capped = random_kills is not None and kills >= random_kills
        fraction = fractions[1] if capped else rng.uniform(*fractions)
        out, killed, elapsed = run.finish(fraction * work)
        if killed:
            kills += 1
            assert_printed_lines_agree(reference, out, f"attempt {attempt} (killed)")
            continue
        if run.proc.returncode != 0:
            raise AssertionError(f"attempt {attempt} exited {run.proc.returncode}:\n{run.stderr}")
        if kills == 0:
            # Finished before its first kill: the reference's time was measured under more load
            # than this attempt ran under, and a trial without a kill proves nothing. The run
            # removed its state on completion, so the next attempt starts afresh, timed by this
            # one's work.
            assert_same_result(reference, Outcome(stdout=out, attempts=attempt, kills=0))
            work = min(work, elapsed)
            continue
        return Outcome(stdout=out, attempts=attempt, kills=kills)
    raise AttemptLimit(f"{program.name} did not finish in {max_attempts} attempts "
                       f"(each killed after {fractions[0]:.0%}–{fractions[1]:.0%} of the "
                       "original's work)")


def assert_same_result(reference: Reference, outcome: Outcome) -> None:
    """The finishing attempt printed exactly what the original printed after the resume point:
    a suffix of the original output, with the final result line."""
    assert outcome.stdout.strip(), "the finishing attempt printed nothing"
    assert reference.stdout.endswith(outcome.stdout), (
        f"resumed output differs:\n--- original\n{reference.stdout[-2000:]}"
        f"\n--- resumed\n{outcome.stdout[-2000:]}")
    assert outcome.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]


def assert_printed_lines_agree(reference: Reference, printed: str, who: str) -> None:
    """What a killed attempt printed before its kill (its whole lines: the last may be cut) is
    a run of consecutive lines of the original's output: a resume that went wrong is caught even
    when a kill ends it before the result line."""
    lines = printed.split("\n")[:-1]
    if not lines:
        return
    original = reference.stdout.split("\n")
    n = len(lines)
    if not any(original[i:i + n] == lines for i in range(len(original) - n + 1)):
        raise AssertionError(f"{who} printed lines the original never printed in that order:\n"
                             f"--- original\n{reference.stdout[-2000:]}\n--- {who}\n"
                             f"{printed[-2000:]}")


def inject(program: Path, kill_at: str, *, cwd: Path, env: dict[str, str],
           timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """One attempt SIGKILLed by the runtime itself at a chosen save (``N`` or ``N:POINT``)."""
    return _run(program, cwd=cwd, env={**env, "ECRL_TRANSFORM_KILL_AT": kill_at,
                                       # what it prints before the kill reaches us, to be judged
                                       "PYTHONUNBUFFERED": "1"}, timeout=timeout)


def finish(program: Path, *, cwd: Path, env: dict[str, str],
           timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return _run(program, cwd=cwd, env=env, timeout=timeout)


def _run(program: Path, *, cwd: Path, env: dict[str, str],
         timeout: float) -> subprocess.CompletedProcess[str]:
    """``python program``; a torch program through :mod:`forkserver` (torch imported once)."""
    if forkserver.imports_torch(program):
        return forkserver.run(program, cwd=cwd, env=env, timeout=timeout)
    return subprocess.run([sys.executable, str(program)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
