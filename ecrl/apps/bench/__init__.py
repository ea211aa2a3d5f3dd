"""``ecrl bench NAME``: side-by-side benchmarks, one module per benchmark.

Each module exposes ``run(*, quick: bool, progress: Progress) -> BenchResult``; it is imported
only when asked for, so ``ecrl --help`` stays fast and a benchmark that is not built yet says so.
"""

from __future__ import annotations

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target

__all__ = ["BENCHES", "BenchResult", "BenchRow", "Progress", "Target"]

BENCHES: dict[str, tuple[str, str]] = {
    "sampler": ("ecrl.apps.bench.sampler",
                "stateless keyed permutation vs torch.randperm + slicing"),
    "checkpoint": ("ecrl.apps.bench.checkpoint",
                   "blocking vs overlapped stall; throughput vs none"),
    "verify": ("ecrl.apps.bench.verify", "ecrl-verify vs the raw JSON parse of the same logs"),
    "schedule": ("ecrl.apps.bench.schedule", "exact fast schedulers vs the naive CheckHint DP"),
    "transform": ("ecrl.apps.bench.transform", "transformed training program vs the original"),
    "library": ("ecrl.apps.bench.library",
                "step log + ID wrapper overhead; GlobalBatchSampler vs DistributedSampler"),
}
"""name -> (module, one-line description)."""
