"""``ecrl.runtime._proc.fork_process``: a forked child that behaves as the new interpreter
``subprocess.Popen`` would have started (the supervisor forks each attempt's agent from itself).

The forks run in an interpreter of their own: the test worker has threads (a fork of it keeps
only one, with any lock another held still held)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CASES = r"""
import atexit, fcntl, json, os, signal, subprocess, sys, time
from pathlib import Path
from ecrl.runtime._proc import ForkedProcess, can_fork_safely, fork_process

folder = Path(sys.argv[1])
import threading
results = {"parent_can_fork": can_fork_safely(), "parent": os.getpid()}
release = threading.Event()
thread = threading.Thread(target=release.wait)
thread.start()
results["can_fork_beside_a_thread"] = can_fork_safely()
release.set()
thread.join()

# What the parent holds that a child must not: a locked file, a handler, an exit handler.
lock = open(folder / "lock", "wb")
fcntl.flock(lock, fcntl.LOCK_EX)
signal.signal(signal.SIGTERM, lambda s, f: print("parent's handler ran in", os.getpid()))
atexit.register(lambda: open(folder / "parent-exit-ran", "a").write(f"{os.getpid()}\n"))
print("buffered in the parent, written once", end="")
results["parent_read"] = sys.stdin.readline()  # the rest waits in sys.stdin's buffer

def child_view():
    atexit.register(lambda: print("the child's own exit handler ran"))
    # A stream object of the parent's, used in the child (a logging handler made earlier would):
    # what the parent had buffered in it is not the child's to write.
    sys.__stdout__.write("through the parent's stream object\n")
    sys.__stdout__.flush()
    lock_number = lock.fileno()
    try:
        os.fstat(lock_number)
        lock_open = True
    except OSError:
        lock_open = False
    print(json.dumps({
        "environ": dict(os.environ), "session_leader": os.getsid(0) == os.getpid(),
        "lock_open": lock_open, "stdin": sys.stdin.read(),
        "SIGTERM_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
        "SIGINT_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "SIGPIPE_ignored": signal.getsignal(signal.SIGPIPE) is signal.SIG_IGN}))
    return 7

def fails():
    raise ValueError("the body broke")

def run(name, body):
    output = folder / f"{name}.log"
    output.write_text("earlier line\n")
    proc = fork_process(body, env={"ONLY": "this"}, output=output)
    code = proc.wait(timeout=60)
    results[name] = {"exit": code, "output": output.read_text(), "poll": proc.poll()}

run("view", child_view)
run("fails", fails)
run("exits_with_text", lambda: sys.exit("stopped for a reason"))
run("exits_3", lambda: sys.exit(3))
run("returns_none", lambda: None)

# A child that sleeps: wait() times out, a signal ends it, the status says which.
sleeper = fork_process(lambda: time.sleep(60), env={}, output=folder / "sleeper.log")
try:
    sleeper.wait(timeout=0.2)
    results["timed_out"] = False
except subprocess.TimeoutExpired:
    results["timed_out"] = True
sleeper.send_signal(signal.SIGTERM)
results["sleeper"] = sleeper.wait(timeout=30)
sleeper.kill()  # reaped already: nothing is signalled

# Signalled the moment it exists, before it could have put its dispositions back: the
# parent's handler must not run there (it would print, and the child would sleep on).
for _ in range(20):
    quick = fork_process(lambda: time.sleep(60), env={}, output=folder / "quick.log")
    quick.send_signal(signal.SIGTERM)
    try:
        results.setdefault("signalled_at_once", []).append(quick.wait(timeout=5))
    except subprocess.TimeoutExpired:
        quick.kill()
        results.setdefault("signalled_at_once", []).append("went on")
        break
results["quick_output"] = (folder / "quick.log").read_text()
sys.stdout.flush()
lock.close()
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    folder = tmp_path_factory.mktemp("forks")
    # Its standard output block-buffered, as a pipe's is unless PYTHONUNBUFFERED says otherwise.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", CASES, str(folder)], capture_output=True,
                          text=True, timeout=300, env=env,
                          input="a line\nthe parent's input, not the child's")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    prefix = "buffered in the parent, written once"
    assert last.startswith(prefix)
    return json.loads(last.removeprefix(prefix)), proc.stdout, folder


def test_the_child_sees_only_its_environment_no_parents_file_and_no_parents_handler(
        forked: tuple[dict, str, Path]) -> None:
    results, _, _ = forked
    assert results["parent_can_fork"] is True and results["parent_read"] == "a line\n"
    assert results["can_fork_beside_a_thread"] is False
    view = results["view"]
    assert view["exit"] == 7 and view["poll"] == 7
    lines = view["output"].splitlines()
    assert lines[:2] == ["earlier line",  # appended, as Popen's log is
                         "through the parent's stream object"]
    seen = json.loads(lines[2])
    assert seen == {"environ": {"ONLY": "this"}, "session_leader": True, "lock_open": False,
                    "stdin": "", "SIGTERM_default": True, "SIGINT_raises": True,
                    "SIGPIPE_ignored": True}
    assert lines[3:] == ["the child's own exit handler ran"]


def test_the_parents_buffered_output_and_exit_handlers_stay_the_parents(
        forked: tuple[dict, str, Path]) -> None:
    results, stdout, folder = forked
    # Flushed before each fork: printed once, not once per child.
    assert stdout.count("buffered in the parent, written once") == 1
    # The parent's exit handler ran in the parent alone (a child's run would have left its pid).
    assert (folder / "parent-exit-ran").read_text() == f"{results['parent']}\n"


def test_an_uncaught_exception_and_sys_exit_end_as_in_an_interpreter(
        forked: tuple[dict, str, Path]) -> None:
    results, _, _ = forked
    fails = results["fails"]
    assert fails["exit"] == 1
    assert "Traceback (most recent call last):" in fails["output"]
    assert fails["output"].rstrip().endswith("ValueError: the body broke")
    assert results["exits_with_text"]["exit"] == 1
    assert results["exits_with_text"]["output"] == "earlier line\nstopped for a reason\n"
    assert results["exits_3"]["exit"] == 3
    assert results["returns_none"]["exit"] == 0


def test_wait_times_out_and_a_signal_is_reported_as_popen_does(
        forked: tuple[dict, str, Path]) -> None:
    results, _, _ = forked
    assert results["timed_out"] is True
    assert results["sleeper"] == -signal.SIGTERM


def test_a_signal_sent_the_moment_the_child_exists_has_a_new_interpreters_effect(
        forked: tuple[dict, str, Path]) -> None:
    results, _, _ = forked
    assert results["signalled_at_once"] == [-signal.SIGTERM] * 20
    assert results["quick_output"] == ""


ORPHANED = r"""
import os, sys, time
from pathlib import Path
from ecrl.runtime._proc import fork_process
def sleeps():
    print("started", flush=True)
    time.sleep(60)

log = Path(sys.argv[1])
child = fork_process(sleeps, env={}, output=log)
while "started" not in log.read_text():  # the child is past its start-up
    time.sleep(0.01)
print(child.pid, flush=True)
os._exit(0)  # the parent dies outright: no handler of its own stops the child
"""


def test_a_child_ends_when_its_parent_dies(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", ORPHANED, str(tmp_path / "child.log")],
                         capture_output=True, text=True, timeout=120, check=True)
    pid = int(out.stdout)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state in ("Z", "X"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
