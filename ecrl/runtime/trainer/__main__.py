"""A rank of the built-in trainer, as torchrun starts it (``python -m ecrl.runtime.trainer``).

A rank's imports (torch, ``torch._dynamo``, the runtime) make about a million objects and almost
no garbage. With Python's cyclic collector on, they set off hundreds of collections that walk them
and free nothing: about a seventh of a short attempt's CPU on each rank, paid again at every
relaunch. So the imports run with the collector held off, and what they made is then frozen out
of later collections (:func:`gc.freeze`), so that the training loop's own collections do not walk
torch's modules either. ``torch._dynamo`` is among the imports because torch's optimizers import
it when one is built (``torch._disable_dynamo``), and every run builds one.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

from ecrl.contract.gcpause import collection_paused


def load() -> Callable[[], int]:
    """Import the trainer with the collector held off, freeze what the imports made, and
    return its ``main``."""
    with collection_paused():
        import torch._dynamo  # noqa: F401 - see the module's docstring

        from ecrl.runtime.trainer.trainer import main
    gc.freeze()
    return main


if __name__ == "__main__":
    sys.exit(load()())
