"""World-size changes, a writer killed inside the checkpoint protocol, Ctrl-C, corruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, Run, ecrl
from lineage_check import check_exactly_once, load_run

from ecrl.contract.ckptfile import read_verified

pytestmark = pytest.mark.torchrun


def test_one_to_two_ranks_on_cifar100(elastic_up_run: Run) -> None:
    view = load_run(elastic_up_run.root)
    counts = check_exactly_once(view)
    attempts = view.state.attempts
    assert [a.world_size for a in attempts] == [1, 2]
    assert attempts[1].resumed_from_step == 5  # checkpoints after steps 2 and 5; failure at 7
    assert counts["committed"] == 6 * 1 + 8 * 2
    assert view.manifest.dataset == {"name": "cifar100", "size": 48}
    # the 2-rank attempt splits each window in two contiguous halves of 4
    assert {r.local_batch for r in view.records[attempts[1].attempt]} == {4}


def test_writer_killed_mid_protocol_leaves_a_valid_latest(writer_crash_run: Run) -> None:
    view = load_run(writer_crash_run.root)
    attempts = view.state.attempts
    assert [a.status for a in attempts] == ["failed", "completed"]
    assert not view.state.extra["injected_failures"]  # a crash, not an injected failure
    # The 2nd commit (step 5) died before latest.json moved: the resume used step 2's checkpoint.
    assert attempts[1].resumed_from_step == 2
    assert "crashed" in writer_crash_run.stderr and "background checkpoint writer" in (
        writer_crash_run.stderr)
    check_exactly_once(view)
    latest = view.latest()
    assert latest is not None
    read_verified(view.paths.checkpoints / latest.path, expected_checksum=latest.checksum)


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or initial environment names ``text``: the supervisor and
    the writer by their arguments, torchrun and its forked ranks by ``ECRL_RUN_DIR``."""
    found = []
    wanted = text.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if wanted in (entry / "cmdline").read_bytes() or \
                        wanted in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ctrl_c_stops_cleanly_then_resume_falls_back_past_corruption_and_completes(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--dataset-size", "4096", "--global-batch", "8",
            "--steps", "80", "--ckpt-every", "10", "--strategy", "blocking", "--world-sizes", "1",
            "--log-ids"]
    proc = subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = out / "logs" / "attempt-000" / "rank-000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if log.exists() and log.read_bytes().count(b"\n") >= 25:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "SIGINT received" in stderr and "Traceback" not in stderr
    time.sleep(0.5)
    assert _processes_mentioning(str(out)) == []  # torchrun, the rank and nothing else left
    view = load_run(out)
    assert view.state.status == "stopped"
    assert [a.status for a in view.state.attempts] == ["stopped"]
    stopped_at = view.state.attempts[0].last_step
    assert stopped_at is not None and 25 <= stopped_at + 1 < 80

    # a corrupt checkpoint is never loaded: one line, and the earlier valid one is used
    latest = view.latest()
    assert latest is not None and latest.global_step >= 19
    ckpt = out / "checkpoints" / latest.path
    damaged = bytearray(ckpt.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    ckpt.write_bytes(bytes(damaged))
    resumed = ecrl("run", "--out", str(out))  # the run's own settings, from run.json
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout
    assert "checksum mismatch" in resumed.stderr and "valid earlier checkpoint" in resumed.stderr
    earlier = latest.global_step - 10
    # one line naming the damaged checkpoint and the one used (test_damaged_checkpoint_resume
    # holds a truncated and a deleted newest checkpoint to the same)
    notes = [line for line in resumed.stderr.splitlines() if "valid earlier checkpoint" in line]
    assert len(notes) == 1 and latest.path in notes[0], resumed.stderr
    assert f"step-{earlier:08d}.ckpt (step {earlier})" in notes[0]
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["stopped", "completed"]
    assert view.state.attempts[1].resumed_from_step == earlier
    point = view.state.extra["resume_points"]["1"]
    assert point["global_step"] == earlier and point["reason"] == "fallback"
    assert point["path"] == f"step-{earlier:08d}.ckpt" and latest.path in point["problem"]
    # the pointer was repaired to the checkpoint really loaded, then moved on by the new attempt
    moved = view.latest()
    assert moved is not None and moved.global_step > earlier
    check_exactly_once(view)
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert verdict.returncode == 0 and "PASS" in verdict.stdout, verdict.stdout + verdict.stderr


def test_resume_with_another_batch_or_seed_is_refused(blocking_run: Run) -> None:
    files = {p: p.read_bytes() for p in (blocking_run.root / "run.json",
                                         blocking_run.root / "supervisor.json")}
    base = ["run", "--out", str(blocking_run.root), "--world-sizes", "2", "--strategy",
            "blocking", "--fail-at", "9,21"]
    tiny = dict(zip(TINY[::2], TINY[1::2], strict=True))
    for flag, value, word in (("--global-batch", "16", "global_batch"), ("--seed", "8", "seed")):
        changed = {**tiny, flag: value}
        result = ecrl(*base, *[x for kv in changed.items() for x in kv])
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.count("\n") == 1 and word in result.stderr
        assert "use a new --out" in result.stderr
    assert {p: p.read_bytes() for p in files} == files


def test_a_killed_supervisor_takes_its_job_along_and_the_run_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--dataset-size", "2048", "--global-batch", "8",
            "--steps", "80", "--ckpt-every", "10", "--strategy", "overlapped",
            "--world-sizes", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "logs" / "attempt-000" / "rank-000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and log.read_bytes().count(b"\n")
                                               >= 25):
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no handler runs, supervisor.json still says "running"
    proc.wait()
    deadline = time.monotonic() + 30
    while _processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_mentioning(str(out)) == []  # torchrun, the rank, the writer: all gone
    assert load_run(out).state.status == "running"
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["failed", "completed"]
    check_exactly_once(view)
