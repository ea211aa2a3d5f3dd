"""Bounded hang detection: a per-rank thread that notices when steps stop completing.

A peer that hangs (stopped, deadlocked, a GPU stuck) does not close its connections, so the
survivors' next collective simply waits: torchrun's defaults let that last 10 to 30 minutes. Each
rank runs a :class:`Watchdog` thread; the step boundary calls :meth:`Watchdog.beat`. When no beat
comes for longer than the bound, the thread calls ``on_hang`` (the checkpointer writes
``hung-rank-R.json``, the ``jit`` strategy saves from the healthy replica, and the process
exits), so the supervisor sees a ``hung`` attempt within the bound. The stopped rank is the one
that wrote no marker: its own watchdog is stopped with it.

The bound: ``bound_s`` when given; otherwise ``multiple`` × the 99th percentile of the recent
step intervals, at least ``floor_s``, plus the longest checkpoint boundary seen (a blocking
checkpoint is a long step that is not a hang). The clock starts at the attempt's first beat: the
first step carries the start-up (data, model, compilation).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ecrl.runtime.endings import HUNG_MARKER

__all__ = ["WatchdogConfig", "Watchdog", "HUNG_EXIT_CODE", "HUNG_MARKER"]

HUNG_EXIT_CODE = 77


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchdogConfig:
    """How long a step may take before its rank calls the job hung."""

    bound_s: float | None = None
    """Fixed bound in seconds (None: derived from the step times; 0: no watchdog)."""
    multiple: float = 10.0
    """Derived bound: this many times the p99 step interval."""
    floor_s: float = 30.0
    """Derived bound: never less than this."""
    window: int = 200
    """Derived bound: step intervals the percentile is taken over."""

    def __post_init__(self) -> None:
        if self.bound_s is not None and self.bound_s < 0:
            raise ValueError("the hang bound must be >= 0 seconds (0: no watchdog)")
        if self.multiple <= 0 or self.floor_s <= 0 or self.window < 1:
            raise ValueError("the hang multiple, floor and window must be positive")

    @property
    def enabled(self) -> bool:
        return self.bound_s != 0


class Watchdog:
    """Calls ``on_hang(waited_s, bound_s, last_step)`` once when steps stop completing."""

    def __init__(self, config: WatchdogConfig,
                 on_hang: Callable[[float, float, int | None], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.on_hang = on_hang
        self.clock = clock
        self._intervals: deque[float] = deque(maxlen=config.window)
        self._last_beat: float | None = None
        self._last_step: int | None = None
        self._max_boundary = 0.0
        self._stop = threading.Event()
        self._fired = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.config.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ecrl-watchdog", daemon=True)
            self._thread.start()

    def beat(self, step: int) -> None:
        now = self.clock()
        if self._last_beat is not None:
            self._intervals.append(now - self._last_beat)
        self._last_beat = now
        self._last_step = step

    def boundary(self, seconds: float) -> None:
        """A checkpoint boundary took ``seconds``: later bounds allow for one."""
        self._max_boundary = max(self._max_boundary, seconds)

    def bound(self) -> float:
        c = self.config
        if c.bound_s:
            return c.bound_s
        p99 = 0.0
        if self._intervals:
            ordered = sorted(self._intervals)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return max(c.floor_s, c.multiple * p99) + self._max_boundary

    def check(self) -> bool:
        """One look (the thread's loop body): True when it fired."""
        if self._fired or self._last_beat is None:
            return False
        waited, bound = self.clock() - self._last_beat, self.bound()
        if waited <= bound:
            return False
        self._fired = True
        self.on_hang(waited, bound, self._last_step)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(max(0.05, min(1.0, self.bound() / 20)))
            if self._stop.is_set() or self.check():
                return

    def stop(self) -> None:
        self._stop.set()
