"""Ranks of ``ecrl run`` forked from torchrun's agent (``ecrl.runtime.trainer.agent``): the rank
entry behaves as the new interpreter it replaces, and a rank is found by its name and the
torchrun log it writes to (its ``/proc`` command line and environment are the agent's, or the
supervisor's when the agent is forked from it)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ecrl.contract.runformat import RunPaths
from ecrl.runtime._proc import name_process
from ecrl.runtime.settings import SupervisorSettings
from ecrl.runtime.supervision.command import TRAINER, rank_pids, torchrun_command
from ecrl.runtime.supervision.standby import STANDBY_DIR
from ecrl.runtime.trainer.agent import RANK_ENTRY

# One interpreter imports the trainer, then forks a child per case, as the agent does: in each,
# torchrun's handlers are installed (SIGTERM and SIGINT raise), a stand-in takes the trainer's
# `main`, and the rank entry runs as torchrun's --run-path runs it.
CASES = """
import json, os, runpy, signal, sys
import ecrl.runtime.trainer.trainer as trainer

def torchruns_handler(signum, frame):
    raise RuntimeError(f"torchrun's handler got {signum}")

def dispositions():
    return {s.name: (signal.getsignal(s) is signal.SIG_DFL) for s in
            (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)} | {
        "SIGINT_raises_KeyboardInterrupt": signal.getsignal(signal.SIGINT)
            is signal.default_int_handler}

def ok():
    print(json.dumps({"dispositions": dispositions(),
                      "name": open("/proc/self/comm").read().strip()}), flush=True)
    return 0

def fails():
    raise ValueError("the trainer broke")

def interrupted():
    raise KeyboardInterrupt

def exits():
    return 75

results = {}
for case in ("ok", "fails", "interrupted", "exits"):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(write, 1)
        os.dup2(write, 2)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(s, torchruns_handler)
        os.environ["RANK"] = "3"
        if case == "ok":  # an agent told to handle one more signal: the rank gets it back too
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
            signal.signal(signal.SIGUSR1, torchruns_handler)
        trainer.main = globals()[case]
        try:
            runpy.run_path(sys.argv[1], run_name="__main__")
        except SystemExit as exc:
            os._exit(exc.code if isinstance(exc.code, int) else 99)
        os._exit(98)
    os.close(write)
    output = b""
    while chunk := os.read(read, 65536):
        output += chunk
    _, status = os.waitpid(pid, 0)
    results[case] = {"exit": os.waitstatus_to_exitcode(status),
                     "output": output.decode(errors="replace")}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def entry_cases() -> dict[str, dict[str, object]]:
    out = subprocess.run([sys.executable, "-c", CASES, RANK_ENTRY], capture_output=True,
                         text=True, timeout=300, check=True)
    cases: dict[str, dict[str, object]] = json.loads(out.stdout.splitlines()[-1])
    return cases


def test_a_forked_rank_gets_an_interpreters_signals_back_and_its_name(
        entry_cases: dict[str, dict[str, object]]) -> None:
    ok = entry_cases["ok"]
    assert ok["exit"] == 0
    report = json.loads(str(ok["output"]).strip().splitlines()[-1])
    assert report["dispositions"] == {"SIGTERM": True, "SIGHUP": True, "SIGQUIT": True,
                                      "SIGUSR1": True, "SIGINT_raises_KeyboardInterrupt": True}
    assert report["name"] == "ecrl rank 3"


def test_an_uncaught_exception_is_printed_and_exits_1_as_an_interpreter_would(
        entry_cases: dict[str, dict[str, object]]) -> None:
    fails = entry_cases["fails"]
    assert fails["exit"] == 1
    output = str(fails["output"])
    assert output.startswith("Traceback (most recent call last):")
    assert output.rstrip().endswith("ValueError: the trainer broke")


def test_an_interrupt_ends_the_rank_by_sigint_not_as_a_success(
        entry_cases: dict[str, dict[str, object]]) -> None:
    interrupted = entry_cases["interrupted"]
    assert interrupted["exit"] == -signal.SIGINT
    assert "KeyboardInterrupt" in str(interrupted["output"])


