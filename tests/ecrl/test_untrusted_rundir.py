"""The runtime's run-format readers on a run directory someone else wrote (issue 24): no FIFO
blocks them, no link is followed, no line is read whole beyond the limit, and a planted attempt
folder neither leaves a gap in supervisor.json's numbering nor receives a new attempt's records.
Without torchrun: the continuation is refused, or only opened, before any attempt starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import CheckpointEvent, JsonlReader, RunPaths


def _stopped_run(out: Path) -> RunPaths:
    """A run whose attempt 0 was stopped before it logged anything (no torchrun needed)."""
    from ecrl.runtime.runconfig import load_config
    from ecrl.runtime.supervision.events import Silent
    from ecrl.runtime.supervision.supervisor import Supervisor

    config = load_config({"out": str(out), "dataset": "fake", "dataset_size": 64,
                          "global_batch": 4, "steps": 8, "world_sizes": [1]},
                         config_file=None, default_out=str(out))
    sup = Supervisor(config, reporter=Silent())
    assert sup._open_run()
    assert sup._lock is not None
    sup._lock.close()
    paths = RunPaths.of(out)
    state = json.loads(paths.supervisor.read_text())
    state["attempts"] = [{"attempt": 0, "world_size": 1, "resumed_from_step": None,
                          "first_step": None, "last_step": None, "exit_code": 130,
                          "status": "stopped", "start_time": 1.0, "end_time": 2.0}]
    state["status"] = "stopped"
    paths.supervisor.write_text(json.dumps(state))
    paths.attempt_dir(0).mkdir(parents=True)
    return paths


def _continue(paths: RunPaths) -> subprocess.CompletedProcess[str]:
    # The timeout is the test's: a reader that blocks on the FIFO fails here.
    return subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "run", "--out",
                           str(paths.root)], capture_output=True, text=True, timeout=120)


def test_continuing_a_run_with_a_fifo_checkpoint_log_is_refused_not_waited_on(
        tmp_path: Path) -> None:
    paths = _stopped_run(tmp_path / "run")
    os.mkfifo(paths.checkpoint_log(0))
    out = _continue(paths)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("ecrl run: error: ")
    assert "checkpoint_rank0.jsonl: a FIFO, not a regular file" in out.stderr
    assert json.loads(paths.supervisor.read_text())["attempts"][0]["status"] == "stopped"


def test_a_checkpoint_log_linked_to_dev_zero_is_refused_in_bounded_memory(
        tmp_path: Path) -> None:
    # Followed, /dev/zero is one endless line: run the reader where memory is capped.
    log = tmp_path / "checkpoint_rank0.jsonl"
    log.symlink_to("/dev/zero")
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from ecrl.contract.errors import RunFormatError
        from ecrl.contract.runformat import CheckpointEvent, JsonlReader
        try:
            list(JsonlReader({str(log)!r}, CheckpointEvent, torn_tail_ok=True))
        except RunFormatError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"{log}: cannot read: a symbolic link, not a regular file " \
                                 "(a run directory's files are never followed through links " \
                                 "or read from special files)"


def test_a_line_over_the_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    log = tmp_path / "checkpoint_rank0.jsonl"
    log.write_bytes(b"{}\n" + b"x" * (16 << 20) + b"\n")
    tracemalloc.start()
    try:
        with pytest.raises(RunFormatError, match=r"jsonl:2: line longer than 1048576 bytes"):
            list(JsonlReader(log, CheckpointEvent, torn_tail_ok=False).raw())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB"
    small = JsonlReader(log, CheckpointEvent, torn_tail_ok=False, max_line=1)
    with pytest.raises(RunFormatError, match=r"jsonl:1: line longer than 1 bytes"):
        list(small.raw())


def test_a_log_below_a_linked_folder_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "run"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "attempt-000").mkdir(parents=True)
    (elsewhere / "attempt-000" / "checkpoint_rank0.jsonl").write_text("")
    root.mkdir()
    (root / "logs").symlink_to(elsewhere)
    paths = RunPaths.of(root)
    reader = JsonlReader(paths.checkpoint_log(0), CheckpointEvent, torn_tail_ok=True,
                         root=root)
    with pytest.raises(RunFormatError,
                       match="jsonl: cannot read: its folder logs is a symbolic link, not a dir"):
        list(reader)


def test_a_planted_attempt_folder_is_set_aside_and_the_numbering_stays_whole(
        tmp_path: Path) -> None:
    from ecrl.runtime.runconfig import load_config
    from ecrl.runtime.supervision.events import Silent
    from ecrl.runtime.supervision.supervisor import Supervisor

    paths = _stopped_run(tmp_path / "run")
    planted = paths.attempt_dir(1)
    planted.mkdir()
    (planted / "rank-000.jsonl").write_text('{"planted": true}\n')
    config = load_config({"out": str(paths.root)}, config_file=None,
                         default_out=str(paths.root))
    sup = Supervisor(config, reporter=Silent())
    try:
        assert sup._open_run()
        assert sup._next_attempt() == 1  # after the recorded attempt 0, not after the folder
    finally:
        assert sup._lock is not None
        sup._lock.close()
    assert not planted.exists()
    kept = paths.logs / "stray-attempt-001" / "rank-000.jsonl"
    assert kept.read_text() == '{"planted": true}\n'  # evidence kept, out of the run format
    state = json.loads(paths.supervisor.read_text())
    assert state["stray_logs"] == [{"folder": "logs/attempt-001",
                                    "moved_to": "logs/stray-attempt-001"}]


def test_a_standalone_attempt_sets_a_planted_folder_aside_like_the_supervisor(
        tmp_path: Path) -> None:
    # Standalone (no ecrl launch) each launch numbered its attempt after every folder on disk, so
    # a planted logs/attempt-005 made the next attempt 6 and left a gap no verifier accepts.
    paths = RunPaths.of(tmp_path / "run")
    for n in (0, 1, 5):
        paths.attempt_dir(n).mkdir(parents=True)
        (paths.attempt_dir(n) / "rank-000.jsonl").write_text(f'{{"attempt": {n}}}\n')
    code = ("from ecrl.runtime._attempt import resolve_attempt\n"
            f"print(resolve_attempt({str(paths.root)!r}).attempt)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ECRL_", "RANK",
                                                                       "WORLD_SIZE"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"
    assert paths.attempts() == [0, 1, 2]
    kept = paths.logs / "stray-attempt-005" / "rank-000.jsonl"
    assert kept.read_text() == '{"attempt": 5}\n'  # evidence kept, out of the run format
    assert (paths.attempt_dir(1) / "rank-000.jsonl").is_file()  # the run's own untouched


def test_a_standalone_attempt_keeps_the_attempts_supervisor_json_records(tmp_path: Path) -> None:
    # A run ecrl launch started, continued standalone: a recorded attempt whose folder is gone
    # still counts, so the folders after it are the run's own, not strays.
    from ecrl.runtime._attempt import standalone_attempt

    paths = _stopped_run(tmp_path / "run")
    state = json.loads(paths.supervisor.read_text())
    state["attempts"].append({**state["attempts"][0], "attempt": 1})
    paths.supervisor.write_text(json.dumps(state))
    paths.attempt_dir(2).mkdir()
    paths.attempt_dir(4).mkdir()
    assert standalone_attempt(paths) == (3, [{"folder": "logs/attempt-004",
                                              "moved_to": "logs/stray-attempt-004"}])
    assert paths.attempts() == [0, 2]


def test_setting_a_stray_folder_aside_is_said_in_one_line(tmp_path: Path) -> None:
    # supervisor.json alone recorded it: the person continuing the run saw nothing.
    from ecrl.apps.console import render
    from ecrl.runtime.runconfig import load_config
    from ecrl.runtime.supervision.events import Event
    from ecrl.runtime.supervision.supervisor import Supervisor

    class Collect:
        def __init__(self) -> None:
            self.events: list[Event] = []

        def report(self, event: Event) -> None:
            self.events.append(event)

    paths = _stopped_run(tmp_path / "run")
    paths.attempt_dir(3).mkdir()
    config = load_config({"out": str(paths.root)}, config_file=None,
                         default_out=str(paths.root))
    reporter = Collect()
    sup = Supervisor(config, reporter=reporter)
    try:
        assert sup._open_run()
        paths.attempt_dir(1).mkdir()  # planted while the run goes on, where attempt 1 goes
        assert sup._next_attempt() == 1
    finally:
        assert sup._lock is not None
        sup._lock.close()
    lines = [line for event in reporter.events for line in render(event)]
    said = [(stream, text) for stream, text in lines if "stray-attempt" in text]
    assert said == [
        ("err", "ecrl run: set aside 1 attempt folder that supervisor.json does not record (not "
                "written by this run; kept as evidence): logs/attempt-003 → "
                "logs/stray-attempt-003"),
        ("err", "ecrl run: set aside 1 attempt folder that supervisor.json does not record (not "
                "written by this run; kept as evidence): logs/attempt-001 → "
                "logs/stray-attempt-001")]
    resuming = next(i for i, (_, text) in enumerate(lines) if "resuming" in text)
    assert lines.index(said[0]) > resuming  # after the line that names the run


def test_a_forged_framework_name_never_reaches_the_console(tmp_path: Path) -> None:
    """`ecrl launch` prints the framework that wrote a run's newest checkpoint, read from the
    run directory's checkpoint log: only a name is taken, never a string with escape sequences."""
    from types import SimpleNamespace

    from ecrl.contract.runformat import JsonlWriter
    from ecrl.runtime.supervision.launcher import LaunchSupervisor

    paths = RunPaths.of(tmp_path)
    with JsonlWriter(paths.checkpoint_log(0)) as log:
        for step, by in ((3, "transformers"), (7, "\x1b]0;owned\x07")):
            log.write(CheckpointEvent(global_step=step, strategy="x", snapshot_s=0.0,
                                      write_s=0.0, enqueue_s=0.0, backpressure_s=0.0,
                                      stall_s=0.0, bytes=0, path="", extra={"written_by": by}))
    owner = SimpleNamespace(state=SimpleNamespace(attempts=[SimpleNamespace(attempt=0)]),
                            paths=paths)
    assert LaunchSupervisor._framework_checkpoints(owner) == (3, "transformers")  # type: ignore[arg-type]
