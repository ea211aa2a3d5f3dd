"""Ctrl-C, SIGTERM and SIGHUP stop the job cleanly instead of killing the supervisor."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["STOP_SIGNALS", "stop_signals"]

# SIGHUP: the terminal was closed; stop the job cleanly, like Ctrl-C, so that the run is recorded
# as stopped and continues later, instead of dying with torchrun orphaned.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Within the block, each stop signal calls ``on_signal(signum)``; the previous handlers
    come back afterwards."""

    def handler(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
