"""End to end: real `ecrl run` output, checked by the verifier (issues #3 and #4 together).

The runtime's own oracle (lineage_check.py) checks the same runs independently; here the product's
checker must agree, must catch every harmful mutation of a real run, and the CLI must give the
documented exit codes on real directories.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RUN_TIMEOUT_S, Run, ecrl

from verifier import render_text, verify
from verifier.selftest import self_test

pytestmark = pytest.mark.torchrun


@pytest.mark.parametrize("name", ["reference_run", "blocking_run", "overlapped_run", "demo_run",
                                  "elastic_up_run", "writer_crash_run"])
def test_verifier_passes_every_completed_run(name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(name)
    result = verify(str(run.root))
    assert result.exit_code == 0, render_text(result)
    metrics = result.runs[0].metrics
    assert metrics.committed_steps > 0


def test_restarts_and_replays_are_counted_on_a_real_failure_run(blocking_run: Run) -> None:
    result = verify(str(blocking_run.root))
    supervisor = json.loads((blocking_run.root / "supervisor.json").read_text())
    assert result.runs[0].metrics.restarts == supervisor["restarts"] > 0
    # every resumed attempt carries the supervisor's testimony of the checkpoint it verified
    points = supervisor["resume_points"]
    resumed = {str(a["attempt"]): a["resumed_from_step"] for a in supervisor["attempts"]
               if a["resumed_from_step"] is not None}
    assert resumed and {k: v["global_step"] for k, v in points.items()} == resumed
    assert all(v["checksum"].startswith("sha256:") for v in points.values())


def test_mutations_of_a_real_run_are_caught(demo_run: Run, tmp_path: Path) -> None:
    outcome = self_test(demo_run.root, workdir=tmp_path)
    assert outcome.harmful > 0 and outcome.benign > 0
    missed = [t for t in outcome.trials if t.harmful and not t.ok]
    alarms = [t for t in outcome.trials if not t.harmful and not t.ok]
    assert not missed, f"harmful mutations that passed: {missed}"
    assert not alarms, f"benign mutations that failed: {alarms}"


def test_cli_exit_codes_on_real_runs(overlapped_run: Run, tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "verifier.cli", str(overlapped_run.root),
                         "--format", "json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "PASS"
    broken = tmp_path / "broken"
    shutil.copytree(overlapped_run.root, broken)
    # drop the last committed step of rank 0: a real, harmful corruption
    log = sorted((broken / "logs").glob("attempt-*/rank-000.jsonl"))[-1]
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]))
    bad = subprocess.run([sys.executable, "-m", "verifier.cli", str(broken)],
                         capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr


def _verify_json(root: Path) -> tuple[int, dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format", "json"],
                         capture_output=True, text=True)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)["runs"][0]


def test_a_stopped_run_is_unknown_until_it_is_continued(tmp_path: Path) -> None:
    """Ctrl-C on `ecrl run` (SIGINT to the supervisor), then `ecrl run --out` continues it."""
    root = tmp_path / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ecrl.apps.cli", "run", "--out", str(root), "--dataset-size", "256",
         "--global-batch", "8", "--steps", "100", "--ckpt-every", "20", "--world-sizes", "2",
         "--strategy", "blocking", "--log-ids", "--seed", "7"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    latest = root / "checkpoints" / "latest.json"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    # Stop once two checkpoints are durable, so the committed prefix spans more than one.
    while proc.poll() is None and time.monotonic() < deadline:
        if latest.exists() and json.loads(latest.read_text())["global_step"] >= 39:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be stopped:\n" + \
        "".join(proc.communicate())
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 130, stdout + stderr
    assert json.loads((root / "supervisor.json").read_text())["status"] == "stopped"
    durable = json.loads(latest.read_text())["global_step"]

    code, run = _verify_json(root)
    assert (code, run["verdict"]) == (2, "UNKNOWN"), run
    assert run["anomalies"] == [], run
    unfinished = run["unfinished"]
    assert isinstance(unfinished, dict)
    claimed = unfinished["durable_step"]
    assert unfinished["status"] == "stopped"
    if claimed != durable:
        # Ctrl-C landed between latest.json's publication and its checkpoint event: the verifier
        # claims the checkpoint before it, never more than is recorded (lineage.durable_step),
        # and says why.
        assert claimed == durable - 20, (claimed, durable)
        notes = [w["message"] for w in run["warnings"] if w["kind"] == "latest"]
        assert any(f"no checkpoint event backs step {durable}" in n for n in notes), run
    assert unfinished["committed_steps"] == claimed + 1 < 100
    assert run["unknown"] == [unfinished["message"]]
    # supervisor.json's last_step (every rank) agrees with the logs even after a mid-step stop.
    assert not [w for w in run["warnings"] if w["kind"] == "supervisor"], run["warnings"]
    message = str(unfinished["message"])
    assert message.startswith("run not finished (status 'stopped' after step ")
    assert f"steps 0..{claimed} proved exactly once up to the last durable checkpoint" in message
    assert f"steps {claimed + 1}..99 not committed yet" in message
    assert f"continue it with `ecrl run --out {root}`" in message

    # The mutation catalogue on the real stopped run: every harmful mutation of its committed
    # prefix or tentative records is caught, every benign one leaves it UNKNOWN.
    outcome = self_test(root, workdir=tmp_path)
    assert outcome.harmful > 0 and outcome.benign > 0
    wrong = [t for t in outcome.trials if not t.ok]
    assert not wrong, wrong
    assert all(t.verdict == "UNKNOWN" for t in outcome.trials if not t.harmful)

    done = ecrl("run", "--out", str(root), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    code, run = _verify_json(root)
    assert (code, run["verdict"]) == (0, "PASS"), run
    lineage = run["lineage"]
    assert isinstance(lineage, list)
    assert [a["status"] for a in lineage] == ["stopped", "completed"]
    assert lineage[1]["resumed_from_step"] == durable
    assert lineage[0]["committed"] == [0, durable] and lineage[0]["tentative_steps"] == 0
    assert run["unfinished"] is None
