"""``ecrl bench recovery``: the time one failure costs, with ``jit`` and with periodic checkpoints.

For each case the benchmark draws one failure step at random (seeded), then runs the real thing
(``ecrl run``: supervisor, torchrun, two ranks, real fsyncs) with the same seed, data, steps and
failure (rank 1 exits after that step): ``jit`` (no periodic checkpoints), ``overlapped`` every K
and ``blocking`` every K, all three with ``--warm-standby`` so that they share the same restart,
and ``jit`` once more without it (what the standby saves). From each run directory, as
``ecrl-verify`` measures it:

- replayed steps: steps a failed attempt ran that its successor ran again;
- time lost: the failed attempt's wall time after its last committed step (replayed work) plus
  the time from its end to the next attempt's first completed step (restart and restore), i.e.
  ``lost_s + restart_s`` of the verifier's metrics.

Two ranks, because ``jit`` saves from the rank that survives.
"""

from __future__ import annotations

import itertools
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target, command_line
from ecrl.contract.runformat import JsonlReader, RunPaths, StepRecord
from ecrl.runtime.checkpoint.registry import periodic_strategies, strategy_entry
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.settings import DEFAULTS

__all__ = ["run"]

PERIODIC = tuple(name for name in periodic_strategies() if not strategy_entry(name).sharded)
"""The periodic strategies jit is compared with (the registry's single-file ones)."""
STRATEGIES = ("jit", *PERIODIC)
LOST_TARGET = 0.2
"""jit's time lost against periodic checkpoints' (issue 13)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Case:
    model: str
    global_batch: int
    steps: int
    every: int
    image_size: int = 32
    judged: bool = False
    """The time-lost target is judged on this case: its step time is a real training step's
    (about a second). Where a step takes milliseconds, the restart (a new torchrun, imports,
    rendezvous, loading: a few seconds whatever the strategy) is most of what any strategy
    loses, and the ratio says more about process start-up than about checkpoints."""

    @property
    def label(self) -> str:
        return f"{self.model} {self.image_size}px B={self.global_batch}"


def _cases(quick: bool) -> list[_Case]:
    if quick:
        return [_Case(model="tiny-cnn", global_batch=16, steps=60, every=20)]
    return [_Case(model="tiny-cnn", global_batch=32, steps=400, every=50),
            _Case(model="resnet18", global_batch=16, steps=200, every=50),
            # ImageNet-sized inputs: about 1 s per step on two CPU ranks.
            _Case(model="resnet18", global_batch=32, steps=110, every=50, image_size=224,
                  judged=True)]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Measured:
    replayed: int
    lost_s: float
    """Replayed work plus restart and restore."""
    replay_s: float
    """Replayed work alone: the failed attempt's time after its last committed step."""
    verdict: str
    step_s: float
    """Median seconds per step."""


