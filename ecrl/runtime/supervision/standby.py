"""Warm standby: the next attempt's torchrun, started while the current one trains.

A restart costs a new torchrun, its rendezvous, ``import torch`` (once in the agent of ``ecrl run``,
whose ranks are forked from it; in every rank of a script under ``ecrl launch``) and whatever a
training script does before its first ECRL object: seconds, whatever the checkpoint strategy, and
often more than the steps a failure throws away. With ``--warm-standby`` the supervisor starts the
next attempt's torchrun as soon as the current attempt is launched. Its ranks get as far as the
first read of their attempt (:meth:`ecrl.runtime.launchenv.AttemptEnv.from_environ`, the first
``StepLog``/``Checkpointer`` of a user's script, the built-in trainer's start) and wait there for a
*go file*. When the current attempt ends and the supervisor has chosen where the next one resumes,
it writes the go file with that attempt's ``ECRL_*`` environment (atomically); the waiting ranks
take it into their environment and carry on, as if launched then.

Nothing about the attempt is decided early: the resume point, the failures still to inject and
the attempt number all come with the go file. A standby that is not used (the run completed or
stopped, the next attempt needs another world size, the standby died) is stopped: SIGTERM to its
torchrun, which stops its ranks, then SIGKILL to its process group if it lingers. Its files live
in ``RUN/.standby/`` until it is used (the torchrun log then moves into the attempt's folder), so
a run directory never shows an attempt that did not run.

Single node only: on several nodes the standby agents would have to rendezvous with the other
nodes' standbys while the current attempt holds the rendezvous.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ecrl.contract.atomicio import atomic_write_text
from ecrl.runtime._proc import ChildProcess, kill_process_group
from ecrl.runtime.launchenv import GO_VARIABLE

__all__ = ["GO_VARIABLE", "STANDBY_DIR", "Standby"]

STANDBY_DIR = ".standby"
"""Inside the run directory: the waiting attempt's go file and torchrun log."""
_STOP_GRACE_S = 10.0


@dataclass(kw_only=True, slots=True)
class _Waiting:
    attempt: int
    world: int
    proc: ChildProcess
    go: Path
    log: Path


class Standby:
    """The supervisor's side: start, hand over and stop the waiting torchrun.

    ``launch(attempt, world, variables, log_file)`` is the supervisor's own launcher: the same
    command line and environment as a normal attempt's, with ``variables`` (here only
    :data:`GO_VARIABLE`) instead of the attempt's."""

    def __init__(self, run_root: Path,
                 launch: Callable[[int, int, Mapping[str, str], Path], ChildProcess],
                 ) -> None:
        self.folder = run_root / STANDBY_DIR
        self._launch = launch
        self._waiting: _Waiting | None = None

    def prepare(self, attempt: int, world: int) -> None:
        """Start attempt ``attempt``'s torchrun at world size ``world``, waiting for its go."""
        self.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        go = self.folder / f"attempt-{attempt:03d}.go"
        log = self.folder / f"attempt-{attempt:03d}.torchrun.log"
        with contextlib.suppress(FileNotFoundError):
            go.unlink()
        proc = self._launch(attempt, world, {GO_VARIABLE: str(go)}, log)
        self._waiting = _Waiting(attempt=attempt, world=world, proc=proc, go=go, log=log)

    def take(self, attempt: int, world: int, environ: Mapping[str, str],
             log_destination: Path) -> ChildProcess | None:
        """Hand attempt ``attempt`` to the waiting torchrun if it fits (same attempt and world
        size, still alive): its log moves to ``log_destination``, the go file is written, and
        its process is returned. None (and the standby stopped) otherwise."""
        waiting = self._waiting
        if waiting is None or waiting.attempt != attempt or waiting.world != world \
                or waiting.proc.poll() is not None:
            self.stop()
            return None
        self._waiting = None
        # The process keeps writing to the same open file under its new name.
        os.replace(waiting.log, log_destination)
        atomic_write_text(waiting.go, json.dumps({"environ": dict(environ)}))
        return waiting.proc

    def stop(self) -> None:
        """Stop a waiting torchrun that will not be used, and remove its files."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            _stop_process_group(waiting.proc)
        shutil.rmtree(self.folder, ignore_errors=True)


def _stop_process_group(proc: ChildProcess) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_GRACE_S)
    # Ranks that outlived torchrun (or a torchrun that ignored SIGTERM): its session goes.
    kill_process_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_GRACE_S)
