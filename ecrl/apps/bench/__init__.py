"""``ecrl bench NAME``: side-by-side benchmarks, one module per benchmark.

Each module exposes ``run(*, quick: bool, progress: Progress) -> BenchResult``; it is imported
only when asked for, so ``ecrl --help`` stays fast and a benchmark that is not built yet says so.
"""

from __future__ import annotations

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target

__all__ = ["BENCHES", "TORCH_BENCHES", "BenchResult", "BenchRow", "Progress", "Target"]

BENCHES: dict[str, tuple[str, str]] = {
    "sampler": ("ecrl.apps.bench.sampler",
                "stateless keyed permutation vs torch.randperm + slicing"),
    "checkpoint": ("ecrl.apps.bench.checkpoint",
                   "blocking vs overlapped stall; overlapped and jit throughput vs none"),
    "recovery": ("ecrl.apps.bench.recovery",
                 "time lost to one failure: jit vs overlapped and blocking every K"),
    "verify": ("ecrl.apps.bench.verify", "ecrl-verify vs the raw JSON parse of the same logs"),
    "schedule": ("ecrl.apps.bench.schedule", "exact fast schedulers vs the naive CheckHint DP"),
    "transform": ("ecrl.apps.bench.transform", "transformed training program vs the original"),
    "library": ("ecrl.apps.bench.library",
                "step log + ID wrapper overhead; GlobalBatchSampler vs DistributedSampler"),
    "mesh": ("ecrl.apps.bench.mesh",
             "FSDP2: each rank writes its shards vs gather to rank 0; async stall; reshard load"),
    "frameworks": ("ecrl.apps.bench.frameworks",
                   "Lightning, Accelerate and Trainer step with ECRL's integration vs without"),
}
"""name -> (module, one-line description)."""

TORCH_BENCHES = frozenset({"sampler", "checkpoint", "recovery", "transform", "library",
                           "frameworks", "mesh"})
"""The benchmarks that train or time torch: without it (``pip install ecrl``) they are refused,
and ``ecrl bench all`` runs the others."""