def test_the_trainers_exit_code_is_the_ranks(
        entry_cases: dict[str, dict[str, object]]) -> None:
    assert entry_cases["exits"]["exit"] == 75


def test_only_the_builtin_trainer_runs_forked() -> None:
    paths = RunPaths.of(Path("/tmp/run"))
    forked = torchrun_command(SupervisorSettings(), paths, 0, 2, TRAINER)
    assert forked[1:3] == ["-m", "ecrl.runtime.trainer.agent"]
    assert forked[-4:] == ["--start-method", "fork", "--run-path", RANK_ENTRY]
    script = torchrun_command(SupervisorSettings(), paths, 0, 2, ("train.py", "--lr", "1"))
    assert script[1:3] == ["-m", "torch.distributed.run"]
    assert script[-3:] == ["train.py", "--lr", "1"] and "fork" not in script


PRELOAD = """
import json, sys, threading
from ecrl.runtime.trainer.agent import preload
torchrun = preload()
import torch
print(json.dumps({"cuda_initialized": torch.cuda.is_initialized(),
                  "threads": threading.active_count(),
                  "trainer": "ecrl.runtime.trainer.trainer" in sys.modules,
                  "torchrun": f"{torchrun.__module__}.{torchrun.__name__}"}))
"""


def test_the_agent_forks_after_imports_that_start_no_device_and_no_thread() -> None:
    # A fork keeps one thread (a lock another held stays held in the child), and a CUDA
    # started before the fork cannot be used in it.
    out = subprocess.run([sys.executable, "-c", PRELOAD], capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout) == {"cuda_initialized": False, "threads": 1, "trainer": True,
                                      "torchrun": "torch.distributed.run.main"}


SLEEPER = """
import sys, time
from ecrl.runtime._proc import name_process
assert name_process(sys.argv[1])
print("named", file=sys.stderr, flush=True)
time.sleep(60)
"""


def _named(name: str, output: Path) -> subprocess.Popen[str]:
    """A process named ``name`` whose standard output is ``output`` (a rank's is its agent's
    torchrun log, inherited)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", SLEEPER, name], stdout=log,
                                stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None and proc.stderr.readline() == "named\n"
    return proc


def test_ranks_are_found_by_name_and_the_torchrun_log_they_write_to(tmp_path: Path) -> None:
    root, other = tmp_path / "run", tmp_path / "other"
    paths = RunPaths.of(root)
    standby_log = root / STANDBY_DIR / "attempt-004.torchrun.log"
    moved = root / STANDBY_DIR / "attempt-006.torchrun.log"
    procs = {
        (2, 1): _named("ecrl rank 1", paths.attempt_dir(2) / "torchrun.log"),
        (3, 0): _named("ecrl rank 0", paths.attempt_dir(3) / "torchrun-node-1.log"),
        (4, 0): _named("ecrl rank 0", standby_log),
        (6, 1): _named("ecrl rank 1", moved),
        "other run": _named("ecrl rank 0", RunPaths.of(other).attempt_dir(2) / "torchrun.log"),
        "not a rank": _named("python", paths.attempt_dir(5) / "torchrun.log"),
        "not a log": _named("ecrl rank 0", paths.attempt_dir(5) / "rank-000.jsonl"),
    }
    # A standby used: its log moves into the attempt's folder, the rank's output with it.
    paths.attempt_dir(6).mkdir(parents=True)
    moved.rename(paths.attempt_dir(6) / "torchrun.log")
    try:
        found = rank_pids(root)
        assert found == {key: procs[key].pid for key in ((2, 1), (3, 0), (4, 0), (6, 1))}
        assert rank_pids(other) == {(2, 0): procs["other run"].pid}
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 10
    while rank_pids(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank_pids(root) == {}


def test_a_name_longer_than_linux_keeps_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 15 bytes"):
        name_process("ecrl rank 1234567")
