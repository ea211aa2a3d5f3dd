"""Run a program in its own process and time its work, not its imports (tests and benchmarks).

``python -c DRIVER program.py`` imports the program's top-level imports (and, when torch is
among them, what torch imports lazily on its first optimizer: about 900 modules), writes
``ready`` on stderr, then runs the program as ``__main__``. :class:`DrivenRun` starts its clock
at ``ready``: interpreter start-up and imports (seconds for torch, and noisy on a shared
machine) are not the program's work. The kill-and-resume harness starts its kill clock there too,
so a kill can land anywhere in the program itself — reading the resume state, the walk back,
the work, the exit handlers (where a transformed program finishes its writes and removes its
resume state).

The program's stdout is line-buffered (a pipe would buffer it by blocks): whatever a killed
attempt printed before the kill reaches the harness, which judges it against the original's
output too.

The driver ends the process the way the interpreter does — an uncaught exception goes to
``sys.excepthook`` and exits 1, ``SystemExit`` gives its status, then the ``atexit`` handlers run
— and then leaves with ``os._exit``, skipping the interpreter's teardown of its modules: for torch
that is about 0.6 s of freeing memory, the same for every program, and no part of its work. Left
in, it was half of a small fixture's yardstick, so a random kill could never let the last attempt
finish.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["DRIVER", "DrivenRun"]

DRIVER = """
import ast, runpy, sys
src = sys.argv[1]
tree = ast.parse(open(src, "rb").read())
imports = [s for s in tree.body if isinstance(s, ast.Import)
           or isinstance(s, ast.ImportFrom) and s.module != "__future__"]
exec(compile(ast.Module(imports, []), src, "exec"), {})
if "torch" in sys.modules:
    import torch._dynamo
sys.stderr.write("ready\\n")
sys.stderr.flush()
sys.argv = sys.argv[1:]
sys.stdout.reconfigure(line_buffering=True)
import atexit, os
try:
    runpy.run_path(src, run_name="__main__")
    status = 0
except SystemExit as stop:
    if stop.code is None or isinstance(stop.code, int):
        status = stop.code or 0
    else:
        print(stop.code, file=sys.stderr)
        status = 1
except BaseException:
    sys.excepthook(*sys.exc_info())
    status = 1
sys.stdout.flush()
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"""


class DrivenRun:
    """One driven process: wait for ``ready``, then for exit or a deadline (then SIGKILL)."""

    def __init__(self, program: Path, cwd: Path, env: dict[str, str],
                 args: tuple[str, ...] = (), *,
                 popen: Callable[..., subprocess.Popen[str]] = subprocess.Popen) -> None:
        # ``popen``: how the process starts (the tests fork torch programs from a process that
        # imported torch once: tests/transform/forkserver.py)
        self.proc = popen([sys.executable, "-c", DRIVER, str(program), *args],
                          cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self.ready = threading.Event()
        self.started = 0.0
        self._reader = threading.Thread(target=self._read_err, daemon=True)
        self._reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if line == "ready\n" and not self.ready.is_set():
                self.started = time.perf_counter()
                self.ready.set()
                continue
            self.err.append(line)
        self.ready.set()  # ended before being ready: let the waiter see the failure

    def wait_ready(self, timeout: float) -> None:
        if not self.ready.wait(timeout):
            self.kill()
            raise TimeoutError(f"the program did not finish its imports in {timeout} s")

    def finish(self, timeout: float | None) -> tuple[str, bool, float]:
        """(stdout, killed, seconds since ready): wait up to ``timeout``, then SIGKILL."""
        out: list[str] = []
        stdout = self.proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: out.append(stdout.read()), daemon=True)
        reader.start()
        try:
            self.proc.wait(timeout=timeout)
            killed = False
        except subprocess.TimeoutExpired:
            self.kill()
            killed = True
        ended = time.perf_counter()
        reader.join()
        self._reader.join()
        return "".join(out), killed, ended - (self.started or ended)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    @property
    def stderr(self) -> str:
        return "".join(self.err)
