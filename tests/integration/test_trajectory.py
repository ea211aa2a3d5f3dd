"""One trajectory whatever the strategy (issue 27): the RNG policy is the run's, not the
strategy's.

A model with dropout (draws from torch's RNG every step) and BatchNorm (buffers the forward pass
moves) trained under ``none``, ``blocking``, ``overlapped`` and ``jit`` (test_jit.py's BatchNorm
run, rescued three times) gives bit-identical losses at every step on every rank and the same
final parameters; so does a run interrupted twice and
continued each time with another strategy (overlapped → jit → blocking), whose ``jit`` attempt
ends in a rescue.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_BN, Run, RunCache, _made, ecrl, shared
from lineage_check import load_run

from ecrl.contract.runformat import RunPaths, SupervisorState, read_json_record

pytestmark = pytest.mark.torchrun

BN = TINY_BN
STRATEGIES = ("none", "blocking", "overlapped")


@pytest.fixture(scope="module")
def by_strategy(runs: RunCache, bn_reference_run: Run, bn_jit_rescued_run: Run
                ) -> dict[str, Run]:
    """One run per strategy. The ``jit`` one is test_jit.py's BatchNorm run: ``jit`` in every
    attempt, three of them ended by a rescue, its committed lineage the whole trajectory."""
    made = {s: _made(runs.get(f"trajectory-{s}", [*BN, "--strategy", s])) for s in STRATEGIES}
    assert made["none"] == bn_reference_run
    return {**made, "jit": bn_jit_rescued_run}


def _switched(root: Path) -> Path:
    """Overlapped until rank 1 fails after step 9, jit until it fails after step 21 (rank 0
    rescues), blocking to the end: each attempt is a separate ``ecrl run`` (no restarts)."""
    first = ecrl("run", "--out", str(root), *BN, "--strategy", "overlapped", "--fail-at", "9,21",
                 "--fail-rank", "1", "--max-restarts", "0")
    assert first.returncode == 1, first.stdout + first.stderr
    for strategy, code in (("jit", 1), ("blocking", 0)):
        more = ecrl("run", "--out", str(root), "--strategy", strategy, "--max-restarts", "0")
        assert more.returncode == code, more.stdout + more.stderr
    return root


@pytest.fixture(scope="module")
def switched(runs: RunCache) -> Path:
    return Path(shared(runs, "trajectory-switched", lambda d: str(_switched(d / "run"))))


def test_every_strategy_gives_the_same_losses_and_parameters(by_strategy: dict[str, Run]
                                                             ) -> None:
    views = {s: load_run(run.root) for s, run in by_strategy.items()}
    reference = views["none"]
    losses = reference.losses()
    assert len(losses) == 28 * 2 and len(set(losses.values())) > 28  # every step, both ranks
    for strategy, view in views.items():
        assert view.manifest.extra["rng"] == {"policy": "per-step", "version": 1}, strategy
        assert view.losses() == losses, strategy
        assert view.final_digest() == reference.final_digest(), strategy


def test_a_run_switching_strategy_on_each_resume_keeps_the_trajectory(
        switched: Path, by_strategy: dict[str, Run]) -> None:
    root = switched
    state = read_json_record(RunPaths.of(root).supervisor, SupervisorState)
    assert [a.status for a in state.attempts] == ["failed", "jit", "completed"]
    strategies = []
    for attempt in range(3):
        events = RunPaths.of(root).checkpoint_log(attempt)
        strategies.append({json.loads(line)["strategy"] for line in events.open()})
    assert strategies == [{"overlapped"}, {"jit"}, {"blocking"}]
    # The jit attempt's survivor (rank 0) saved its live state of the step the failure followed.
    assert state.attempts[2].resumed_from_step == 21
    view = load_run(root)
    reference = load_run(by_strategy["none"].root)
    assert view.manifest.extra["rng"] == reference.manifest.extra["rng"]
    assert view.losses(committed_only=False) == view.losses()  # replayed steps agree too
    assert view.losses() == reference.losses()
    assert view.final_digest() == reference.final_digest()
