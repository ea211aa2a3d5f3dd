"""Two nodes simulated on this machine: two ``ecrl launch --nnodes 2`` sharing one c10d
rendezvous on localhost (one rank per node) and one run directory (what a shared file system
gives real nodes). A failure is injected on global rank 1, the rank on the second node (with one
rank per node, the node that rendezvous made group rank 1); both supervisors relaunch, the run
completes and verifies PASS."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RUN_TIMEOUT_S
from test_launch import EXAMPLE, verify_json

pytestmark = pytest.mark.torchrun


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_nodes_relaunch_together_and_verify(tmp_path: Path) -> None:
    out, port = tmp_path / "run", _free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "ecrl.apps.cli", "launch", "--out", str(out),
               "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"localhost:{port}",
               "--rdzv-id", "two-nodes", "--world-sizes", "2", "--fail-at", "9", "--fail-rank",
               "1", "--ckpt-every", "4", "--strategy", "blocking", "--", "python", str(EXAMPLE),
               "--steps", "20", "--workers", "0"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=dict(os.environ)))
    outputs = [p.communicate(timeout=RUN_TIMEOUT_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)

    primary = json.loads((out / "supervisor.json").read_text())
    secondary = json.loads((out / "supervisor-node-1.json").read_text())
    for state in (primary, secondary):
        assert state["status"] == "completed"
        assert [(a["world_size"], a["resumed_from_step"]) for a in state["attempts"]] == [
            (2, None), (2, 7)]
    assert primary["injected_failures"] == [{"attempt": 0, "global_step": 9, "rank": 1}]
    # Each node's torchrun kept its own log; the ranks of both nodes wrote to the shared run.
    assert (out / "logs" / "attempt-000" / "torchrun.log").exists()
    assert (out / "logs" / "attempt-000" / "torchrun-node-1.log").exists()
    assert sorted(p.name for p in (out / "logs" / "attempt-001").glob("rank-*.jsonl")) == [
        "rank-000.jsonl", "rank-001.jsonl"]
    report = verify_json(out)
    assert report["verdict"] == "PASS", report
    assert report["runs"][0]["checked"]["committed_steps"] == 20
