"""``ecrl launch`` and a script's own checkpoint settings, real torchrun runs (issue "[house]" 1).

The script is the example of test_launch.py with ``Checkpointer(..., every=8)``. Launched without
``--ckpt-every`` it checkpoints every 8 steps, so a failure after step 10 resumes from step 7
(the supervisor's default interval used to replace the script's, and the run restarted from step
0); ``--ckpt-every 5`` on the command line wins over the script. The summary says which interval
and strategy were in effect and where each came from. (The last step is never checkpointed: the
run ends there.) The failing run checkpoints ``blocking``: an ``overlapped`` write still in the
background when the rank dies three short steps later dies with it, as in a real crash.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Run, RunCache

pytestmark = pytest.mark.torchrun

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ddp_train.py"
STEPS = 20


def _script(runs: RunCache) -> Path:
    text = EXAMPLE.read_text()
    assert text.count("every=10)") == 1
    path = runs.root / "train_every8.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("every=10)", "every=8)"))
    return path


def _launch(runs: RunCache, name: str, options: list[str]) -> Run:
    program = ["--", "python", str(_script(runs)), "--steps", str(STEPS), "--workers", "0"]
    run = runs.get(name, ["--world-sizes", "1", *options, *program], command="launch")
    assert run.returncode == 0, f"ecrl launch exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


def _checkpointed(run: Run) -> list[int]:
    steps = []
    for path in sorted((run.root / "logs").glob("attempt-*/checkpoint_rank0.jsonl")):
        steps += [json.loads(line)["global_step"] for line in path.read_text().splitlines()]
    return sorted(set(steps))


@pytest.fixture(scope="module")
def script_interval(runs: RunCache) -> Run:
    return _launch(runs, "settings-script-every", ["--strategy", "blocking", "--fail-at", "10"])


@pytest.fixture(scope="module")
def flag_interval(runs: RunCache) -> Run:
    return _launch(runs, "settings-flag-every", ["--ckpt-every", "5"])


def test_the_scripts_interval_stands_when_no_flag_is_given(script_interval: Run) -> None:
    assert _checkpointed(script_interval) == [7, 15]
    latest = json.loads((script_interval.root / "checkpoints" / "latest.json").read_text())
    assert latest["global_step"] == 15
    state = json.loads((script_interval.root / "supervisor.json").read_text())
    assert [a["resumed_from_step"] for a in state["attempts"]] == [None, 7]
    manifest = json.loads((script_interval.root / "run.json").read_text())
    assert manifest["ckpt_every"] == 8
    out = " ".join(script_interval.stdout.split())
    assert "strategy blocking (flag) every (the script's, else 50)" in out
    assert "checkpoint every 8 steps (script), strategy blocking (flag)" in out


def test_a_flag_given_wins_over_the_script(flag_interval: Run) -> None:
    assert _checkpointed(flag_interval) == [4, 9, 14]
    latest = json.loads((flag_interval.root / "checkpoints" / "latest.json").read_text())
    assert latest["global_step"] == 14
    assert json.loads((flag_interval.root / "run.json").read_text())["ckpt_every"] == 5
    out = " ".join(flag_interval.stdout.split())
    assert "strategy (the script's, else overlapped) every 5 (flag)" in out
    assert "checkpoint every 5 steps (flag), strategy overlapped (default)" in out
    # A clean one-attempt launch is complete by itself: no word of a torchrun exit after the
    # last step (the target was once read before the script had written run.json).
    assert "the run is complete" not in flag_interval.stderr
