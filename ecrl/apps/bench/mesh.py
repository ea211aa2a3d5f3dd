"""``ecrl bench mesh``: checkpoints of an FSDP2 model at 2 ranks — each rank writing its own shards
(``sharded``, ``sharded-async``) against gathering the whole state to rank 0 and writing it there
(``blocking``, the approach most scripts use) — and the load at another data-parallel degree.

Every cell comes from a real ``ecrl run --parallel fsdp`` (torchrun, gloo, the trainer, fsync) of
the same model, seed, data and steps; the figures are read from its run directory:

- **until durable**: the training time a synchronous checkpoint costs, from the step records
  of rank 0: the interval between the records of steps ``c`` and ``c + 1`` when ``c``
  checkpoints, less the median interval of the steps that do not. It holds everything the
  checkpoint adds to the step (``blocking``: the all-gather of the full model and optimizer
  state, rank 0's encoding, write and fsync, the barrier; ``sharded``: each rank's own shards,
  the parts written and fsynced by both ranks, the manifest, the rename), so neither side's
  accounting of its own events is trusted;
- **stall**: the checkpoint events' ``stall_s`` of ``sharded-async`` and ``sharded`` (the
  training thread's wait inside the checkpoint call);
- **load**: ``load_s`` of ``restored.json`` (rank 0: opened, checked, tiled whole and cut for
  the mesh) of the same ``sharded`` run resumed at W = 2 (the same degree) and at W = 1 (DP 2 -> 1).

One torch thread per rank (``--threads 1``), so that the two ranks have a core each on a 2-core
machine. The runs of each round are interleaved, every other round in reverse order.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from pathlib import Path

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target, command_line
from ecrl.contract.runformat import CheckpointEvent, JsonlReader, RunPaths, StepRecord
from ecrl.runtime.runconfig import RunConfig

__all__ = ["run"]

WRITE_TARGET = 0.5
"""FSDP2 at 2 ranks: the sharded checkpoint until durable against gathering to rank 0."""
STALL_TARGET = 0.05
"""sharded-async's stall against sharded's."""
MODEL = "resnet50"
EVERY = 5


def _steps(quick: bool) -> int:
    return 4 * EVERY if quick else 8 * EVERY


def _train(root: Path, name: str, strategy: str, progress: Progress, *, quick: bool,
           world_sizes: tuple[int, ...] = (2,), fail_at: tuple[int, ...] = ()) -> RunPaths:
    from ecrl.apps.console import Console
    from ecrl.runtime.supervision.supervisor import EXIT_OK, Supervisor

    out = root / name
    config = RunConfig(out=str(out), world_sizes=world_sizes, parallel="fsdp", dataset="fake",
                       dataset_size=4096, model="tiny-cnn" if quick else MODEL, global_batch=4,
                       steps=_steps(quick), ckpt_every=EVERY, strategy=strategy, threads=1,
                       seed=0, fail_at=fail_at, keep_checkpoints=2)
    progress(f"{config.model} under FSDP2, world sizes {','.join(map(str, world_sizes))}: "
             f"{config.steps} steps, strategy {strategy}"
             + (f", failure after step {fail_at[0]}" if fail_at else ""))
    code = Supervisor(config, reporter=Console(out=lambda _line: None, err=progress)).run()
    if code != EXIT_OK:
        raise RuntimeError(f"benchmark run {out} failed with exit code {code}")
    return RunPaths.of(out)


def _events(paths: RunPaths, attempt: int = 0) -> list[CheckpointEvent]:
    reader = JsonlReader(paths.checkpoint_log(attempt), CheckpointEvent, torn_tail_ok=False)
    return [event for _, event in reader]


def _checkpoint_costs(paths: RunPaths) -> list[float]:
    """Seconds each checkpoint of attempt 0 added to its step (the record interval after a
    checkpointing step less the median interval after the others), the first one excluded
    (it allocates and first touches its buffers)."""
    times = {r.global_step: r.time for _, r in JsonlReader(paths.rank_log(0, 0), StepRecord,
                                                           torn_tail_ok=False)}
    saved = {e.global_step for e in _events(paths)}
    steps = sorted(times)
    gaps = {s: times[s + 1] - times[s] for s in steps[1:] if s + 1 in times}
    plain = statistics.median(g for s, g in gaps.items() if s not in saved)
    return [gaps[s] - plain for s in sorted(saved) if s in gaps][1:]


def _load_s(paths: RunPaths) -> float:
    return float(json.loads((paths.attempt_dir(1) / "restored.json").read_text())["load_s"])


def run(*, quick: bool, progress: Progress) -> BenchResult:
    root = Path(tempfile.mkdtemp(prefix="ecrl-bench-mesh-"))
    fail = (_steps(quick) - EVERY,)  # after the last checkpoint but one: a resume loads it
    plans = {
        "blocking": dict(strategy="blocking"),
        "sharded": dict(strategy="sharded", world_sizes=(2, 2), fail_at=fail),
        "sharded-async": dict(strategy="sharded-async"),
        "sharded-dp1": dict(strategy="sharded", world_sizes=(2, 1), fail_at=fail),
    }
    rounds = 1 if quick else 2
    made: dict[str, list[RunPaths]] = {name: [] for name in plans}
    try:
        for index in range(rounds):
            order = list(plans) if index % 2 == 0 else list(plans)[::-1]
            for name in order:
                made[name].append(_train(root, f"{name}-{index}", progress=progress,
                                         quick=quick, **plans[name]))  # type: ignore[arg-type]
        costs = {name: [c for p in made[name] for c in _checkpoint_costs(p)]
                 for name in ("blocking", "sharded")}
        durable = {name: statistics.median(v) for name, v in costs.items()}
        stalls = {name: statistics.median(e.stall_s for p in made[name] for e in _events(p))
                  for name in ("sharded", "sharded-async")}
        sizes = {name: statistics.median(e.bytes for p in made[name] for e in _events(p))
                 for name in ("blocking", "sharded")}
        same = statistics.median(_load_s(p) for p in made["sharded"])
        other = statistics.median(_load_s(p) for p in made["sharded-dp1"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    model = "tiny-cnn" if quick else MODEL
    rows = [
        BenchRow(candidate="sharded (each rank writes its shards)",
                 alternative="blocking (gather to rank 0, rank 0 writes)",
                 metric=f"{model}, FSDP2, 2 ranks: training time per checkpoint until durable, "
                        f"ms (median of {len(costs['sharded'])} vs {len(costs['blocking'])}; "
                        "lower is better)",
                 candidate_value=durable["sharded"] * 1e3,
                 alternative_value=durable["blocking"] * 1e3,
                 note=f"checkpoint {sizes['sharded'] / 1e6:.1f} MB in 2 parts vs "
                      f"{sizes['blocking'] / 1e6:.1f} MB in one file; the step-record interval "
                      "after a checkpointing step less the median interval"),
        BenchRow(candidate="sharded-async", alternative="sharded",
                 metric=f"{model}, FSDP2, 2 ranks: training stall per checkpoint, ms (median; "
                        "lower is better)",
                 candidate_value=stalls["sharded-async"] * 1e3,
                 alternative_value=stalls["sharded"] * 1e3,
                 note="stall_s of the checkpoint events: the async copy of each rank's own "
                      "shards to CPU buffers vs the whole synchronous commit"),
        BenchRow(candidate="load at DP 1 (resharded)", alternative="load at DP 2 (same degree)",
                 metric=f"{model}, FSDP2: load of a checkpoint written at DP 2, ms (rank 0's "
                        "restored.json load_s; lower is better)",
                 candidate_value=other * 1e3, alternative_value=same * 1e3,
                 note="read and hashed, pieces tiled whole, set_model/optimizer_state_dict "
                      "cutting them for the mesh; every rank reads every piece"),
    ]
    write_ratio = durable["sharded"] / durable["blocking"]
    stall_ratio = stalls["sharded-async"] / stalls["sharded"]
    targets = [
        Target(description=f"FSDP2 at 2 ranks: sharded write until durable <= {WRITE_TARGET}x "
                           "gathering to rank 0 and writing there",
               measured=f"{write_ratio:.2f}x ({durable['sharded'] * 1e3:.0f} vs "
                        f"{durable['blocking'] * 1e3:.0f} ms)",
               met=write_ratio <= WRITE_TARGET),
        Target(description=f"async sharded stall <= {STALL_TARGET}x the blocking sharded stall",
               measured=f"{stall_ratio:.3f}x ({stalls['sharded-async'] * 1e3:.1f} vs "
                        f"{stalls['sharded'] * 1e3:.1f} ms)",
               met=stall_ratio <= STALL_TARGET),
    ]
    notes = [
        f"each cell from real `ecrl run --parallel fsdp --model {model}` runs (torchrun, gloo, "
        f"CPU, --threads 1, B=4, fake data, checkpoint every {EVERY} steps, "
        f"{_steps(quick)} steps, retention 2), {rounds} round(s) of the four runs interleaved, "
        "every other round reversed",
        "until durable: the first checkpoint of each run is left out (its buffers' first "
        "touch); blocking gathers the full model and optimizer state to every rank "
        "(torch.distributed.checkpoint.state_dict, full_state_dict) and rank 0 writes it; "
        "sharded takes each rank's own DTensor shards and each rank writes its part",
        "load: the sharded run resumed after a failure at the same world size, and the same "
        "run resumed at world size 1 (DP 2 -> 1)",
    ]
    return BenchResult(name="mesh", command=command_line(), rows=rows, targets=targets,
                       notes=notes)
