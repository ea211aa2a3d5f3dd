"""The supervisor ends a hung attempt once its survivors are done (ecrl.runtime.supervision.hung):
real processes, a real SIGSTOP, real markers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ecrl.contract.runformat import RunPaths
from ecrl.runtime.endings import HUNG_MARKER, JIT_CLAIM, JIT_MARKER
from ecrl.runtime.supervision.hung import kill_remaining_workers, survivors_done

# A stand-in for torchrun: a parent whose worker runs in a session of its own, as torchrun's do.
PARENT = ("import subprocess, sys, time\n"
          "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
          "start_new_session=True)\n"
          "print(w.pid, flush=True)\n"
          "w.wait()\n"
          "print('worker gone', flush=True)\n")


def _marker(paths: RunPaths, rank: int, **fields: object) -> None:
    paths.attempt_dir(0).mkdir(parents=True, exist_ok=True)
    (paths.attempt_dir(0) / HUNG_MARKER.format(rank=rank)).write_text(
        json.dumps({"rank": rank, "last_step": 5, "waited_s": 3.0, "bound_s": 3.0, **fields}))


def _finished_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_the_attempt_is_over_once_every_survivor_here_has_exited(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    assert not survivors_done(paths, 0)  # no marker: not hung
    host = socket.gethostname()
    _marker(paths, 0, pid=_finished_pid(), host=host)
    assert survivors_done(paths, 0)
    _marker(paths, 2, pid=os.getpid(), host=host)  # a survivor still saving
    assert not survivors_done(paths, 0)
    _marker(paths, 2, pid=_finished_pid(), host="another-node")
    assert not survivors_done(paths, 0)  # that node's torchrun ends its own ranks
    _marker(paths, 2, pid=_finished_pid(), host=host)
    assert survivors_done(paths, 0)
    # A rank without a marker claimed the rescue (a dead peer's error): wait for its jit.json.
    (paths.attempt_dir(0) / JIT_CLAIM).write_text("")
    assert not survivors_done(paths, 0)
    (paths.attempt_dir(0) / JIT_MARKER).write_text("{}")
    assert survivors_done(paths, 0)
    _marker(paths, 3)  # written by an ECRL that named no pid
    assert not survivors_done(paths, 0)


def test_the_stopped_worker_is_killed_and_its_parent_sees_it_go() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        os.kill(worker, signal.SIGSTOP)  # hung: a SIGTERM would wait for a SIGCONT
        assert kill_remaining_workers(parent.pid) == [worker]
        assert parent.stdout.readline().strip() == "worker gone"
        assert parent.wait(timeout=30) == 0
        assert kill_remaining_workers(parent.pid) == []
    finally:
        if parent.poll() is None:
            parent.kill()
