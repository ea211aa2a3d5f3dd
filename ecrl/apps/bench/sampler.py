"""``ecrl bench sampler``: the stateless permutation against ``torch.randperm`` + slicing.

DistributedSampler-style code materialises ``randperm(D)`` at the start of every epoch (and again
at every resume) and slices the step's window out of it. ECRL computes the window directly. Each
measurement runs in a fresh child process so that its peak memory (``VmHWM`` after resetting it
through ``/proc/self/clear_refs``) belongs to that measurement alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target, command_line

BATCH = 1024
MEMORY_GIB = 24


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> int:
    """Reset the peak-RSS counter to the current RSS and return it (KiB)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass
    return _rss_kib("VmRSS")


def _measure(case: dict[str, Any]) -> dict[str, float]:
    """Run one case in this process; return seconds and peak extra memory in bytes."""
    import numpy as np
    import torch

    from ecrl.contract import semantics

    torch.set_num_threads(1)  # one core for both candidates
    d, kind, repeats = int(case["d"]), case["kind"], int(case["repeats"])
    geometry = semantics.Geometry(dataset_size=d, global_batch=BATCH)

    def ecrl_first_window(epoch: int) -> None:
        # A new epoch every call: nothing is cached between repeats.
        perm = semantics.EpochPermutation(dataset_size=d, seed=1234, epoch=epoch)
        perm.range(0, BATCH)

    def randperm_first_window(epoch: int) -> None:
        gen = torch.Generator().manual_seed(1234 + epoch)
        order = torch.randperm(d, generator=gen)
        order[:BATCH].clone()
        del order

    def ecrl_epoch(epoch: int) -> None:
        perm = semantics.EpochPermutation(dataset_size=d, seed=1234, epoch=epoch)
        chunk = 1 << 20
        n = geometry.samples_per_epoch
        for start in range(0, n, chunk):
            perm.range(start, min(n, start + chunk))

    def ecrl_steps(epoch: int) -> None:
        steps = int(case["steps"])
        state = semantics.SamplerState.at_step(geometry, 1234, epoch * steps)
        stream = state.iter_shards(0, 1)
        for _ in range(steps):
            next(stream)

    def randperm_epoch(epoch: int) -> None:
        gen = torch.Generator().manual_seed(1234 + epoch)
        order = torch.randperm(d, generator=gen)
        for s in range(geometry.steps_per_epoch):
            order[s * BATCH : (s + 1) * BATCH]
        del order

    fn = {
        "ecrl-window": ecrl_first_window,
        "randperm-window": randperm_first_window,
        "ecrl-epoch": ecrl_epoch,
        "ecrl-steps": ecrl_steps,
        "randperm-epoch": randperm_epoch,
    }[kind]
    fn(10_000)  # warm up code paths (not the data: every call uses a new epoch)
    np.zeros(1)
    baseline = _reset_peak()
    samples = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t0)
    peak = _rss_kib("VmHWM")
    samples.sort()
    return {"seconds": samples[len(samples) // 2], "peak_bytes": max(0, peak - baseline) * 1024}


def _child(case: dict[str, Any]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "ecrl.apps.bench.sampler", json.dumps(case)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(*, quick: bool, progress: Progress) -> BenchResult:
    sizes = [10**6, 10**10] if quick else [10**6, 10**8, 10**10]
    repeats = 3 if quick else 7
    # --quick (a smoke run) measures in this process: one torch import instead of six
    measure = _measure if quick else _child
    rows: list[BenchRow] = []
    first_window: dict[int, dict[str, float]] = {}
    for d in sizes:
        progress(f"first window, D={d:.0e}: ecrl")
        ours = measure({"d": d, "kind": "ecrl-window", "repeats": repeats})
        first_window[d] = ours
        # randperm(D) needs 8·D bytes for the int64 result plus its workspace.
        fits = 8 * d * 2 < MEMORY_GIB * 2**30 // 2
        theirs = None
        if fits:
            progress(f"first window, D={d:.0e}: torch.randperm")
            theirs = measure({"d": d, "kind": "randperm-window", "repeats": min(repeats, 3)})
        note = "" if fits else f"randperm({d:.0e}) needs {16 * d / 2**30:.0f} GiB: skipped"
        rows.append(BenchRow(
            candidate="ecrl window", alternative="randperm+slice",
            metric=f"first window of an epoch, ms (D={d:.0e}, B={BATCH}; lower is better)",
            candidate_value=ours["seconds"] * 1e3,
            alternative_value=theirs["seconds"] * 1e3 if theirs else None, note=note))
        rows.append(BenchRow(
            candidate="ecrl window", alternative="randperm+slice",
            metric=f"peak extra memory, MiB (D={d:.0e}; lower is better)",
            candidate_value=ours["peak_bytes"] / 2**20,
            alternative_value=theirs["peak_bytes"] / 2**20 if theirs else None, note=note))

    epoch_d = 10**6 if quick else 10**7
    progress(f"whole epoch, D={epoch_d:.0e}")
    ours_epoch = measure({"d": epoch_d, "kind": "ecrl-epoch", "repeats": 3})
    theirs_epoch = measure({"d": epoch_d, "kind": "randperm-epoch", "repeats": 3})
    n = (epoch_d // BATCH) * BATCH
    ours_rate = n / ours_epoch["seconds"]
    rows.append(BenchRow(
        candidate="ecrl epoch (1M-ID chunks)", alternative="randperm epoch + slices",
        metric=f"sustained IDs/s over a whole epoch, millions (D={epoch_d:.0e}; higher is better)",
        candidate_value=ours_rate / 1e6,
        alternative_value=n / theirs_epoch["seconds"] / 1e6))
    steps = 200 if quick else 2000
    progress(f"step by step, {steps} steps")
    ours_steps = measure({"d": 10**8, "kind": "ecrl-steps", "repeats": 3, "steps": steps})
    step_rate = steps * BATCH / ours_steps["seconds"]
    rows.append(BenchRow(
        candidate="ecrl SamplerState.iter_shards", alternative="randperm epoch + slices",
        metric=f"IDs/s fetching one {BATCH}-ID window per step, millions (higher is better)",
        candidate_value=step_rate / 1e6,
        alternative_value=n / theirs_epoch["seconds"] / 1e6,
        note=f"D=1e8 for ecrl; randperm figure from D={epoch_d:.0e}"))

    big = first_window[sizes[-1]]
    small = first_window[sizes[0]]
    targets = [
        Target(description="first window of an epoch at D=1e10 under 10 ms",
               measured=f"{big['seconds'] * 1e3:.2f} ms", met=big["seconds"] < 0.010),
        Target(description="memory independent of D (first window, smallest vs largest D, "
                           "within 1 MiB)",
               measured=f"{small['peak_bytes'] / 2**20:.2f} MiB vs "
                        f"{big['peak_bytes'] / 2**20:.2f} MiB",
               met=abs(big["peak_bytes"] - small["peak_bytes"]) <= 2**20),
        Target(description="at least 10 million IDs/s sustained on one core",
               measured=f"{ours_rate / 1e6:.1f} M IDs/s (whole epoch)", met=ours_rate >= 10e6),
    ]
    return BenchResult(
        name="sampler", command=command_line(), rows=rows, targets=targets,
        notes=[f"one thread for both (torch.set_num_threads(1)); B={BATCH}; each cell is the "
               "median of repeated runs in a fresh child process"
               + (" (--quick: all in this process)" if quick else "")])


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
