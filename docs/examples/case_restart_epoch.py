"""Case 2: the common loop that checkpoints its epoch number and restarts that epoch on resume.

The script checkpoints every few steps (model, optimizer and its epoch counter) and, when it
resumes, continues the global step count from the checkpoint but iterates the saved epoch from
its first batch again. The batches of that epoch that the checkpoint had already trained on are
trained on a second time.

    ecrl launch --out runs/restart-epoch --nproc 2 --strategy blocking --ckpt-every 3 \\
        --fail-at 7 -- python docs/examples/case_restart_epoch.py
    ecrl-verify runs/restart-epoch
"""

from __future__ import annotations

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
    args = parse_args(dataset_size=40, global_batch=8, steps=15)
    _, world = init_distributed()
    data = ecrl.WithSampleIds(Points(args.dataset_size, args.seed))
    sampler, loader = distributed_loader(data, args, world, drop_last=True)
    steps_per_epoch = len(loader)
    log = external_step_log(args, steps_per_epoch, name="torch.utils.data.DistributedSampler")
    model, optimizer = make_model(args.seed)
    loop = LoopState(epoch=0)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer, "loop": loop}, log=log)
    step = ckpt.restore()
    while step < args.steps:
        epoch = loop["epoch"]
        sampler.set_epoch(epoch)
        # The pattern under study: the epoch starts over from its first batch, whatever
        # step the checkpoint was taken at.
        for cursor, (ids, (x, y)) in enumerate(loader):
            loss = train_step(model, optimizer, x, y)
            log.step(step, sample_ids=ids, loss=loss, epoch=epoch, cursor_step=cursor)
            ckpt.after_step(step)
            step += 1
            if step == args.steps:
                break
        loop["epoch"] = epoch + 1
    ckpt.close()
    log.close()


if __name__ == "__main__":
    main()
    finish()
