"""Case 4: torchdata's ``StatefulDataLoader`` (two workers) resumed from its own ``state_dict``.

The loader and its ``StatefulDistributedSampler`` ride in the checkpoint (the loader is
Stateful); the loop derives its epoch from the restored step, as trainers commonly do
(``epoch = step // steps_per_epoch``), and trusts the loader to continue where it stopped.
Run it killed in the middle of an epoch and killed right after an epoch's last step, then the
latter again with the loop entering the checkpointed step's epoch (``--resume-into checkpoint``):

    ecrl launch --out runs/stateful-mid --nproc 2 --strategy blocking --ckpt-every 3 \\
        --fail-at 7 -- python docs/examples/case_stateful_dataloader.py
    ecrl launch --out runs/stateful-end --nproc 2 --strategy blocking --ckpt-every 5 \\
        --fail-at 9 -- python docs/examples/case_stateful_dataloader.py
    ecrl-verify runs/stateful-end --same-order runs/stateful-mid
    ecrl launch --out runs/stateful-end-fixed --nproc 2 --strategy blocking --ckpt-every 5 \\
        --fail-at 9 -- python docs/examples/case_stateful_dataloader.py --resume-into checkpoint
    ecrl-verify runs/stateful-end-fixed --same-order runs/stateful-mid
"""

from __future__ import annotations

from _case_common import (
    Points,
    external_step_log,
    finish,
    init_distributed,
    make_model,
    parse_args,
    train_step,
)
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

import ecrl


def main() -> None:
    args = parse_args(dataset_size=40, global_batch=8, steps=15,
                      extra=[("--workers", {"type": int, "default": 2}),
                             ("--resume-into", {"choices": ["next", "checkpoint"],
                                                "default": "next",
                                                "help": "the epoch a resumed loop enters: the "
                                                        "next step's (common) or the "
                                                        "checkpointed step's"})])
    _, world = init_distributed()
    data = ecrl.WithSampleIds(Points(args.dataset_size, args.seed))
    sampler = StatefulDistributedSampler(data, shuffle=True, seed=args.seed, drop_last=True)
    loader = StatefulDataLoader(data, batch_size=args.global_batch // world, sampler=sampler,
                                drop_last=True, num_workers=args.workers)
    steps_per_epoch = len(loader)
    log = external_step_log(args, steps_per_epoch,
                            name="torchdata.stateful_dataloader.StatefulDataLoader",
                            sampler_class="StatefulDistributedSampler", workers=args.workers)
    model, optimizer = make_model(args.seed)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer, "loader": loader}, log=log)
    step = ckpt.restore()
    # Where the loop stands; each new epoch starts at cursor 0.
    epoch, cursor = divmod(step, steps_per_epoch)
    if args.resume_into == "checkpoint" and step > 0:
        # The epoch of the checkpointed step, even when that step ended it: the restored
        # loader belongs to that epoch's pass.
        epoch, cursor = divmod(step - 1, steps_per_epoch)
        cursor += 1
    while step < args.steps:
        sampler.set_epoch(epoch)
        for ids, (x, y) in loader:  # a restored loader continues its epoch by itself
            loss = train_step(model, optimizer, x, y)
            log.step(step, sample_ids=ids, loss=loss, epoch=epoch,
                     cursor_step=cursor)
            ckpt.after_step(step)
            step, cursor = step + 1, cursor + 1
            if step == args.steps:
                break
        epoch, cursor = epoch + 1, 0
    ckpt.close()
    log.close()


if __name__ == "__main__":
    main()
    finish()
