"""The durable write of a resume state, off the training thread.

A save serializes its state on the training thread (:mod:`transform.runtime._pickling`): from
then on the header, the payload and the blobs are immutable bytes, and writing them — blobs,
then ``resume.ckpt``, each with the atomic protocol (temporary file, fsync, rename, directory
fsync), then collecting blobs no state refers to — is the job of one background thread. Most of
a save's time is fsync and rename (the profile in docs/transform.md), so the training thread goes
on while the disk works.

* **At most one write in flight, one waiting.** A save that arrives while another is being written
  waits; a later save *supersedes* a waiting one (the newer state makes the older useless). So
  the durable state only moves forward, memory holds at most two states, and there is never more
  than one writer on a file. The waiting state carries the bytes of every blob it refers to, so
  collecting after a write can never remove a blob it needs (it is written again if it went).
* **A write error is never lost.** It is kept and raised as one line at the next save, or
  reported when the program exits (``ExitWatch`` drains the writer first).
* **A kill while a write is in flight** leaves the previous durable state (the protocol's
  guarantee); the resumed program replays from there — its work since that state is deterministic
  and runs again.

``ECRL_TRANSFORM_SYNC=1`` writes on the training thread instead (each save durable when
``_checkpoint()`` returns).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from transform.runtime._exit import CheckpointError
from transform.runtime._observe import Written, notify
from transform.runtime._statefile import StateDir

__all__ = ["SYNC_ENV", "Job", "StateWriter"]

SYNC_ENV = "ECRL_TRANSFORM_SYNC"
"""``1`` writes each resume state on the training thread, durable when the save returns."""


class Job:
    """One serialized state, ready to be written: nothing in it changes any more."""

    __slots__ = ("number", "header", "data", "blobs", "hook")

    def __init__(self, number: int, header: dict[str, Any], data: bytes, blobs: dict[str, bytes],
                 hook: Callable[[str], None] | None) -> None:
        self.number = number
        self.header = header
        self.data = data
        self.blobs = blobs
        self.hook = hook


class StateWriter:
    """Writes the states a program's saves hand it, newest wins, on one background thread."""

    def __init__(self, state_dir: StateDir, *, background: bool) -> None:
        self.state_dir = state_dir
        self.background = background
        self._forked()
        # A child the program forks (a DataLoader worker, os.fork) has no writer thread, and its
        # copy of the lock may be held: it starts with a writer of its own that has nothing in
        # flight (its exit must not wait for the parent's write).
        os.register_at_fork(after_in_child=self._forked)
        self.submitted = 0
        """Number of the newest state handed over (saves are numbered from 1)."""
        self.taken = 0
        """Number of the newest state the writer thread began to write."""
        self.written = 0
        """Number of the newest state written whole."""
        self.error: str | None = None
        self.reported = False
        """The error was raised at a save (the exit does not say it again)."""

    def _forked(self) -> None:
        self._cond = threading.Condition()
        self._waiting: Job | None = None
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- the training thread
    def submit(self, job: Job) -> None:
        """Hand over a state; raises the error of an earlier write that failed."""
        self._raise_error()
        if not self.background:
            self.submitted = self.taken = job.number
            self._write(job)
            self._raise_error()
            return
        with self._cond:
            self._waiting = job  # a waiting, older state is superseded
            self.submitted = job.number
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ecrl-transform-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every state handed over is written (or failed); raises a write's error."""
        with self._cond:
            while self._waiting is not None or self._busy:
                self._cond.wait()
        self._raise_error()

    def drain(self, *, discard_waiting: bool) -> str | None:
        """At exit: finish the write in flight (and the waiting one unless ``discard_waiting``:
        at normal completion the state is removed anyway); the error of a failed write, if any."""
        with self._cond:
            self._closing = True
            if discard_waiting:
                self._waiting = None
            self._cond.notify_all()
            while self._waiting is not None or self._busy:
                self._cond.wait()
        return None if self.reported else self.error

    def _raise_error(self) -> None:
        if self.error is not None:
            self.reported = True
            raise CheckpointError(self.error)

    # -- failure injection (tests)
    def wait_taken(self, number: int, timeout: float = 60.0) -> None:
        """Until the writer thread has begun to write state ``number``: an injected fault in its
        write must not be skipped because a later save superseded it while it waited."""
        with self._cond:
            self._cond.wait_for(lambda: self.taken >= number or self.error is not None, timeout)

    def hold_until_overtaken(self, number: int, timeout: float = 60.0) -> None:
        """Called inside the write of state ``number``: return once the program has handed over
        a later state (it ran on while this one was in flight) or is exiting."""
        with self._cond:
            self._cond.wait_for(lambda: self.submitted > number or self._closing, timeout)

    # -- the writer thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None:
                    self._cond.wait()
                job, self._waiting = self._waiting, None
                self._busy = True
                self.taken = job.number
                self._cond.notify_all()
            try:
                self._write(job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, job: Job) -> None:
        if self.error is not None:
            return  # reported already; nothing after a failed state is written
        try:
            written = self.state_dir.write(job.header, job.data, job.blobs, hook=job.hook)
        except Exception as exc:
            self.error = (f"cannot write the resume state in {self.state_dir.directory}: "
                          f"{type(exc).__name__}: {exc}; free space or set ECRL_CKPT_DIR to a "
                          "writable directory, then run the program again (it resumes from the "
                          "last state written)")
        else:
            self.written = job.number
            notify(Written(number=job.number, bytes=written))
