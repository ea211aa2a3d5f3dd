"""Sharded checkpoints in real runs (torchrun, two gloo ranks, os._exit failures): issue 12.1.

A sharded run saved at world size 2 resumes at 1 and at 2 with exact data accounting
(``ecrl-verify`` PASS) and parameters bit-identical to a rank-0 (``blocking``) run of the same seed
and world-size schedule; a corrupt part of the newest checkpoint falls back to the earlier one.

The blocking run stopped after step 13 has world sizes 2, 1: continued as it is, it is the
blocking twin (2 → 1, resumed from step 11) of the sharded runs saved at 2 and resumed at 1, with
no run of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Run, RunCache, ecrl, shared
from lineage_check import check_exactly_once, load_run

pytestmark = pytest.mark.torchrun

BASE = ["--dataset-size", "256", "--global-batch", "8", "--steps", "24", "--ckpt-every", "4",
        "--seed", "7"]


def _verify(root: Path) -> None:
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(root)],
                             capture_output=True, text=True, timeout=300)
    assert verdict.returncode == 0 and "PASS" in verdict.stdout, verdict.stdout + verdict.stderr


def _digest(run: Run) -> str:
    return str(json.loads((run.root / "final" / "summary.json").read_text())["params_digest"])


def _completed(runs: RunCache, name: str, *args: str) -> Run:
    run = runs.get(name, [*BASE, *args])
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def _uninterrupted(runs: RunCache) -> Run:
    return _completed(runs, "shd-blocking-2", "--world-sizes", "2", "--strategy", "blocking")


def _stopped(runs: RunCache, strategy: str, world_sizes: str) -> Run:
    """Stopped (``--max-restarts 0``) by the failure after step 13: checkpoints up to step 11."""
    run = runs.get(f"shd-{strategy}-stopped-13", [*BASE, "--world-sizes", world_sizes,
                                                  "--strategy", strategy, "--fail-at", "13",
                                                  "--max-restarts", "0"])
    assert run.returncode == 1, run.stdout + run.stderr
    return run


def _blocking_2_1(runs: RunCache, resumed: int) -> Run:
    """Blocking, steps 0..resumed at world size 2, the rest at 1."""
    if resumed != 11:
        return _completed(runs, f"shd-blocking-2-1-from-{resumed}", "--world-sizes", "2,1",
                          "--strategy", "blocking", "--fail-at", str(resumed + 2))
    stopped = _stopped(runs, "blocking", "2,1")

    def make(directory: Path) -> tuple[int, str, str]:
        shutil.copytree(stopped.root, directory, ignore=shutil.ignore_patterns(".supervisor.lock"))
        proc = ecrl("run", "--out", str(directory))  # attempt 1: world size 2,1's second
        return proc.returncode, proc.stdout, proc.stderr

    name = "shd-blocking-2-1-from-11"
    returncode, stdout, stderr = shared(runs, name, make)
    assert returncode == 0, stdout + stderr
    return Run(root=runs.root / name, returncode=returncode, stdout=stdout, stderr=stderr)


def _dcp_dirs(root: Path) -> list[Path]:
    return sorted((root / "checkpoints").glob("step-*.dcp"))


@pytest.mark.parametrize("strategy", ["sharded", "sharded-async"])
def test_saved_at_2_resumed_at_1_is_exact_and_bit_identical_to_blocking(
        runs: RunCache, strategy: str) -> None:
    sharded = _completed(runs, f"shd-{strategy}-2-1", "--world-sizes", "2,1", "--strategy",
                         strategy, "--fail-at", "13")
    view = load_run(sharded.root)
    assert [a.world_size for a in view.state.attempts] == [2, 1]
    resumed = view.state.attempts[1].resumed_from_step
    # sync: the checkpoint after step 11; async: up to --max-inflight (2) checkpoints may still
    # have been in flight at the kill, so 7 or 3 are right too
    assert resumed == 11 or (strategy == "sharded-async" and resumed in (3, 7))
    assert view.state.extra["resume_points"]["1"]["path"] == f"step-{resumed:08d}.dcp"
    check_exactly_once(view)
    _verify(sharded.root)
    # every rank wrote its part of each checkpoint of the 2-rank attempt
    events = [json.loads(line) for line in
              (sharded.root / "logs" / "attempt-000" / "checkpoint_rank0.jsonl").open()]
    assert events and all(e["strategy"] == strategy and e["writers"] == 2 for e in events)
    # the same schedule with rank-0 checkpoints: steps 0..resumed at W=2, the rest at W=1
    blocking = _blocking_2_1(runs, resumed)
    assert [a.world_size for a in load_run(blocking.root).state.attempts] == [2, 1]
    assert load_run(blocking.root).state.attempts[1].resumed_from_step == resumed
    assert _digest(sharded) == _digest(blocking)


def test_saved_at_2_resumed_at_2_is_bit_identical_to_an_uninterrupted_blocking_run(
        runs: RunCache) -> None:
    reference = _uninterrupted(runs)
    for strategy in ("sharded", "sharded-async"):
        run = _completed(runs, f"shd-{strategy}-2-2", "--world-sizes", "2", "--strategy",
                         strategy, "--fail-at", "13,18", "--fail-rank", "1")
        view = load_run(run.root)
        assert [a.status for a in view.state.attempts] == ["failed", "failed", "completed"]
        check_exactly_once(view)
        _verify(run.root)
        assert _digest(run) == _digest(reference)
        for directory in _dcp_dirs(run.root):
            parts = sorted(p.name for p in directory.iterdir() if p.name.endswith(".distcp"))
            assert parts == ["__0_0.distcp", "__1_0.distcp"]
            assert (directory / ".metadata").is_file()
            manifest = json.loads((directory / "ecrl-manifest.json").read_text())
            # rank r writes chunk r, whole: its part is that chunk and torch.save's small
            # container around it (a rank that staged or wrote another's chunk would differ)
            chunks = [c["nbytes"] for c in manifest["chunks"]]
            assert len(chunks) == 2
            for rank, nbytes in enumerate(chunks):
                size = manifest["parts"][f"__{rank}_0.distcp"]["size"]
                assert nbytes <= size < nbytes + 4096, (strategy, rank, size, chunks)


def test_corrupt_part_of_the_newest_checkpoint_falls_back_to_the_earlier_one(
        runs: RunCache, tmp_path: Path) -> None:
    stopped = _stopped(runs, "sharded", "2")
    reference = _uninterrupted(runs)
    out = tmp_path / "run"
    shutil.copytree(stopped.root, out, ignore=shutil.ignore_patterns(".supervisor.lock"))
    assert [p.name for p in _dcp_dirs(out)] == ["step-00000007.dcp", "step-00000011.dcp"]
    part = out / "checkpoints" / "step-00000011.dcp" / "__1_0.distcp"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x10
    part.write_bytes(bytes(data))
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    notes = [line for line in resumed.stderr.splitlines() if "newest valid earlier" in line]
    assert len(notes) == 1 and "__1_0.distcp: checksum mismatch" in notes[0], resumed.stderr
    view = load_run(out)
    assert view.state.attempts[1].resumed_from_step == 7
    assert view.state.extra["resume_points"]["1"]["reason"] == "fallback"
    check_exactly_once(view)
    _verify(out)
    assert _digest(Run(root=out, returncode=0, stdout="", stderr="")) == _digest(reference)


# The stopped blocking run has world sizes 2, 1 (it is also the blocking twin's first attempt):
# continued with sharded checkpoints, it must end as that twin, continued with its own.
@pytest.mark.parametrize(("first", "then", "suffix"), [("blocking", "sharded", ".ckpt"),
                                                       ("sharded", "sharded-async", ".dcp"),
                                                       ("sharded", "blocking", ".dcp")])
def test_a_run_continued_with_another_strategy_loads_the_other_format(
        runs: RunCache, tmp_path: Path, first: str, then: str, suffix: str) -> None:
    stopped = _stopped(runs, first, "2,1" if first == "blocking" else "2")
    reference = _blocking_2_1(runs, 11) if first == "blocking" else _uninterrupted(runs)
    out = tmp_path / "run"
    shutil.copytree(stopped.root, out, ignore=shutil.ignore_patterns(".supervisor.lock"))
    resumed = ecrl("run", "--out", str(out), "--strategy", then)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.world_size for a in view.state.attempts] == ([2, 1] if first == "blocking"
                                                           else [2, 2])
    assert view.state.attempts[1].resumed_from_step == 11
    assert view.state.extra["resume_points"]["1"]["path"] == f"step-00000011{suffix}"
    events = [json.loads(line) for line in
              (out / "logs" / "attempt-001" / "checkpoint_rank0.jsonl").open()]
    assert events and {e["strategy"] for e in events} == {then}
    check_exactly_once(view)
    _verify(out)
    assert _digest(Run(root=out, returncode=0, stdout="", stderr="")) == _digest(reference)
