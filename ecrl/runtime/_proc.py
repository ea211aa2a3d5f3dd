"""Process lifetime helpers (Linux; elsewhere they do nothing)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeAlias, cast

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
NAME_BYTES = 15
"""The longest process name Linux keeps (``/proc/PID/comm``; 16 bytes with the NUL)."""


def signal_on_parent_death(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent exits.

    Called in a child (``preexec_fn`` or at start-up), so that a parent killed outright never
    leaves an orphan doing its work. Returns whether the request was made.
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    return False


def name_process(name: str) -> bool:
    """Set this process's name as ``ps``, ``top`` and ``/proc/PID/comm`` show it (at most
    :data:`NAME_BYTES` bytes: longer names are refused, not cut). Returns whether it was set.

    A process forked without ``exec`` keeps its parent's command line and initial environment
    in ``/proc``; its name is the one thing about it that it can change there."""
    encoded = name.encode()
    if len(encoded) > NAME_BYTES:
        raise ValueError(f"process name {name!r} is longer than {NAME_BYTES} bytes")
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0) == 0
    return False


def as_started(signum: int) -> Any:
    """The disposition a new Python interpreter gives ``signum``."""
    if signum == signal.SIGINT:
        return signal.default_int_handler
    if signum in (signal.SIGPIPE, signal.SIGXFSZ):
        return signal.SIG_IGN
    return signal.SIG_DFL


def restore_started_signals(signals: Iterable[int] | None = None) -> None:
    """Give ``signals`` (default: every signal with a handler set from Python) the dispositions
    a new interpreter starts with: a fork inherits its parent's handlers, which would run the
    parent's code in the child."""
    for signum in signal.valid_signals() if signals is None else signals:
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            current = signal.getsignal(signum)
            wanted = as_started(signum)
            if current is not None and current != wanted:
                signal.signal(signum, wanted)


class ForkedProcess:
    """The parent's handle on a child made by :func:`fork_process`: the part of
    :class:`subprocess.Popen`'s interface a supervisor uses (``pid``, ``returncode``, ``poll``,
    ``wait``, ``send_signal``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 255
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (``-N``: killed by signal N), as :meth:`subprocess.Popen.wait`;
        :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, 0.05)
        return cast(int, self.returncode)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # a reaped pid may already be another process's
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def kill_process_group(leader: int) -> None:
    """SIGKILL what is left of the process group ``leader`` led (a child started in a session
    of its own), if anything."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)


ChildProcess: TypeAlias = "subprocess.Popen[bytes] | ForkedProcess"
"""A started child: a new interpreter, or a fork of this one (:func:`fork_process`)."""


def can_fork_safely() -> bool:
    """Whether this process may fork a child that goes on running Python and later starts CUDA:
    Linux, no other Python thread (a fork keeps only the calling thread, and a lock another
    one held, the import lock or a stream's, stays held in the child), and no CUDA started here
    (a fork cannot use it, nor the forks of that fork).

    Native threads are allowed: the pools of the libraries a supervisor loads stop themselves
    around a fork (OpenBLAS, which NumPy starts at import, registers ``pthread_atfork``
    handlers for that), and a supervisor runs no OpenMP region, whose pool would not."""
    if not sys.platform.startswith("linux") or threading.active_count() != 1:
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return not (cuda is not None and cuda.is_initialized())


def fork_process(body: Callable[[], int | None], *, env: Mapping[str, str],
                 output: Path) -> ForkedProcess:
    """Run ``body`` in a forked child, as if it were a new interpreter's ``python -m`` started by
    :class:`subprocess.Popen` with ``env``, stdin from ``/dev/null``, stdout and stderr appended
    to ``output``, a session of its own, and SIGTERM when this process dies. The child skips the
    interpreter's start-up and every import this process already made; the caller checks
    :func:`can_fork_safely` first.

    The child's exit code is ``body``'s return value (None: 0), a :class:`SystemExit`'s code, or
    1 after an uncaught exception (printed by ``sys.excepthook``). It never returns into the
    caller's code: its own exit handlers run, the parent's do not.
    """
    for stream in (sys.stdout, sys.stderr):  # what is buffered would be written twice
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    parent = os.getpid()
    # Signals wait until the child has a new interpreter's dispositions: a SIGTERM sent the
    # moment it exists would otherwise run this process's handler there (the supervisor's,
    # which only notes a stop request), and the child would go on.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(log)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(log)
        return ForkedProcess(pid)
    code = 1
    try:
        code = _child(body, env, log, parent, mask)
    finally:
        os._exit(code)


def _child(body: Callable[[], int | None], env: Mapping[str, str], log: int, parent: int,
           mask: set[int | signal.Signals]) -> int:
    # What the parent made stays out of the collector: an object of the parent's collected here
    # would close a file number this child may have opened again for something else.
    gc.freeze()
    os.setsid()
    signal_on_parent_death(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request was made
        return 1
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    restore_started_signals()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    keep = {0, 1, 2}
    for name in os.listdir("/proc/self/fd"):  # what subprocess's close_fds does
        if int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True,
                                  line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                  line_buffering=True, errors="backslashreplace")
    os.environ.clear()
    os.environ.update(env)
    atexit._clear()  # the parent's exit handlers (files it owns, its finalizers) are its own
    try:
        try:
            result = body()
            code = 0 if result is None else int(result)
        except SystemExit as exc:
            code = _exit_status(exc.code)
        except BaseException as exc:  # the end an interpreter gives an uncaught exception
            sys.excepthook(type(exc), exc, exc.__traceback__)
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def _exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives an interpreter."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
