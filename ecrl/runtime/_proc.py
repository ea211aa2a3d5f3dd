"""Process lifetime helpers (Linux; elsewhere they do nothing)."""

from __future__ import annotations

import contextlib
import ctypes
import sys

_PR_SET_PDEATHSIG = 1


def signal_on_parent_death(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent exits.

    Called in a child (``preexec_fn`` or at start-up), so that a parent killed outright never
    leaves an orphan doing its work. Returns whether the request was made.
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    return False
