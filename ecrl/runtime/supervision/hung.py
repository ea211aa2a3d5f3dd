"""Ending a hung attempt as soon as its survivors are done, not 30 s later.

A rank that hangs (stopped, deadlocked, a device stuck) does not die on the SIGTERM torchrun sends
its workers once a survivor exits: torchrun then waits its 30 s grace before SIGKILL, and every
hang added that to the recovery. Each survivor's marker (``hung-rank-R.json``, written by its
watchdog before the rescue) names its pid and host. Once every survivor on this host has exited,
its rescue saved, the supervisor SIGKILLs the workers torchrun still has here: the hung ranks.
Markers from another host (several nodes) leave the attempt to torchrun, as before. Linux only
(``/proc``); elsewhere nothing is killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
from pathlib import Path

from ecrl.contract.runformat import RunPaths
from ecrl.runtime.endings import JIT_CLAIM, JIT_MARKER, hung_markers
from ecrl.runtime.failure import read_marker

__all__ = ["survivors_done", "kill_remaining_workers"]

_STAT = re.compile(rb"^\d+ \(.*\) (\S) (\d+) ", re.S)
"""``/proc/PID/stat``: the state and the parent's pid follow the command name in parentheses."""


def _state(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    match = _STAT.match(data)
    return None if match is None else (match.group(1).decode(), int(match.group(2)))


def _exited(pid: int) -> bool:
    state = _state(pid)
    return state is None or state[0] in ("Z", "X")  # a zombie has exited; its parent reaps it


def survivors_done(paths: RunPaths, attempt: int) -> bool:
    """Whether the attempt is hung, every rank that said so has exited on this host, and no
    rescue is under way (a rank that claimed it after a dead peer's error, without a marker of
    its own, writes ``jit.json`` when it is done)."""
    directory = paths.attempt_dir(attempt)
    markers = [read_marker(paths, p) for p in hung_markers(directory)]
    if not markers or any(m is None for m in markers):
        return False
    if os.path.lexists(directory / JIT_CLAIM) and not os.path.lexists(directory / JIT_MARKER):
        return False
    host = socket.gethostname()
    pids = [m.get("pid") for m in markers if m is not None and m.get("host") == host]
    if len(pids) != len(markers) or not all(isinstance(p, int) and p > 0 for p in pids):
        return False  # a survivor on another node, or a marker of an older ECRL
    return all(_exited(int(p)) for p in pids if isinstance(p, int))


def kill_remaining_workers(torchrun_pid: int) -> list[int]:
    """SIGKILL the live children of ``torchrun_pid`` (its workers: the forked ranks of ``ecrl
    run``, or a script's ranks, each in a session of its own); the pids killed."""
    killed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            state = _state(int(entry.name))
            if state is None or state[1] != torchrun_pid or state[0] in ("Z", "X"):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
