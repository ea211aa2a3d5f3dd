"""The checkpoint strategies' names: part of the run format (torch-free).

``run.json`` names the strategy of a run and every checkpoint event names the one that wrote it,
so the names belong to the contract the verifier reads, not to the runtime that implements them.
This is the one table of them, with the line each help text shows; the runtime's registry
(:mod:`ecrl.runtime.checkpoint.registry`) binds an implementation to each name, and every other
list of names (``--strategy``'s choices, the crash campaign, the benchmarks, help texts) is
derived from here or from the registry.
"""

from __future__ import annotations

__all__ = ["SUMMARIES", "STRATEGIES", "describe"]

SUMMARIES: dict[str, str] = {
    "none": "no checkpoints (a failure restarts from step 0)",
    "blocking": "training waits while rank 0 writes the checkpoint",
    "overlapped": "rank 0 copies the state; a background process writes it",
    "sharded": "every rank writes its part (torch.distributed.checkpoint); training waits for "
               "the commit",
    "sharded-async": "every rank copies the state to CPU; a background thread writes its part "
                     "and commits",
    "jit": "a healthy rank saves when a peer dies or hangs (at most one step replayed); "
           "--ckpt-every K adds a fallback every K steps",
}
"""Every strategy name, in the order help texts list them, with its one-line summary."""

STRATEGIES: tuple[str, ...] = tuple(SUMMARIES)
"""Every checkpoint strategy a manifest may name."""


def describe(names: tuple[str, ...] = STRATEGIES) -> str:
    """``"none, blocking, … or jit"``: names as a help text lists them."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} or {names[-1]}"
