"""Real ``ecrl run`` processes (torchrun, gloo, os._exit), shared between tests and workers.

Each run is expensive (every launch imports torch in three processes), so a run is made once per
``pytest`` session and shared by every test that inspects it, also across pytest-xdist workers: the
first worker to need a run makes it under a file lock, the others wait and reuse it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sessionshare import locked, made_once, session_dir

T = TypeVar("T")

RUN_TIMEOUT_S = 600

# Tiny settings: D=256 and B=8 give S=32 steps per epoch, so a 40-step run crosses an epoch.
TINY = ["--dataset-size", "256", "--global-batch", "8", "--steps", "40", "--ckpt-every", "4",
        "--seed", "7"]


@dataclass(frozen=True)
class Run:
    root: Path
    returncode: int
    stdout: str
    stderr: str


def ecrl(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ecrl.apps.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=full_env, timeout=timeout)


class RunCache:
    """Named runs, each made once for the whole session (all xdist workers)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, name: str, args: Sequence[str], *, env: dict[str, str] | None = None,
            command: str = "run") -> Run:
        directory = self.root / name
        result_file = self.root / f"{name}.result.json"
        with locked(self.root / f"{name}.lock"):
            if not result_file.exists():
                out = ["--out", str(directory)]
                proc = ecrl(command, *out, *args, env=env, cwd=self.root)
                result_file.write_text(json.dumps({
                    "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}))
        data = json.loads(result_file.read_text())
        return Run(root=directory, returncode=data["returncode"], stdout=data["stdout"],
                   stderr=data["stderr"])


def shared(runs: RunCache, name: str, make: Callable[[Path], T]) -> T:
    """``make(directory)`` once for the whole session, beside the runs (:func:`made_once`)."""
    return made_once(runs.root, name, make)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> RunCache:
    return RunCache(session_dir(tmp_path_factory, "ecrl-runs"))


def _made(run: Run) -> Run:
    assert run.returncode == 0, f"ecrl exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="session")
def reference_run(runs: RunCache) -> Run:
    """Uninterrupted, no checkpoints, world size 2, full IDs logged."""
    return _made(runs.get("reference", [*TINY, "--world-sizes", "2", "--strategy", "none",
                                        "--log-ids"]))


@pytest.fixture(scope="session")
def blocking_run(runs: RunCache) -> Run:
    """Blocking checkpoints, failures after steps 9 and 21, world size 2, hashes only."""
    return _made(runs.get("blocking", [*TINY, "--world-sizes", "2", "--strategy", "blocking",
                                       "--fail-at", "9,21"]))


@pytest.fixture(scope="session")
def overlapped_run(runs: RunCache) -> Run:
    """Overlapped checkpoints, failures after steps 9 and 21 (rank 1 fails), full IDs.

    One checkpoint in flight at most, so each failure resumes from a checkpoint however loaded
    the machine: the snapshot after step 7 waits until step 3's checkpoint is durable."""
    return _made(runs.get("overlapped", [*TINY, "--world-sizes", "2", "--strategy", "overlapped",
                                         "--max-inflight", "1", "--fail-at", "9,21",
                                         "--fail-rank", "1", "--log-ids"]))


@pytest.fixture(scope="session")
def demo_run(runs: RunCache) -> Run:
    """``ecrl demo``: 2 ranks, two failures, 2 → 1."""
    return _made(runs.get("demo", [], command="demo"))


@pytest.fixture(scope="session")
def data_root(runs: RunCache) -> Path:
    """Tiny CIFAR-10, CIFAR-100 and image-folder data sets in their real on-disk formats."""
    from dataset_files import write_cifar10, write_cifar100, write_image_folder

    root = runs.root / "data"
    with locked(runs.root / "data.lock"):
        if not (root / "done").exists():
            write_cifar10(root / "cifar10")
            write_cifar100(root / "cifar100")
            write_image_folder(root / "images")
            (root / "done").write_text("")
    return root


@pytest.fixture(scope="session")
def elastic_up_run(runs: RunCache, data_root: Path) -> Run:
    """CIFAR-100 (48 samples), world size 1 then 2, blocking, one failure, full IDs."""
    return _made(runs.get("elastic-up", [
        "--dataset", "cifar100", "--data-dir", str(data_root / "cifar100"), "--global-batch", "8",
        "--steps", "14", "--ckpt-every", "3", "--world-sizes", "1,2", "--strategy", "blocking",
        "--fail-at", "7", "--log-ids", "--seed", "3"]))


@pytest.fixture(scope="session")
def writer_crash_run(runs: RunCache, data_root: Path) -> Run:
    """CIFAR-10, overlapped; the background writer dies inside the 2nd commit, before the
    rename of latest.json (attempt 0 only)."""
    return _made(runs.get("writer-crash", [
        "--dataset", "cifar10", "--data-dir", str(data_root / "cifar10"), "--global-batch", "4",
        "--steps", "16", "--ckpt-every", "3", "--world-sizes", "1", "--strategy", "overlapped",
        "--log-ids"], env={"ECRL_CRASH_AT": "latest:before-rename:2:0"}))


# tiny-cnn-bn (dropout draws from torch's RNG every step; BatchNorm buffers move in the forward
# pass), world size 2: test_trajectory.py's runs and test_jit.py's BatchNorm rescues.
TINY_BN = ["--model", "tiny-cnn-bn", "--dataset-size", "256", "--global-batch", "8", "--steps",
           "28", "--seed", "5", "--world-sizes", "2", "--ckpt-every", "4", "--max-inflight", "1"]


@pytest.fixture(scope="session")
def bn_reference_run(runs: RunCache) -> Run:
    """TINY_BN uninterrupted under ``none``."""
    return _made(runs.get("trajectory-none", [*TINY_BN, "--strategy", "none"]))


@pytest.fixture(scope="session")
def bn_jit_rescued_run(runs: RunCache) -> Run:
    """TINY_BN under ``jit`` with no periodic checkpoints, three ranks SIGKILLed by
    ECRL_JIT_KILL: rank 1 in the forward of step 3 (attempt 0), rank 1 just after step 9's
    update (attempt 1), rank 0 in the forward of step 11 (attempt 2)."""
    return _made(runs.get("jit-bn-phases", [*TINY_BN, "--strategy", "jit", "--ckpt-every", "0",
                                            "--max-restarts", "5"],
                          env={"ECRL_JIT_KILL": "3:forward:1:0,9:post-optimizer:1:1,"
                                                "11:forward:0:2"}))


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ddp_train.py"
EXAMPLE_JIT = ["--strategy", "jit", "--world-sizes", "2", "--", "python", str(EXAMPLE),
               "--steps", "30"]


@pytest.fixture(scope="session")
def example_whole_run(runs: RunCache) -> Run:
    """docs/examples/ddp_train.py, 30 steps at world size 2 under ``ecrl launch`` (jit),
    uninterrupted: the twin of test_launch.py's jit rescue and of test_standalone_torchrun.py's
    plain torchrun runs (the trajectory is the script's, whoever launches it)."""
    return _made(runs.get("launch-jit-whole", EXAMPLE_JIT, command="launch"))


@dataclass(frozen=True)
class PipedRun:
    run: Run
    first_lines: list[str]
    """What the reader got before it closed its end of ``ecrl run``'s stdout."""


def _run_reading_three_lines(directory: Path, args: Sequence[str]) -> dict[str, Any]:
    """``ecrl run … | head -3``: read three lines of stdout, then close our end of the pipe.

    Plain values, not a :class:`PipedRun`: ``made_once`` pickles the result, and under ``make
    test`` another worker's ``conftest`` may be another folder's module, where the class is not."""
    proc = subprocess.Popen([sys.executable, "-m", "ecrl.apps.cli", "run", "--out",
                             str(directory), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    stderr = proc.stderr.read()
    returncode = proc.wait(timeout=RUN_TIMEOUT_S)
    return {"root": str(directory), "returncode": returncode, "stderr": stderr, "lines": lines}


@pytest.fixture(scope="session")
def rank0_killed_piped(runs: RunCache) -> PipedRun:
    """Overlapped, rank 0 killed right after the checkpoint boundaries of steps 7 and 23, its
    stdout read by a reader that closed the pipe after three lines (test_pipeline_runs.py and
    test_supervisor_signals.py)."""
    made = shared(runs, "pipeline-rank0-piped", lambda d: _run_reading_three_lines(d, [
        *TINY, "--world-sizes", "2", "--strategy", "overlapped", "--fail-at", "7,23",
        "--fail-rank", "0", "--log-ids"]))
    lines = list(made["lines"])
    return PipedRun(Run(root=Path(made["root"]), returncode=made["returncode"],
                        stdout="".join(lines), stderr=made["stderr"]), lines)


def assert_disagreeing_tp_peers_fail(root: Path, mutant: Path) -> None:
    """The logs of ``root`` (a run with tensor parallelism) with one tensor-parallel peer
    consuming another shard (the mutation ``tp_peers_disagree``, written to ``mutant``): FAIL,
    with a ``tp_peer_mismatch`` witness naming both records."""
    import random

    from verifier import verify_run
    from verifier._mutations import apply

    assert apply("tp_peers_disagree", root, mutant, random.Random(0)) is not None
    result = verify_run(mutant)
    assert result.verdict == "FAIL"
    witness = next(a for a in result.anomalies if a.kind == "tp_peer_mismatch")
    assert witness.file is not None and witness.related
    assert witness.related[0].rank != witness.rank
