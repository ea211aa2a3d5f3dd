"""Case 3: a ``DistributedSampler`` loop that skips ``consumed // W`` batches on resume, restarted
at another world size.

The script counts the batches that all ranks consumed in the current epoch (``consumed += W``
after each step) and, on resume, makes each rank skip ``consumed // W`` batches of its loader.
At an unchanged world size that is the number of steps already taken, and the resume is exact.
After a 2 → 1 change the saved count is in batches of the old, smaller local size: the single
rank skips twice as many samples as were consumed, and the samples in between are never trained
on.

    ecrl launch --out runs/skip-batches --world-sizes 2,1 --strategy blocking --ckpt-every 4 \\
        --fail-at 13 -- python docs/examples/case_skip_batches.py
    ecrl-verify runs/skip-batches
"""

from __future__ import annotations

import itertools

from _case_common import (
    LoopState,
    Points,
    distributed_loader,
    external_step_log,
    finish,
    init_distributed,
    make_model,
    parse_args,
    train_step,
)

import ecrl


def main() -> None:
    args = parse_args(dataset_size=80, global_batch=8, steps=20)
    _, world = init_distributed()
    data = ecrl.WithSampleIds(Points(args.dataset_size, args.seed))
    sampler, loader = distributed_loader(data, args, world, drop_last=True)
    steps_per_epoch = len(loader)
    log = external_step_log(args, steps_per_epoch, name="torch.utils.data.DistributedSampler")
    model, optimizer = make_model(args.seed)
    loop = LoopState(epoch=0, consumed=0)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer, "loop": loop}, log=log)
    step = ckpt.restore()
    while step < args.steps:
        epoch = loop["epoch"]
        sampler.set_epoch(epoch)
        skip = loop["consumed"] // world  # the pattern under study
        for cursor, (ids, (x, y)) in enumerate(itertools.islice(loader, skip, None), skip):
            loss = train_step(model, optimizer, x, y)
            log.step(step, sample_ids=ids, loss=loss, epoch=epoch, cursor_step=cursor)
            loop["consumed"] = loop["consumed"] + world
            ckpt.after_step(step)
            step += 1
            if step == args.steps:
                break
        loop["epoch"], loop["consumed"] = epoch + 1, 0
    ckpt.close()
    log.close()


if __name__ == "__main__":
    main()
    finish()
