"""Pipelined ``overlapped`` checkpoints in real runs: verified, bit-identical, never half-taken.

The copy of parameters and optimizer state runs under the next step, so a rank 0 killed right
after a checkpoint boundary dies with that copy unfinished: the run must resume from the
checkpoint before it, never from the one whose image was still being filled.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PipedRun, Run, _made
from lineage_check import check_exactly_once, load_run

pytestmark = pytest.mark.torchrun


@pytest.fixture(scope="session")
def rank0_killed_at_checkpoints(rank0_killed_piped: PipedRun) -> Run:
    """Overlapped, rank 0 killed right after the checkpoint boundaries of steps 7 and 23 (its
    stdout closed after three lines: test_supervisor_signals.py's closed pipe)."""
    return _made(rank0_killed_piped.run)


def _verify(root: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    report: dict[str, object] = json.loads(out.stdout)
    return report


@pytest.mark.parametrize("name", ["overlapped_run", "rank0_killed_at_checkpoints"])
def test_pipelined_runs_verify_and_replay_bit_identically(
        name: str, request: pytest.FixtureRequest, reference_run: Run) -> None:
    run: Run = request.getfixturevalue(name)
    view = load_run(run.root)
    events = view.events()
    assert events and all(e.extra.get("pipelined") is True for e in events)
    for e in events:
        assert e.extra["deferred_bytes"] > 0 and e.extra["copy_s"] > 0
        assert e.stall_s >= e.extra["boundary_s"] + e.extra["wait_s"]
        assert e.stall_s >= e.snapshot_s
    check_exactly_once(view)
    # every replayed step's loss equals the committed one, bit for bit (losses() asserts it)
    losses = view.losses(committed_only=False)
    assert len(losses) == 40 * 2
    assert view.final_digest() == load_run(reference_run.root).final_digest()
    assert _verify(run.root)["verdict"] == "PASS"


def test_a_checkpoint_whose_copy_was_unfinished_is_never_resumed_from(
        rank0_killed_at_checkpoints: Run) -> None:
    view = load_run(rank0_killed_at_checkpoints.root)
    attempts = view.state.attempts
    assert [a.status for a in attempts] == ["failed", "failed", "completed"]
    assert [a.last_step for a in attempts[:2]] == [7, 23]
    # rank 0 died with the copies of steps 7 and 23 pending: they were never handed to the
    # writer, so no resume loads them (an earlier one, handed on but still being written when
    # rank 0 died, may be lost too, as in any crash)
    for failed, resumed in itertools.pairwise(attempts):
        start = -1 if resumed.resumed_from_step is None else resumed.resumed_from_step
        assert failed.last_step is not None and start < failed.last_step
    written = {(e.extra["attempt"], e.global_step) for e in view.events()}
    assert (0, 7) not in written and (1, 23) not in written
