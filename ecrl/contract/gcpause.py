"""Python's cyclic garbage collector held off while a burst of short-lived objects is made.

A collection starts after every 700 net container allocations and walks what is young (and, every
tenth and hundredth time, what is older). A burst that builds thousands of small dicts and lists
that are all freed soon after (a parsed block of step records, a checkpoint's state walked at a
step boundary) pays for collections that find nothing to free.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collection_paused"]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the caller's setting comes back after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
