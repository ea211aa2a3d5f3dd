"""``--warm-standby`` with real torchrun runs: the same result, the attempts really handed over.

The user's example (docs/examples/ddp_train.py) under ``ecrl launch`` with two failures and world
sizes 2 → 1, once with a warm standby: its committed losses and final parameters must be
bit-identical to the same run launched without one (``launch-failed`` of test_launch), every
restart must have started from the standby, and nothing of an unused standby may outlive the
run (no ``.standby`` folder, no process still waiting on its go file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import Run, RunCache
from test_launch import COMMON, SCRIPT, _made, committed_losses, verify_json

from ecrl.runtime.supervision.standby import GO_VARIABLE, STANDBY_DIR

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="module")
def standby_run(runs: RunCache) -> Run:
    return _made(runs.get("launch-standby", [*COMMON, "--fail-at", "9,21", "--warm-standby",
                                             *SCRIPT], command="launch"))


@pytest.fixture(scope="module")
def plain_run(runs: RunCache) -> Run:
    return _made(runs.get("launch-failed", [*COMMON, "--fail-at", "9,21", *SCRIPT],
                          command="launch"))


def _waiting_on(root: Path) -> list[int]:
    """Processes whose environment names a go file of this run's standby."""
    found = []
    marker = f"{GO_VARIABLE}={root / STANDBY_DIR}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_every_restart_started_from_the_standby(standby_run: Run) -> None:
    state = json.loads((standby_run.root / "supervisor.json").read_text())
    assert [a["world_size"] for a in state["attempts"]] == [2, 1, 1]
    assert state["warm_standby"] == {"1": True, "2": True}
    for a in state["attempts"]:
        log = standby_run.root / "logs" / f"attempt-{a['attempt']:03d}" / "torchrun.log"
        assert log.exists()


def test_standby_run_is_bit_identical_to_the_plain_one(standby_run: Run, plain_run: Run) -> None:
    assert committed_losses(standby_run.root) == committed_losses(plain_run.root)
    mine = torch.load(standby_run.root / "final.pt")
    theirs = torch.load(plain_run.root / "final.pt")
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert verify_json(standby_run.root)["verdict"] == "PASS"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_unused_standby_is_gone(standby_run: Run) -> None:
    assert not (standby_run.root / STANDBY_DIR).exists()
    assert _waiting_on(standby_run.root) == []
