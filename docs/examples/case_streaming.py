"""Case 5: Mosaic Streaming's ``StreamingDataset`` over local MDS shards, resumed 2 → 1 from its
own ``state_dict``.

The shards are written by Streaming's ``MDSWriter`` (each sample carries its ``id`` column, so
the IDs that reach a step come with the samples). The loader is a ``StreamingDataLoader`` with
two workers; it rides in the checkpoint (its ``state_dict`` is the data set's resume point:
epoch and samples consumed, counted over all ranks). Streaming claims elastic determinism: with
the same global batch, a run resumed at another number of ranks sees the samples it would have
seen without the interruption.

    python docs/examples/case_streaming.py --write-shards data-mds
    ecrl launch --out runs/streaming-2to1 --world-sizes 2,1 --strategy blocking --ckpt-every 2 \\
        --fail-at 6 -- python docs/examples/case_streaming.py --data data-mds
    ecrl launch --out runs/streaming-2to2 --world-sizes 2 --strategy blocking --ckpt-every 2 \\
        --fail-at 6 -- python docs/examples/case_streaming.py --data data-mds
    ecrl-verify runs/streaming-2to1 --same-order runs/streaming-2to2
"""

from __future__ import annotations

import numpy as np
from _case_common import (
    FEATURES,
    Points,
    external_step_log,
    finish,
    init_distributed,
    make_model,
    parse_args,
    train_step,
)
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset

import ecrl


def write_shards(out: str, size: int, seed: int) -> None:
    """The data set as MDS shards, several samples per shard, with each sample's ID."""
    points = Points(size, seed)
    columns = {"id": "int", "x": f"ndarray:float32:{FEATURES}", "y": "int"}
    with MDSWriter(out=out, columns=columns, size_limit=1 << 9) as writer:
        for i in range(size):
            writer.write({"id": i, "x": points.x[i].numpy().astype(np.float32),
                          "y": int(points.y[i])})


def main() -> None:
    args = parse_args(dataset_size=40, global_batch=8, steps=10,
                      extra=[("--data", {"help": "directory of the MDS shards"}),
                             ("--write-shards", {"metavar": "DIR",
                                                 "help": "write the shards and exit"}),
                             ("--workers", {"type": int, "default": 2})])
    if args.write_shards:
        write_shards(args.write_shards, args.dataset_size, args.seed)
        return
    _, world = init_distributed()
    local_batch = args.global_batch // world
    dataset = StreamingDataset(local=args.data, batch_size=local_batch, shuffle=True,
                               shuffle_seed=args.seed, num_canonical_nodes=1)
    loader = StreamingDataLoader(dataset, batch_size=local_batch, num_workers=args.workers,
                                 drop_last=True)
    steps_per_epoch = args.dataset_size // args.global_batch
    log = external_step_log(args, steps_per_epoch, name="streaming.StreamingDataset",
                            loader="streaming.StreamingDataLoader", workers=args.workers,
                            num_canonical_nodes=1)
    model, optimizer = make_model(args.seed)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": optimizer, "loader": loader},
                             log=log)
    step = ckpt.restore()
    # Where the loop stands; each new epoch starts at cursor 0.
    epoch, cursor = divmod(step, steps_per_epoch)
    while step < args.steps:
        for batch in loader:  # Streaming keeps its own epoch count and resume point
            loss = train_step(model, optimizer, batch["x"], batch["y"])
            log.step(step, sample_ids=batch["id"], loss=loss, epoch=epoch,
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
