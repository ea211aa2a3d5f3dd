"""The torchrun of ``ecrl run``: torchrun's own agent, in an interpreter that has already imported
the built-in trainer, starting each rank as a fork of itself.

Started as a new interpreter, every rank of every attempt imports torch, ``torch._dynamo`` and the
trainer before it can join its process group: about 2 s of CPU per rank on this project's 2-core
test machine, paid again at every restart, and nearly all the CPU a short attempt's rank spends.
Here those imports run once per attempt, in the agent, with the collector held off and their
objects frozen (:func:`ecrl.runtime.trainer.__main__.load`); then torchrun's own ``main`` runs,
flags, rendezvous, monitoring and the SIGTERM-then-SIGKILL end of a failed attempt included, with
two of torchrun's own options: ``--start-method fork`` (a worker is a fork
of this process, its memory shared copy-on-write) and ``--run-path`` (the worker runs a script,
:mod:`ecrl.runtime.trainer.rank_entry`, in that process).

Nothing a rank must own is made before the fork: the imports initialise no device (CUDA starts in
the rank), open no file of the run, start no thread, and every rank seeds its generators from
``(seed, rank, step)`` itself (the RNG policy); Python's ``random`` is reseeded by every fork.

Run as ``python -m ecrl.runtime.trainer.agent TORCHRUN_ARGS`` (:func:`forked_torchrun`), or, where
the supervisor may fork, as a fork of the supervisor itself, which then calls :func:`preload` once
for the whole run (:func:`ecrl.runtime.supervision.command.start_torchrun`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from ecrl.contract.gcpause import collection_paused

__all__ = ["AGENT_MODULE", "RANK_ENTRY", "RANK_NAME", "forked_torchrun", "import_torchrun",
           "preload"]

AGENT_MODULE = "ecrl.runtime.trainer.agent"

RANK_ENTRY = str(Path(__file__).with_name("rank_entry.py"))
"""The script each forked worker runs (torchrun's ``--run-path``)."""

RANK_NAME = "ecrl rank {}"
"""A forked rank's process name (``ps``, ``/proc/PID/comm``), with its global rank."""


def forked_torchrun(launch: Sequence[str]) -> list[str]:
    """The command line of an attempt's agent: torchrun's ``launch`` options, its ranks forked
    from an interpreter that imported the trainer."""
    return [sys.executable, "-m", AGENT_MODULE, *launch,
            "--start-method", "fork", "--run-path", RANK_ENTRY]


def import_torchrun() -> Callable[..., None]:
    """Import torchrun with the collector held off; its ``main``."""
    with collection_paused():
        import torch.distributed.run as torchrun
    return cast(Callable[..., None], torchrun.main)


def preload() -> Callable[..., None]:
    """Import torchrun and the trainer (then freeze what the imports made); torchrun's ``main``."""
    from ecrl.runtime.trainer.__main__ import load

    torchrun_main = import_torchrun()
    load()  # the trainer's imports, then everything imported so far frozen (torchrun's too)
    return torchrun_main


def main() -> None:
    preload()()


if __name__ == "__main__":
    main()
