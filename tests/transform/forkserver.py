"""Torch programs of the kill harness, started by ``fork`` from a process that imported torch.

Every attempt of a torch program used to be a new interpreter that imports torch and what its
first optimizer step imports (``torch._dynamo``): about 3 s of CPU before the program's first
line, the same every time, and most of what the transform tests spent on torch programs. The
server here pays it once per test process; each attempt is then a ``fork`` of it that runs the
driver (:data:`transform._testing.drive.DRIVER`) in the attempt's own directory and environment.

What the program sees is what the driver gives it in a new interpreter: torch and
``torch._dynamo`` loaded before its own imports run, its ``cwd``, ``argv`` and environment, its
stdin empty, its stdout and stderr pipes to the harness. It is a real process of its own, and the
harness kills it with a real SIGKILL. Two things are shared by every attempt of one server, where
new interpreters would each draw their own: the seed of ``str`` hashing and NumPy's global random
state — a program whose output depended on either could not match its uninterrupted run anyway.

The server is used only where that is all that differs: a program that imports torch, an
environment equal to the server's but for the ECRL variables and ``RANK``/``PYTHONUNBUFFERED``,
and a server with no Python thread but its main one (a fork copies only the forking thread;
NumPy's BLAS pool, started by the import, is rebuilt in the child by its own fork handlers, which
is what the DataLoader's forked workers rely on too); anything else is started
with :class:`subprocess.Popen` as before. One attempt runs per server at a time (the harness
runs its attempts one after another); a second concurrent request also falls back to ``Popen``.
``ECRL_TEST_FRESH_INTERPRETERS=1`` turns the server off (``make test-long`` runs that way).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from transform._testing.drive import DRIVER

__all__ = ["FRESH_ENV", "imports_torch", "popen", "run"]

_SERVER = r"""
import json, os, socket, struct, sys
channel = socket.socket(fileno=int(sys.argv[1]))
import torch, torch._dynamo  # what the driver loads before a torch program's own imports
import threading
channel.sendall(struct.pack("q", threading.active_count()))
while True:
    message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
    if not message:
        break
    request = json.loads(message)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        channel.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-c", *request["argv"]]
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        os._exit(1)  # the driver ends with os._exit: never reached
    for fd in fds:
        os.close(fd)
    channel.sendall(struct.pack("q", pid))
    _, status = os.waitpid(pid, 0)
    channel.sendall(struct.pack("q", os.waitstatus_to_exitcode(status)))
"""

FRESH_ENV = "ECRL_TEST_FRESH_INTERPRETERS"
"""Set (``make test-long`` sets it): every attempt a new interpreter, as before the server."""

# May differ between the server and an attempt: torch reads none of them at import.
_PER_ATTEMPT = ("RANK", "PYTHONUNBUFFERED")


def imports_torch(program: Path) -> bool:
    """Whether ``program`` imports torch (its attempts are what the server is for)."""
    return "import torch" in program.read_text()


def _fixed(env: dict[str, str]) -> dict[str, str]:
    """What of an environment must be the server's for an attempt to be forked from it."""
    return {k: v for k, v in env.items() if not k.startswith("ECRL_") and k not in _PER_ATTEMPT}


class _Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.key = _fixed(env)
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(theirs.fileno())],
                                     env=env, pass_fds=[theirs.fileno()],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        theirs.close()
        threads, = struct.unpack("q", self.channel.recv(8))
        self.usable = threads == 1
        self.busy = threading.Lock()

    def alive(self) -> bool:
        return self.usable and self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()


_servers: list[_Server] = []
_lock = threading.Lock()


def _close_all() -> None:
    for server in _servers:
        server.close()


atexit.register(_close_all)


def _server_for(env: dict[str, str]) -> _Server | None:
    """The free server for ``env``, started on first use; None (then Popen) when it is busy,
    or unusable or gone (never started again: each start imports torch)."""
    key = _fixed(env)
    with _lock:
        server = next((s for s in _servers if s.key == key), None)
        if server is None:
            server = _Server(env)
            _servers.append(server)
        return server if server.alive() and server.busy.acquire(blocking=False) else None


class ForkedProcess:
    """The part of :class:`subprocess.Popen` the harness uses, for an attempt forked by the
    server (text pipes for stdout and stderr)."""

    def __init__(self, server: _Server, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.args = argv
        self.returncode: int | None = None
        self._server = server
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        request = {"code": argv[2], "argv": argv[3:], "cwd": str(cwd), "env": env}
        try:
            socket.send_fds(server.channel, [json.dumps(request).encode()], [null, out_w, err_w])
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        self.pid, = struct.unpack("q", server.channel.recv(8))
        self.stdout: IO[str] = open(out_r)  # noqa: SIM115 - read and closed by the harness
        self.stderr: IO[str] = open(err_r)  # noqa: SIM115

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._server.channel.settimeout(None if timeout is None else max(timeout, 0.0))
            try:
                data = self._server.channel.recv(8)
            except (TimeoutError, BlockingIOError):  # BlockingIOError: timeout 0, not done
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            finally:
                self._server.channel.settimeout(None)
            if len(data) != 8:
                raise RuntimeError(f"the fork server died before reporting attempt {self.pid}")
            self.returncode, = struct.unpack("q", data)
            self._server.busy.release()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not yet reaped by the server: the pid is still ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=lambda: out.append(self.stdout.read()), daemon=True),
                   threading.Thread(target=lambda: err.append(self.stderr.read()), daemon=True)]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join()
        self.stdout.close()
        self.stderr.close()
        return "".join(out), "".join(err)


def popen(argv: list[str], *, cwd: Path, env: dict[str, str], **kwargs: Any) -> Any:
    """:class:`subprocess.Popen` (``kwargs``: its pipes, text mode), or for the driver's
    ``[python, "-c", DRIVER, program, *args]`` of a torch program a fork of the server when it
    can (stdout and stderr text pipes, as the harness asks of Popen)."""
    if argv[1:3] == ["-c", DRIVER] and imports_torch(Path(cwd, argv[3])) and \
            not os.environ.get(FRESH_ENV):
        server = _server_for(env)
        if server is not None:
            try:
                return ForkedProcess(server, argv, cwd, env)
            except BaseException:
                server.busy.release()
                raise
    return subprocess.Popen(argv, cwd=cwd, env=env, **kwargs)


def run(program: Path, *, cwd: Path, env: dict[str, str],
        timeout: float) -> subprocess.CompletedProcess[str]:
    """``python program`` to its end (or ``timeout``, then SIGKILL), through the driver: what
    it printed, and its status. The driver's ``ready`` line is not part of its stderr."""
    proc = popen([sys.executable, "-c", DRIVER, str(program)], cwd=cwd, env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    err = err.removeprefix("ready\n")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
