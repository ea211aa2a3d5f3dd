"""The background checkpoint writer: a separate process that only hashes and writes files.

Why a process and not a thread: the training process holds the GIL for long stretches of Python
(optimizer loops, data preparation) and is often killed on purpose; a separate process writes in
parallel on another core and never touches torch, CUDA or ``torch.distributed`` (it does not even
import torch, so it starts in milliseconds and costs a few megabytes).

How bytes travel: the trainer owns ``max_inflight`` *slots*, anonymous shared-memory files
(``memfd_create``) that it maps and fills with the checkpoint image
(:mod:`ecrl.runtime.checkpoint.statepack` lays the image out exactly as the file, so there is no
serialisation step). Slots are created before the first checkpoint is due and their descriptors
passed to the writer (``SCM_RIGHTS``), which maps them with ``MAP_POPULATE``: the pages are
allocated on the writer's core, not as page faults inside the first snapshot. A job is then a small
JSON message naming a slot. The writer seals, writes and publishes the checkpoint with
:func:`ecrl.runtime.checkpoint.persist.commit_checkpoint`, in job order, so ``latest.json`` only
moves forward and only to durable files. A slot is busy from
the snapshot until the writer reports the job done; when every slot is busy the trainer waits
(back-pressure), which bounds both memory and how far the durable state may lag behind training.

Messages, trainer → writer: ``slot`` (its descriptor follows), ``write`` (job, slot, size, step
geometry, snapshot and back-pressure seconds), ``timing`` (the job's enqueue and stall seconds,
known only after the post-checkpoint barrier), ``flush``, ``exit``. Writer → trainer: ``done``
(job, commit result), ``flushed``, ``error``. The writer appends a job's checkpoint event once
the file is durable and the job is timed, and only then publishes ``latest.json``.

Lifetime: the writer dies with the trainer. It asks the kernel for SIGKILL when its parent exits
(``PR_SET_PDEATHSIG``) and exits on end-of-file from the socket, so a killed trainer never leaves
a writer that publishes a checkpoint under the next attempt's feet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from ecrl.contract.ckptfile import FOOTER_SIZE, CheckpointError
from ecrl.contract.runformat import CheckpointEvent, JsonlWriter, RunPaths
from ecrl.runtime._proc import signal_on_parent_death
from ecrl.runtime.checkpoint.digests import image_digests
from ecrl.runtime.checkpoint.persist import (
    CommitResult,
    CrashHook,
    checkpoint_name,
    commit_checkpoint,
)
from ecrl.runtime.failure import RestartableError, disk_error

__all__ = ["WriterCrashed", "Slot", "WriterClient", "main"]

_SLOT_GRANULE = 1 << 20
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class WriterCrashed(RestartableError):
    """The writer process vanished (killed, crashed): the attempt fails and is restarted."""


@dataclass(slots=True)
class Slot:
    """One shared-memory buffer the trainer fills and the writer reads."""

    key: int
    """Stable name of the slot in messages."""
    fd: int
    capacity: int
    buffer: mmap.mmap
    job: int | None = None
    """Job currently using the slot (None: free)."""
    last_used: int = -1

    def view(self) -> memoryview:
        return memoryview(self.buffer)


def _new_shared_fd(name: str) -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
    import tempfile  # non-Linux: an unlinked temporary file serves the same purpose

    fd, path = tempfile.mkstemp(prefix=f"{name}-")
    os.unlink(path)
    return fd


@dataclass(slots=True)
class _Pending:
    job: int
    slot: Slot
    global_step: int


@dataclass(slots=True)
class WriterClient:
    """The trainer's handle on its writer process (rank 0 only)."""

    process: subprocess.Popen[bytes]
    conn: Connection
    max_inflight: int
    slots: list[Slot] = field(default_factory=list)
    pending: dict[int, _Pending] = field(default_factory=dict)
    completed: list[dict[str, Any]] = field(default_factory=list)
    next_job: int = 0

    @classmethod
    def start(cls, *, run_dir: str, attempt: int, keep: int, max_inflight: int, strategy: str,
              nice: int = 19) -> WriterClient:
        """``strategy``: the registry's name of the strategy it writes for, as its events say."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", "ecrl.runtime.checkpoint.bgwriter", "--fd",
        str(theirs.fileno()),
               "--run-dir", run_dir, "--attempt", str(attempt), "--keep", str(keep),
               "--strategy", strategy, "--parent", str(os.getpid()), "--nice", str(nice)]
        process = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        conn = Connection(ours.detach())
        client = cls(process=process, conn=conn, max_inflight=max_inflight)
        client._expect("ready", timeout=60.0)
        return client

    # --- receiving -----------------------------------------------------------------------------

    def _recv(self, timeout: float | None) -> dict[str, Any] | None:
        try:
            if timeout is not None and not self.conn.poll(timeout):
                return None
            message: dict[str, Any] = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            code = self.process.poll()
            raise WriterCrashed(
                f"the background checkpoint writer exited unexpectedly (exit code {code})"
            ) from None
        return self._take(message)

    def _take(self, message: dict[str, Any]) -> dict[str, Any]:
        if message["op"] == "error":
            raise CheckpointError(f"background checkpoint writer: {message['message']}")
        if message["op"] == "done":
            self.pending.pop(message["job"]).slot.job = None
            self.completed.append(message)
        return message

    def _expect(self, op: str, *, timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = self._recv(left)
            if message is None:
                raise WriterCrashed(f"the background checkpoint writer sent no {op!r} in time")
            if message["op"] == op:
                return message

    def poll(self) -> None:
        """Take in every message already waiting (frees slots, collects completions)."""
        while self._recv(0.0) is not None:
            pass

    # --- slots ---------------------------------------------------------------------------------

    def _new_slot(self, key: int, capacity: int) -> Slot:
        fd = _new_shared_fd(f"ecrl-slot-{key}")
        os.ftruncate(fd, capacity)
        slot = Slot(key=key, fd=fd, capacity=capacity, buffer=mmap.mmap(fd, capacity))
        # The writer maps the slot with MAP_POPULATE, which allocates its pages on the writer's
        # core now instead of as page faults during the first snapshot (0.4 s for 200 MB here).
        self._send({"op": "slot", "slot": key, "capacity": capacity})
        try:
            reduction.send_handle(self.conn, fd, self.process.pid)
        except OSError:
            self._gone()
        return slot

    @staticmethod
    def _capacity(size: int) -> int:
        need = size + FOOTER_SIZE
        return -(-(need + need // 8) // _SLOT_GRANULE) * _SLOT_GRANULE

    def prepare(self, size: int) -> None:
        """Create every slot for checkpoints of about ``size`` bytes ahead of the first one."""
        while len(self.slots) < self.max_inflight:
            self.slots.append(self._new_slot(len(self.slots), self._capacity(size)))

    def acquire(self, size: int) -> tuple[Slot, float]:
        """A free slot of at least ``size + FOOTER_SIZE`` bytes, and the seconds waited for one.

        Prefers the most recently freed slot, so an idle writer keeps reusing one warm buffer.
        """
        self.poll()
        t0 = time.perf_counter()
        while True:
            free = [s for s in self.slots if s.job is None]
            if free:
                slot = max(free, key=lambda s: s.last_used)
                break
            if len(self.slots) < self.max_inflight:
                slot = self._new_slot(len(self.slots), self._capacity(size))
                self.slots.append(slot)
                break
            self._recv(None)  # back-pressure: every slot is in flight
        waited = time.perf_counter() - t0
        if slot.capacity < size + FOOTER_SIZE:  # the state grew: replace the slot
            grown = self._new_slot(slot.key, self._capacity(size))
            slot.buffer.close()
            os.close(slot.fd)
            self.slots[self.slots.index(slot)] = grown
            slot = grown
        slot.last_used = self.next_job
        return slot, waited

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.conn.send_bytes(json.dumps(message).encode())
        except OSError:
            self._gone()

    def _gone(self) -> NoReturn:
        """The writer closed its end. If it said why first (a full disk), that is the error."""
        with contextlib.suppress(EOFError, OSError, ValueError):
            while self.conn.poll(0):
                self._take(json.loads(self.conn.recv_bytes()))  # raises on its error message
        raise WriterCrashed("the background checkpoint writer is gone")

    def submit(self, slot: Slot, *, size: int, global_step: int, epoch: int, cursor_step: int,
               world_size: int, snapshot_s: float, backpressure_s: float) -> int:
        """Hand a filled slot to the writer; returns the job id."""
        job = self.next_job
        self.next_job += 1
        self._send({"op": "write", "job": job, "slot": slot.key, "size": size,
                    "global_step": global_step, "epoch": epoch, "cursor_step": cursor_step,
                    "world_size": world_size, "snapshot_s": snapshot_s,
                    "backpressure_s": backpressure_s})
        slot.job = job
        self.pending[job] = _Pending(job=job, slot=slot, global_step=global_step)
        return job

    def send_timing(self, job: int, *, enqueue_s: float, stall_s: float,
                    extra: dict[str, Any] | None = None) -> None:
        """The job's timing, known after the boundary; ``extra`` joins its checkpoint event."""
        self._send({"op": "timing", "job": job, "enqueue_s": enqueue_s, "stall_s": stall_s,
                    "extra": extra or {}})

    @property
    def inflight(self) -> int:
        return len(self.pending)

    def flush(self) -> None:
        """Wait until every submitted checkpoint is durable and recorded."""
        self._send({"op": "flush"})
        self._expect("flushed", timeout=None)

    def close(self) -> None:
        """Flush, then stop the writer process."""
        self.flush()
        with contextlib.suppress(OSError):
            self.conn.send_bytes(json.dumps({"op": "exit"}).encode())
        self.process.wait(timeout=60)
        self.conn.close()
        for slot in self.slots:
            slot.buffer.close()
            os.close(slot.fd)


