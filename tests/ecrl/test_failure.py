"""Failure injection: a real os._exit(137) after leaving its marker; each step fails once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ecrl.contract.runformat import RunPaths
from ecrl.runtime.failure import (
    FAILURE_EXIT_CODE,
    FailurePlan,
    FiredFailure,
    read_fatal,
    read_fired,
    remaining,
    write_fatal,
)


def test_inject_leaves_a_marker_and_exits_137(tmp_path: Path) -> None:
    code = ("from ecrl.runtime.failure import inject; "
            "from ecrl.contract.runformat import RunPaths; "
            f"inject(RunPaths.of({str(tmp_path)!r}), attempt=2, step=41, rank=1); print('alive')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == FAILURE_EXIT_CODE and "alive" not in proc.stdout
    assert read_fired(RunPaths.of(tmp_path), 2) == FiredFailure(attempt=2, global_step=41, rank=1)
    assert read_fired(RunPaths.of(tmp_path), 1) is None


def test_plan_and_remaining() -> None:
    plan = FailurePlan(steps=frozenset({4, 9}), rank=1)
    assert plan.due(4, 1) and not plan.due(4, 0) and not plan.due(5, 1)
    fired = [FiredFailure(attempt=0, global_step=4, rank=1)]
    assert remaining([9, 4, 12], fired) == [9, 12]
    assert remaining([4], fired) == []


def test_fatal_marker(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    assert read_fatal(paths, 0) is None
    write_fatal(paths, attempt=0, rank=1, message="checkpoint is corrupt")
    assert read_fatal(paths, 0) == "checkpoint is corrupt"
