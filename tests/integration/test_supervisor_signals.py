"""A closed terminal or output pipe (issue 11.4): SIGHUP stops the job like Ctrl-C, and a broken
stdout stops the printing, never the training. Real ``ecrl run`` processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PipedRun, ecrl
from lineage_check import check_exactly_once, load_run

pytestmark = pytest.mark.torchrun


def _start(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", "run", "--out", str(out),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(out: Path, steps: int, timeout: float = 180) -> None:
    log = out / "logs" / "attempt-000" / "rank-000.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_bytes().count(b"\n") >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"{log} did not reach {steps} steps")


def test_sighup_stops_the_run_cleanly_and_it_continues_later(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start(out, "--dataset-size", "4096", "--global-batch", "8", "--steps", "80",
                  "--ckpt-every", "10", "--strategy", "blocking", "--world-sizes", "1")
    _wait_for_steps(out, 25)
    proc.send_signal(signal.SIGHUP)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "SIGHUP received" in stderr and "Traceback" not in stderr
    view = load_run(out)
    assert view.state.status == "stopped"
    assert [a.status for a in view.state.attempts] == ["stopped"]
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["stopped", "completed"]
    check_exactly_once(view)


def test_a_closed_stdout_pipe_stops_printing_not_training(rank0_killed_piped: PipedRun) -> None:
    # `ecrl run … | head -3`: three lines read, then the reader closed its end of the pipe; the
    # run (test_pipeline_runs.py's: rank 0 killed after steps 7 and 23) went on to its end.
    run, lines = rank0_killed_piped.run, rank0_killed_piped.first_lines
    assert len(lines) == 3 and all(lines)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr
    state = json.loads((run.root / "supervisor.json").read_text())
    assert state["status"] == "completed"
    assert [a["status"] for a in state["attempts"]] == ["failed", "failed", "completed"]
    check_exactly_once(load_run(run.root))
