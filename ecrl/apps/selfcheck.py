"""``ecrl selfcheck``: the sampling contract checked on small cases, with a worked example.

Useful on a new machine (numpy's uint64 arithmetic is what the permutation rests on) and as a
readable demonstration of the contract in ``docs/semantics.md``.
"""

from __future__ import annotations

import numpy as np

from ecrl.contract import semantics as sem


def worked_example(dataset_size: int = 10, global_batch: int = 4, world_size: int = 2,
                   seed: int = 0) -> list[str]:
    geometry = sem.Geometry(dataset_size=dataset_size, global_batch=global_batch)
    perm = sem.epoch_permutation(dataset_size=dataset_size, seed=seed, epoch=0)
    lines = [
        f"D={dataset_size}, B={global_batch}, W={world_size}, seed={seed}: "
        f"S={geometry.steps_per_epoch} steps/epoch, N={geometry.samples_per_epoch} samples used",
        f"perm_0 = {perm.range(0, dataset_size).tolist()}",
    ]
    for g in range(geometry.steps_per_epoch):
        shards = [sem.shard(geometry, seed, g, r, world_size).tolist() for r in range(world_size)]
        win = sem.window(geometry, seed, g)
        lines.append(
            f"step {g}: window {win.tolist()} hash {sem.format_hash(sem.ids_hash(win))}; "
            + "; ".join(f"rank {r} {s}" for r, s in enumerate(shards))
        )
    return lines


def _checks() -> list[tuple[str, bool]]:
    results: list[tuple[str, bool]] = []
    for d in (1, 2, 3, 7, 10, 64, 65, 1000, 4099):
        perm = sem.EpochPermutation(dataset_size=d, seed=42, epoch=3)
        ids = perm.range(0, d)
        results.append((f"perm is a bijection on [0, {d})",
                        bool(np.array_equal(np.sort(ids), np.arange(d)))))
    geometry = sem.Geometry(dataset_size=1000, global_batch=12)
    for g in (0, 5, geometry.steps_per_epoch + 2):
        win = sem.window(geometry, 9, g)
        same = all(
            np.array_equal(np.concatenate([sem.shard(geometry, 9, g, r, w) for r in range(w)]),
                           win)
            for w in (1, 2, 3, 4, 6, 12)
        )
        results.append((f"step {g}: shards of every W divide the same window", same))
        additive = sem.combine_hashes(
            sem.ids_hash(sem.shard(geometry, 9, g, r, 4)) for r in range(4)
        ) == sem.ids_hash(win)
        results.append((f"step {g}: shard hashes add up to the window hash", additive))
    return results


def run_selfcheck(*, verbose: bool) -> int:
    if verbose:
        print("\n".join(worked_example()))
    failed = 0
    for name, ok in _checks():
        failed += not ok
        if verbose or not ok:
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print("selfcheck: " + ("all checks passed" if not failed else f"{failed} checks FAILED"))
    return 1 if failed else 0