# --- the writer process ------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    signal_on_parent_death(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(0)


class _TrainerGone(Exception):
    """End of file from the trainer: it exited or was killed."""


def _serve(conn: Connection, paths: RunPaths, *, attempt: int, keep: int,
           strategy: str) -> None:
    crash = CrashHook.from_env(attempt=attempt)
    buffers: dict[int, mmap.mmap] = {}
    timings: dict[int, dict[str, Any]] = {}
    events = JsonlWriter(paths.checkpoint_log(attempt))

    def receive() -> dict[str, Any]:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            raise _TrainerGone from None
        msg: dict[str, Any] = json.loads(raw)
        if msg["op"] == "slot":
            fd = reduction.recv_handle(conn)
            if msg["slot"] in buffers:
                buffers[msg["slot"]].close()
            buffers[msg["slot"]] = mmap.mmap(fd, msg["capacity"], flags=_MAP_FLAGS)
            os.close(fd)
        elif msg["op"] == "timing":
            timings[msg["job"]] = msg
        return msg

    def write(msg: dict[str, Any], received: float) -> None:
        job, started = msg["job"], time.perf_counter()
        # Per-object state digests, from the image itself: here, off the training path.
        digests = image_digests(memoryview(buffers[msg["slot"]])[:msg["size"]])
        digest_s = time.perf_counter() - started

        def record(written: CommitResult) -> None:
            # The event must be on disk before latest.json names the checkpoint (persist.py),
            # and it needs the stall the trainer measures after its barrier: the trainer sends
            # that right after submitting, so it is normally here already. The messages that
            # can precede it are slot announcements; a trainer that dies first publishes nothing.
            while job not in timings:
                receive()
            timing = timings.pop(job)
            events.write(CheckpointEvent(
                global_step=msg["global_step"], strategy=strategy,
                snapshot_s=msg["snapshot_s"], write_s=written.write_s,
                enqueue_s=timing["enqueue_s"], backpressure_s=msg["backpressure_s"],
                stall_s=timing["stall_s"], bytes=written.bytes, path=written.path,
                extra={"queue_s": started - received, "attempt": attempt,
                       "digest_s": digest_s, "digests": digests, **timing.get("extra", {})},
            ))

        try:
            result = commit_checkpoint(
                paths, memoryview(buffers[msg["slot"]]), msg["size"],
                global_step=msg["global_step"], epoch=msg["epoch"],
                cursor_step=msg["cursor_step"], world_size=msg["world_size"], keep=keep,
                crash=crash, before_publish=record)
        except OSError as exc:
            why = disk_error(exc, paths.checkpoints / checkpoint_name(msg["global_step"])) or \
                f"{exc.strerror or exc} ({exc.filename or paths.checkpoints})"
            conn.send_bytes(json.dumps({
                "op": "error", "job": job,
                "message": f"writing the checkpoint of step {msg['global_step']} failed: {why}",
            }).encode())
            raise _TrainerGone from None
        conn.send_bytes(json.dumps({
            "op": "done", "job": job, "global_step": msg["global_step"],
            "path": result.path, "checksum": result.checksum, "bytes": result.bytes,
            "write_s": result.write_s, "publish_s": result.publish_s,
        }).encode())

    conn.send_bytes(b'{"op": "ready"}')
    try:
        while True:
            msg = receive()
            op = msg["op"]
            if op == "write":
                write(msg, time.perf_counter())
            elif op == "flush":
                conn.send_bytes(b'{"op": "flushed"}')
            elif op == "exit":
                events.close()
                return
    except _TrainerGone:
        return  # the trainer is gone (or the disk failed): never publish anything after it


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecrl.runtime.checkpoint.bgwriter")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--nice", type=int, default=19)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    # Signals meant for the trainer's process group (torchrun's SIGTERM on teardown) end us too,
    # quietly; Ctrl-C is the supervisor's business.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        # Lowest CPU priority: where the writer has to share a core with training, training
        # keeps almost all of it; on an idle core the writer runs at full speed.
        os.nice(args.nice)
    conn = Connection(args.fd)
    _serve(conn, RunPaths.of(args.run_dir), attempt=args.attempt, keep=args.keep,
           strategy=args.strategy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
