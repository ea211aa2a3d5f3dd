"""Every attempt's agent is a fork of the supervisor (``ecrl.runtime.supervision.command.
start_torchrun``): under ``ecrl run`` a restart starts no interpreter and imports nothing again, a
warm standby's agent included; under ``ecrl launch`` only the script's ranks are new interpreters.
The runs stay the same exactly-once runs.

Each interpreter that starts during a run notes its command line (a ``sitecustomize`` on
``PYTHONPATH``, which ``site`` imports at every start-up).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ecrl

pytestmark = pytest.mark.torchrun

SITECUSTOMIZE = """
import os
with open(os.environ["ECRL_TEST_STARTS"], "a") as starts:
    command = open("/proc/self/cmdline", "rb").read().split(b"\\0")
    starts.write(" ".join(part.decode() for part in command if part) + "\\n")
"""


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ddp_train.py"


def _counting_starts(tmp_path: Path, *args: str) -> tuple[Path, list[str]]:
    """``ecrl ARGS --out RUN`` with every interpreter start noted: the run, the starts."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    starts = tmp_path / "starts.txt"
    root = tmp_path / "run"
    proc = ecrl(args[0], "--out", str(root), *args[1:],
                env={"PYTHONPATH": str(hooks), "ECRL_TEST_STARTS": str(starts)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, starts.read_text().splitlines()


def _verifies(root: Path) -> None:
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format",
                              "json"], capture_output=True, text=True, timeout=300)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert json.loads(verdict.stdout)["verdict"] == "PASS"


def test_restarts_and_standbys_of_ecrl_run_start_no_interpreter(tmp_path: Path) -> None:
    root, starts = _counting_starts(
        # Failures well after each attempt's first step: the supervisor starts the standby once
        # it sees that step (it polls every 0.25 s), and an attempt that failed sooner would
        # have none to hand over.
        tmp_path, "run", "--dataset-size", "256", "--global-batch", "8", "--steps", "160",
        "--ckpt-every", "10", "--world-sizes", "2,1", "--fail-at", "60,110", "--warm-standby")
    state = json.loads((root / "supervisor.json").read_text())
    assert [a["world_size"] for a in state["attempts"]] == [2, 1, 1]
    assert state["warm_standby"] == {"1": True, "2": True}
    # The overlapped strategy's checkpoint writer is an interpreter of its own, by design (it
    # outlives a crashed rank to finish the write): one per attempt, started by rank 0.
    started = [line for line in starts if "-m ecrl.runtime.checkpoint.bgwriter " not in line]
    assert len(started) == 1 and "-m ecrl.apps.cli run " in started[0], started
    _verifies(root)


def test_the_agents_of_ecrl_launch_are_forked_and_its_ranks_start_the_script(
        tmp_path: Path) -> None:
    root, starts = _counting_starts(
        tmp_path, "launch", "--strategy", "blocking", "--ckpt-every", "4", "--world-sizes",
        "2,1", "--fail-at", "6", "--", "python", str(EXAMPLE), "--steps", "12", "--workers",
        "0")
    state = json.loads((root / "supervisor.json").read_text())
    assert [a["world_size"] for a in state["attempts"]] == [2, 1]
    assert len(starts) == 1 + 2 + 1, starts  # the supervisor, then each attempt's ranks
    assert "-m ecrl.apps.cli launch " in starts[0]
    assert all(str(EXAMPLE) in line for line in starts[1:]), starts
    _verifies(root)
