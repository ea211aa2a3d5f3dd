"""Every attempt's agent of ``ecrl run`` is a fork of the supervisor (``ecrl.runtime.trainer.agent.
start_agent``): a restart starts no interpreter and imports nothing again, a warm standby's agent
included, and the run is the same exactly-once run.

Each interpreter that starts during the run notes its pid and command line (a ``sitecustomize``
on ``PYTHONPATH``, which ``site`` imports at every start-up); of the agents and ranks, none may
be among them.
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


def test_restarts_and_standbys_start_no_interpreter(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    starts = tmp_path / "starts.txt"
    root = tmp_path / "run"
    proc = ecrl("run", "--out", str(root), "--dataset-size", "256", "--global-batch", "8",
                "--steps", "32", "--ckpt-every", "4", "--world-sizes", "2,1",
                "--fail-at", "8,20", "--warm-standby",
                env={"PYTHONPATH": str(hooks), "ECRL_TEST_STARTS": str(starts)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = json.loads((root / "supervisor.json").read_text())
    assert [a["world_size"] for a in state["attempts"]] == [2, 1, 1]
    assert state["warm_standby"] == {"1": True, "2": True}
    # The overlapped strategy's checkpoint writer is an interpreter of its own, by design (it
    # outlives a crashed rank to finish the write): one per attempt, started by rank 0.
    started = [line for line in starts.read_text().splitlines()
               if "-m ecrl.runtime.checkpoint.bgwriter " not in line]
    assert len(started) == 1 and "-m ecrl.apps.cli run " in started[0], started
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format",
                              "json"], capture_output=True, text=True, timeout=300)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert json.loads(verdict.stdout)["verdict"] == "PASS"
