"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP): ``sharded`` and
``sharded-async``.

Every rank hands DCP the same state (model, optimizer, scheduler, sampler, every rank's RNG
states: the StatePack tree of :mod:`ecrl.runtime.checkpoint.statepack`, its tensors as DCP entries,
the rest as JSON in ECRL's manifest). DCP's planner gives each replicated tensor to one rank,
balancing the bytes, so every rank writes its own part (``__R_0.distcp``) of one checkpoint.

The commit follows ECRL's rule, not DCP's: DCP fsyncs its files but never the directory, and
knows nothing of ``latest.json``. Per checkpoint at step ``c``
(:meth:`ShardedCheckpoints._persist`):

1. rank 0 creates ``checkpoints/.step-C.dcp.aA.tmp/``; barrier;
2. every rank writes its part (DCP, fsync'd; hashed as it is written) and fsyncs the
   directory; rank 0 (DCP's coordinator) writes ``.metadata``;
3. the parts' sizes and SHA-256 are gathered to rank 0, which hashes ``.metadata`` and writes
   ``ecrl-manifest.json`` (atomically, fsync'd, directory fsync'd): the checkpoint's checksum is
   the manifest's hash (:mod:`ecrl.contract.shardfile`);
4. rank 0 renames the directory to ``step-C.dcp`` and fsyncs ``checkpoints/``;
5. rank 0 appends the checkpoint event, replaces ``latest.json`` (atomically), applies retention.

A crash anywhere before 5 leaves ``latest.json`` naming the previous checkpoint, whole.
``sharded`` runs this on the training thread (training waits; a barrier ends the boundary).
``sharded-async`` copies the state to CPU buffers on the training thread (the stall) and runs the
protocol on a background thread over a gloo process group of its own, ``max_inflight`` checkpoints
at most in flight (the next one waits: back-pressure); :meth:`close` waits for every one.

Loading (:func:`load`) works at any world size (each rank reads every chunk) and runs no code:
DCP's load is not used (its default planner passes byte entries to ``torch.load``); ECRL's
reader checks ``.metadata`` against the manifest, parses it into plain records
(:func:`ecrl.contract.shardfile.chunk_locations`: no class of torch's or anyone's is called),
refuses a chunk placed in any file the manifest does not cover, and hashes each part as it reads
it; no pickled object is ever stored (non-tensor state is JSON). Links and special
files in the checkpoint directory, and recycled parts replaced by a link, are refused
(:mod:`ecrl.contract.safepath`).

``ECRL_CRASH_AT=sharded:POINT[:N[:ATTEMPT]]`` kills a process at ``POINT`` of its N-th sharded
checkpoint (:data:`ecrl.runtime.checkpoint.persist.SHARDED_POINTS`; ``enospc`` fails the part's
write with ``OSError(ENOSPC)``); ``ECRL_CRASH_RANK`` limits it to one rank.

The code: :mod:`._storage` (DCP's storage: byte-entry chunks, hashing, recycled parts, crash
points), :mod:`._commit` (the strategies and the commit protocol), :mod:`._reuse` (an encoding
of the state kept from one checkpoint to the next), :mod:`._load` (loading).
"""

from __future__ import annotations

from ecrl.runtime.checkpoint.sharded._commit import (
    AsyncShardedCheckpoints,
    ShardedCheckpoints,
    ShardedSaveFailed,
)
from ecrl.runtime.checkpoint.sharded._load import load
from ecrl.runtime.checkpoint.sharded._storage import CRASH_RANK_ENV, shard_name

__all__ = ["CRASH_RANK_ENV", "ShardedSaveFailed", "ShardedCheckpoints",
           "AsyncShardedCheckpoints", "shard_name", "load"]
