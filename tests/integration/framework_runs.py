"""Framework scripts (docs/examples/*_train.py) run for real by the framework tests: each under
the launcher of its choice with a clean environment, or under ``ecrl launch``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from conftest import RUN_TIMEOUT_S

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


def ecrl_launch(out: Path, launch_args: Sequence[str], script: Path, script_args: Sequence[str],
                env: dict[str, str]) -> tuple[Path, str]:
    """``ecrl launch --out OUT LAUNCH_ARGS -- python SCRIPT SCRIPT_ARGS``, which must complete:
    the run directory and what the launch printed."""
    done = run_script([sys.executable, "-m", "ecrl.apps.cli", "launch", "--out", str(out),
                       *launch_args, "--", "python", str(script), *script_args], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout
