"""On a CUDA machine: drawn failure schedules through the real trainer, judged by the verifier and,
where the world size stays fixed, by bit-identity with the uninterrupted run.

Hypothesis draws, for each checkpoint strategy, the world sizes of the attempts (a fixed 1 or 2,
or a change 2→1 or 1→2), the steps after which a rank fails and which rank. Every schedule runs
as a real ``ecrl run`` (supervisor, torchrun, trainer on CUDA, failure injection by exit 137);
the run must complete, ``ecrl-verify`` must PASS it, and at a fixed world size its losses and
final parameters must equal those of the same run without failures — which needs the CUDA RNG
(the tiny CNN's dropout draws from it on the device) restored exactly on every resume.

With one GPU, the two ranks of a world size 2 share it and talk over gloo
(:mod:`ecrl.runtime.trainer.placement`): nccl refuses two ranks on one device. Run it with
``make test-gpu`` (profile ``gpu``: a few examples per strategy, the strategies in parallel).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import TINY, Run, RunCache, _made, ecrl
from hypothesis import given
from hypothesis import strategies as st
from lineage_check import check_exactly_once, load_run

from ecrl.contract.strategies import STRATEGIES
from verifier import render_text, verify

pytestmark = [pytest.mark.gpu, pytest.mark.torchrun]

STEPS = 40  # TINY's
SCHEDULED = tuple(s for s in STRATEGIES if s != "none")
WORLD_SIZES = ((1,), (2,), (2, 1), (1, 2))


@st.composite
def schedules(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(world sizes, failure steps, failing rank): each change of world size needs a failure to
    end the attempt before it; the failing rank exists in every attempt that fails."""
    sizes = draw(st.sampled_from(WORLD_SIZES))
    failures = draw(st.integers(min_value=max(1, len(sizes) - 1), max_value=2))
    steps = tuple(sorted(draw(st.lists(st.integers(1, STEPS - 2), min_size=failures,
                                       max_size=failures, unique=True))))
    failing = [sizes[min(j, len(sizes) - 1)] for j in range(failures)]
    rank = draw(st.integers(0, min(failing) - 1))
    return sizes, steps, rank


def _reference(runs: RunCache, world: int) -> Run:
    """The uninterrupted twin of a fixed-world-size run: every strategy trains on the same
    trajectory (one RNG policy for all, docs/semantics.md "Random streams")."""
    return _made(runs.get(f"gpu-reference-w{world}",
                          [*TINY, "--world-sizes", str(world), "--strategy", "none",
                           "--ckpt-every", "0", "--log-ids"]))


@pytest.mark.parametrize("strategy", SCHEDULED)
@given(schedule=schedules())
def test_drawn_failure_schedules_resume_exactly_on_cuda(
        strategy: str, schedule: tuple[tuple[int, ...], tuple[int, ...], int],
        runs: RunCache, tmp_path_factory: pytest.TempPathFactory) -> None:
    sizes, steps, rank = schedule
    name = hashlib.sha256(repr((strategy, schedule)).encode()).hexdigest()[:12]
    out = tmp_path_factory.mktemp(f"gpu-{strategy}-{name}") / "run"
    done = ecrl("run", "--out", str(out), *TINY, "--strategy", strategy,
                "--world-sizes", ",".join(map(str, sizes)),
                "--fail-at", ",".join(map(str, steps)), "--fail-rank", str(rank), "--log-ids")
    assert done.returncode == 0, f"{schedule}\n{done.stdout}\n{done.stderr}"
    torchrun_log = (out / "logs" / "attempt-000" / "torchrun.log").read_text()
    assert "ranks train on cuda" in torchrun_log, torchrun_log[-2000:]
    result = verify(str(out))
    assert result.exit_code == 0, render_text(result)
    ours = load_run(out)
    check_exactly_once(ours)
    if len(set(sizes)) == 1:
        twin = load_run(_reference(runs, sizes[0]).root)
        assert ours.final_digest() == twin.final_digest(), schedule
        assert ours.losses(committed_only=False) == twin.losses(), schedule


def test_world_size_two_on_one_gpu_shares_it_over_gloo(runs: RunCache) -> None:
    import torch

    run = _reference(runs, 2)
    log = (run.root / "logs" / "attempt-000" / "torchrun.log").read_text()
    expected = "nccl" if torch.cuda.device_count() >= 2 else "gloo, shared with other ranks"
    assert f"ranks train on cuda:0 over {expected}" in log, log[-2000:]


def test_a_resumed_cuda_run_with_dropout_is_bit_identical(runs: RunCache, tmp_path: Path) -> None:
    # The CUDA RNG is what the tiny CNN's dropout draws from on the device: a resume that did not
    # restore it exactly would change every step after the failure.
    twin = load_run(_reference(runs, 1).root)
    out = tmp_path / "run"
    done = ecrl("run", "--out", str(out), *TINY, "--world-sizes", "1", "--strategy", "blocking",
                "--fail-at", "13", "--log-ids")
    assert done.returncode == 0, done.stderr
    ours = load_run(out)
    assert ours.final_digest() == twin.final_digest()
    assert ours.losses(committed_only=False) == twin.losses()