def _median_step_s(run: Path) -> float:
    """Median time between rank 0's consecutive steps in the first attempt."""
    log = JsonlReader(RunPaths.of(run).rank_log(0, 0), StepRecord, torn_tail_ok=True)
    times = [record.time for _, record in log]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[len(gaps) // 2] if gaps else 0.0


def _train(root: Path, case: _Case, strategy: str, fail_at: int,
           progress: Progress, *, standby: bool = True) -> _Measured:
    from ecrl.apps.console import Console
    from ecrl.runtime.supervision.supervisor import EXIT_OK, Supervisor
    from verifier import verify

    out = root / f"{case.model}-{case.image_size}-{strategy}-{'warm' if standby else 'cold'}"
    config = RunConfig(out=str(out), world_sizes=(2,), dataset="fake", dataset_size=50_000,
                       model=case.model, global_batch=case.global_batch, steps=case.steps,
                       image_size=case.image_size, warm_standby=standby,
                       ckpt_every=0 if strategy == "jit" else case.every, strategy=strategy,
                       fail_at=(fail_at,), fail_rank=1, threads=1, seed=0)
    progress(f"{case.label}: {case.steps} steps, strategy {strategy}, failure after step "
             f"{fail_at}{'' if standby else ', no warm standby'}")
    code = Supervisor(config, reporter=Console(out=lambda _line: None, err=progress)).run()
    if code != EXIT_OK:
        raise RuntimeError(f"benchmark run {out} failed with exit code {code}")
    result = verify(out).runs[0]
    step_s = _median_step_s(out)
    m = result.metrics
    lost = (m.lost_s or 0.0) + (m.restart_s or 0.0)
    shutil.rmtree(out, ignore_errors=True)
    return _Measured(replayed=m.replayed_steps, lost_s=lost, replay_s=m.lost_s or 0.0,
                     verdict=result.verdict, step_s=step_s)


def run(*, quick: bool, progress: Progress) -> BenchResult:
    rows: list[BenchRow] = []
    targets: list[Target] = []
    notes: list[str] = []
    rng = random.Random(13)
    root = Path(tempfile.mkdtemp(prefix="ecrl-bench-recovery-"))
    try:
        for case in _cases(quick):
            # Not on a checkpoint step, and past the first interval: a typical failure.
            fail_at = rng.randrange(case.every, case.steps - 2)
            got = {s: _train(root, case, s, fail_at, progress) for s in STRATEGIES}
            jit = got["jit"]
            cold = _train(root, case, "jit", fail_at, progress, standby=False)
            rows.append(BenchRow(
                candidate="jit, warm standby", alternative="jit, torchrun launched at the failure",
                metric=f"{case.label}: time lost to one failure after step {fail_at}, s "
                       "(lower is better)",
                candidate_value=jit.lost_s, alternative_value=cold.lost_s,
                note="the restart without --warm-standby: new torchrun, rendezvous, imports"))
            for other in PERIODIC:
                periodic = got[other]
                rows.append(BenchRow(
                    candidate="jit", alternative=f"{other} every {case.every}",
                    metric=f"{case.label}: time lost to one failure after step {fail_at}, s "
                           "(replayed work + restart and restore; lower is better)",
                    candidate_value=jit.lost_s, alternative_value=periodic.lost_s,
                    note=f"replayed steps: jit {jit.replayed}, {other} {periodic.replayed}; "
                         f"{jit.step_s:.3f} s per step; verdicts "
                         f"{jit.verdict}/{periodic.verdict}"))
                rows.append(BenchRow(
                    candidate="jit", alternative=f"{other} every {case.every}",
                    metric=f"{case.label}: replayed work alone, s (the failed attempt's time "
                           "after its last committed step; lower is better)",
                    candidate_value=jit.replay_s, alternative_value=periodic.replay_s,
                    note="restart and restore (torchrun, imports, loading) are the rest"))
            best = min(got[other].lost_s for other in PERIODIC)
            # One drawn step can land anywhere in an interval: the same run's figures with the
            # periodic strategies' replay set to its mean over a uniform failure step.
            periodic = got[DEFAULTS.strategy]  # what a run checkpoints with by default
            mean_replayed = (case.every - 1) / 2
            expected = periodic.lost_s + (mean_replayed - periodic.replayed) * periodic.step_s
            rows.append(BenchRow(
                candidate="jit", alternative=f"{DEFAULTS.strategy} every {case.every}",
                metric=f"{case.label}: time lost to a failure at a uniformly drawn step, s "
                       "(expected; lower is better)",
                candidate_value=jit.lost_s, alternative_value=expected,
                note=f"periodic: this run's loss with (K - 1) / 2 replayed steps instead of "
                     f"{periodic.replayed}, at {periodic.step_s:.3f} s per step"))
            targets.append(Target(
                description=f"{case.label}: jit replays at most 1 step",
                measured=f"{jit.replayed} replayed", met=jit.replayed <= 1))
            measured = (f"{jit.lost_s / best:.1%} (at a uniformly drawn step, expected: "
                        f"{jit.lost_s / expected:.1%})" if best > 0 else "periodic lost nothing")
            if case.judged or quick:
                targets.append(Target(
                    description=f"{case.label} ({jit.step_s:.2f} s per step): jit's time lost "
                                f"<= {LOST_TARGET:.0%} of periodic's",
                    measured=measured, met=best > 0 and jit.lost_s <= LOST_TARGET * best))
            else:
                notes.append(f"{case.label} ({jit.step_s * 1000:.0f} ms per step): jit's time "
                             f"lost is {measured} of periodic's; restart-dominated, not judged")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BenchResult(
        name="recovery", command=command_line(), rows=rows, targets=targets,
        notes=[
            *notes,
            "each cell is a real `ecrl run` (torchrun, two ranks, trainer, fsync) with the same "
            "seed, data, steps and one injected failure (rank 1 exits after the drawn step); "
            "time lost = verifier lost_s + restart_s; every strategy runs with --warm-standby "
            "(the same restart for all), and jit once more without it",
            "jit runs without periodic checkpoints; the periodic strategies checkpoint every K "
            "steps, so they replay the steps since their last checkpoint",
            "--quick: tiny CNN, 60 steps, K = 20; full: tiny CNN (400 steps), ResNet-18 at 32 px "
            "(200 steps) and at 224 px (110 steps), K = 50",
            "what any strategy loses to a failure at a uniformly drawn step is about teardown + "
            "restart + (K - 1) / 2 × step time (jit: teardown + rescue + restart), so the ratio "
            "falls as the step time grows",
        ])
