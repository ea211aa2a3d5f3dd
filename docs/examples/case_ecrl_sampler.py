"""Case 6: the same kind of loop fed by ECRL's sampler, across world sizes 2 → 1 → 2.

``ecrl.GlobalBatchSampler`` yields this rank's shard of each step's window and rides in the
checkpoint; restored at another world size it re-shards the same windows. The verifier knows its
order, so it checks every step's window, not only per-epoch exactly-once.

    ecrl launch --out runs/ecrl-sampler --world-sizes 2,1,2 --strategy blocking --ckpt-every 2 \\
        --fail-at 4,9 -- python docs/examples/case_ecrl_sampler.py
    ecrl-verify runs/ecrl-sampler
"""

from __future__ import annotations

from _case_common import Points, finish, init_distributed, make_model, parse_args, train_step
from torch.utils.data import DataLoader

import ecrl


def main() -> None:
    args = parse_args(dataset_size=40, global_batch=8, steps=15,
                      extra=[("--workers", {"type": int, "default": 2})])
    init_distributed()
    data = ecrl.WithSampleIds(Points(args.dataset_size, args.seed))
    sampler = ecrl.GlobalBatchSampler(args.dataset_size, args.global_batch, seed=args.seed,
                                      steps=args.steps)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=args.workers)
    log = ecrl.StepLog(args.run_dir, sampler=sampler, steps=args.steps)
    model, optimizer = make_model(args.seed)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer, "sampler": sampler},
                             log=log)
    step = ckpt.restore()
    for ids, (x, y) in loader:
        loss = train_step(model, optimizer, x, y)
        log.step(step, sample_ids=ids, loss=loss)
        ckpt.after_step(step)
        step += 1
    ckpt.close()
    log.close()


if __name__ == "__main__":
    main()
    finish()
