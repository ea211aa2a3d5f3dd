"""Process lifetime helpers (Linux; elsewhere they do nothing)."""

from __future__ import annotations

import contextlib
import ctypes
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
NAME_BYTES = 15
"""The longest process name Linux keeps (``/proc/PID/comm``; 16 bytes with the NUL)."""


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


def name_process(name: str) -> bool:
    """Set this process's name as ``ps``, ``top`` and ``/proc/PID/comm`` show it (at most
    :data:`NAME_BYTES` bytes: longer names are refused, not cut). Returns whether it was set.

    A process forked without ``exec`` keeps its parent's command line and initial environment
    in ``/proc``; its name is the one thing about it that it can change there."""
    encoded = name.encode()
    if len(encoded) > NAME_BYTES:
        raise ValueError(f"process name {name!r} is longer than {NAME_BYTES} bytes")
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0) == 0
    return False
