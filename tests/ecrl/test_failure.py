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


def test_planted_markers_are_ignored_not_followed_or_waited_on(tmp_path: Path) -> None:
    # Someone else may write the run directory: a FIFO in place of a marker would block the
    # supervisor for good, a link would read a file outside the run, a huge file all memory.
    import json
    import os

    paths = RunPaths.of(tmp_path / "run")
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"global_step": 3, "rank": 0, "message": "outside",
                                   "status": "x"}))
    for attempt in range(3):
        paths.attempt_dir(attempt).mkdir(parents=True)
    os.mkfifo(paths.attempt_dir(0) / "failure.json")
    (paths.attempt_dir(0) / "fatal.json").symlink_to(outside)
    (paths.attempt_dir(1) / "failure.json").symlink_to(outside)
    os.mkfifo(paths.attempt_dir(1) / "fatal.json")
    os.mkfifo(paths.attempt_dir(0) / "deadline.json")
    (paths.attempt_dir(0) / "hung-rank-000.json").symlink_to(outside)
    (paths.attempt_dir(1) / "jit.json").symlink_to(outside)
    (paths.attempt_dir(2) / "jit.json").write_text(json.dumps({"rank": 0}) + " " * (1 << 20))
    (paths.attempt_dir(2) / "failure.json").write_text(json.dumps(["not", "an", "object"]))
    code = ("from ecrl.contract.runformat import RunPaths\n"
            "from ecrl.runtime.endings import read_ending\n"
            "from ecrl.runtime.failure import read_fatal, read_fired\n"
            f"paths = RunPaths.of({str(paths.root)!r})\n"
            "print([(read_fired(paths, a), read_fatal(paths, a), read_ending(paths, a, 2))\n"
            "       for a in range(3)])\n")
    # The timeout is the test's: a reader that blocks on a FIFO fails here.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([(None, None, None)] * 3)
