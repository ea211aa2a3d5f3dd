"""Framework scripts (docs/examples/*_train.py) run for real by the framework tests: each under
the launcher of its choice with a clean environment, or under ``ecrl launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from conftest import RUN_TIMEOUT_S

from verifier import render_text, verify_run

ROOT = Path(__file__).resolve().parents[2]


def framework_env(framework_prefix: str, **extra: str) -> dict[str, str]:
    """This environment without ECRL's or the framework's own variables (a test's launcher may
    have set them), one thread per rank, the project importable, warnings quiet."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ECRL_", framework_prefix))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", **extra)
    return env


def run_script(command: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, env=env,
                          timeout=RUN_TIMEOUT_S)


def assert_launch_ended(done: subprocess.CompletedProcess[str], *, killed: bool = False) -> None:
    """A torchrun-based launch completed, or (``killed``) ended by the script's own kill of a
    rank (``os._exit(137)``, which torchrun reports as its own exit 1 with the rank's exit code):
    never a launch that failed for another reason (a start-up error is not the kill a test
    asked for)."""
    assert (done.returncode != 0) == killed, done.stderr[-3000:]
    if killed:
        assert "exitcode  : 137" in done.stderr, done.stderr[-3000:]


def ecrl_launch(out: Path, launch_args: Sequence[str], script: Path, script_args: Sequence[str],
                env: dict[str, str]) -> tuple[Path, str]:
    """``ecrl launch --out OUT LAUNCH_ARGS -- python SCRIPT SCRIPT_ARGS``, which must complete:
    the run directory and what the launch printed."""
    done = run_script([sys.executable, "-m", "ecrl.apps.cli", "launch", "--out", str(out),
                       *launch_args, "--", "python", str(script), *script_args], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


def assert_resumed_by_the_framework(run: Path, printed: str, framework: str, *, steps: int,
                                    attempts: Sequence[tuple[int, int | None]],
                                    failures: Sequence[int]) -> None:
    """An exact-mode run under ``ecrl launch``: PASS with every window of ``steps`` committed
    steps checked; each resume the framework's own, taken by the supervisor from the attempt's
    record (``supervisor.json``'s attempts are ``attempts``: world size, step resumed from);
    the planned ``failures`` injected, one restart each."""
    assert f"resumed by the script from {framework}'s own checkpoint" in printed, printed
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == steps
    assert result.metrics.restarts == len(failures)
    state = json.loads((run / "supervisor.json").read_text())
    assert [(a["world_size"], a["resumed_from_step"]) for a in state["attempts"]] == \
        list(attempts)
    assert [f["global_step"] for f in state["injected_failures"]] == list(failures)
    assert {p["reason"] for p in state["resume_points"].values()} == {"framework"}
