"""Case 1: torch ``DistributedSampler(drop_last=False)`` over a data set that the world size does
not divide.

With D = 39 samples and 2 ranks the sampler pads each epoch to 40 indices by repeating the first
ones of the epoch's order, so that both ranks get 20. Every epoch of this loop therefore trains on
one sample twice. The resume logic is correct (it skips the batches the restored step already
consumed); the padding alone is under study.

    ecrl launch --out runs/padding --nproc 2 --strategy blocking --ckpt-every 5 --fail-at 6 \\
        -- python docs/examples/case_padding.py
    ecrl-verify runs/padding
"""

from __future__ import annotations

from _case_common import (
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
    args = parse_args(dataset_size=39, global_batch=8, steps=10)
    _, world = init_distributed()
    data = ecrl.WithSampleIds(Points(args.dataset_size, args.seed))
    sampler, loader = distributed_loader(data, args, world, drop_last=False)
    steps_per_epoch = len(loader)  # ceil(D / W) / L: one more sample than D per epoch
    log = external_step_log(args, steps_per_epoch, name="torch.utils.data.DistributedSampler",
                            drop_last=False)
    model, optimizer = make_model(args.seed)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer}, log=log)
    step = ckpt.restore()
    epoch = step // steps_per_epoch
    while step < args.steps:
        sampler.set_epoch(epoch)
        for cursor, (ids, (x, y)) in enumerate(loader):
            if epoch * steps_per_epoch + cursor < step:
                continue  # consumed before the restored checkpoint
            loss = train_step(model, optimizer, x, y)
            log.step(step, sample_ids=ids, loss=loss, epoch=epoch, cursor_step=cursor)
            ckpt.after_step(step)
            step += 1
            if step == args.steps:
                break
        epoch += 1
    ckpt.close()
    log.close()


if __name__ == "__main__":
    main()
    finish()
