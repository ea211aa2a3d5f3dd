"""The warm standby's hand-over, with real processes standing in for torchrun (no torch needed).

The launcher given to :class:`Standby` starts a small Python program that waits in
:func:`ecrl.runtime.launchenv.await_go` exactly as a rank does, then writes the environment it was
handed to a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ecrl.runtime.supervision.standby import GO_VARIABLE, STANDBY_DIR, Standby

_RANK = """
import json, os, sys
from ecrl.runtime.launchenv import AttemptEnv
env = AttemptEnv.from_environ()  # waits for the go file, as a rank does
with open(sys.argv[1], "w") as out:
    json.dump({"attempt": env.attempt, "run_dir": env.run_dir,
               "go_left": os.environ.get("ECRL_STANDBY_GO")}, out)
"""


def _launcher(tmp_path: Path, program: str):
    def launch(attempt: int, world: int, variables: Mapping[str, str],
               log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as handle:
            return subprocess.Popen(
                [sys.executable, "-c", program, str(tmp_path / f"rank-{attempt}.json")],
                env={**_base_env(), **variables}, stdout=handle, stderr=subprocess.STDOUT,
                start_new_session=True)
    return launch


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("ECRL_")}


def test_a_waiting_rank_takes_the_attempt_handed_to_it(tmp_path: Path) -> None:
    standby = Standby(tmp_path, _launcher(tmp_path, _RANK))
    standby.prepare(3, 2)
    time.sleep(0.5)  # the rank is waiting, not done
    assert not (tmp_path / "rank-3.json").exists()
    attempt_dir = tmp_path / "logs" / "attempt-003"
    attempt_dir.mkdir(parents=True)
    proc = standby.take(3, 2, {"ECRL_RUN_DIR": str(tmp_path), "ECRL_ATTEMPT": "3"},
                        attempt_dir / "torchrun.log")
    assert proc is not None
    assert proc.wait(timeout=60) == 0
    got = json.loads((tmp_path / "rank-3.json").read_text())
    assert got == {"attempt": 3, "run_dir": str(tmp_path), "go_left": None}
    assert (attempt_dir / "torchrun.log").exists()
    standby.stop()
    assert not (tmp_path / STANDBY_DIR).exists()


def test_a_standby_for_another_world_size_is_stopped_not_used(tmp_path: Path) -> None:
    standby = Standby(tmp_path, _launcher(tmp_path, _RANK))
    standby.prepare(1, 2)
    waiting = standby._waiting
    assert waiting is not None
    assert standby.take(1, 1, {"ECRL_RUN_DIR": str(tmp_path), "ECRL_ATTEMPT": "1"},
                        tmp_path / "torchrun.log") is None
    assert waiting.proc.poll() is not None  # stopped
    assert not (tmp_path / "rank-1.json").exists()  # it never ran the attempt
    assert not (tmp_path / STANDBY_DIR).exists()


def test_a_dead_standby_is_not_used(tmp_path: Path) -> None:
    standby = Standby(tmp_path, _launcher(tmp_path, "import sys; sys.exit(3)"))
    standby.prepare(1, 2)
    waiting = standby._waiting
    assert waiting is not None
    waiting.proc.wait(timeout=60)
    assert standby.take(1, 2, {"ECRL_RUN_DIR": str(tmp_path), "ECRL_ATTEMPT": "1"},
                        tmp_path / "torchrun.log") is None


def test_a_cancel_ends_the_waiting_rank_without_running(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path / "out.json")],
                            env={**_base_env(), GO_VARIABLE: str(go)})
    time.sleep(0.3)
    go.write_text(json.dumps({"cancel": True}))
    assert proc.wait(timeout=60) == 0
    assert not (tmp_path / "out.json").exists()
