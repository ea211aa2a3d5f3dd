"""``--verify-follow``: ``ecrl-verify --follow`` in a process beside the run.

The runtime never imports the verifier (only the applications do), so the follower is the
verifier's command line, started once the run directory exists: it prints each anomaly on the
supervisor's stderr as soon as the logs prove it, and ends by itself after the supervisor writes
the run's final status to ``supervisor.json``. Its JSON report (stdout) gives the verdict for the
run's summary.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Follower", "FOLLOW_WAIT_S"]

FOLLOW_WAIT_S = 120.0
"""How long the supervisor waits, once the run ended, for the follower's final verification."""


@dataclass(slots=True)
class Follower:
    root: Path
    process: subprocess.Popen[str] | None = field(default=None, init=False)

    def start(self) -> None:
        # One worker process: the follower shares the machine with the ranks it watches.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "verifier.cli", "--follow", str(self.root), "--format",
             "json", "--jobs", "1"], stdout=subprocess.PIPE, stderr=None, text=True)

    def verdict(self, timeout: float = FOLLOW_WAIT_S) -> str:
        """The follower's final verdict (after the run ended), or why there is none."""
        if self.process is None:
            return "not started"
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"no verdict: ecrl-verify --follow did not end within {timeout:.0f} s"
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            verdict = json.loads(out)["verdict"]
            if verdict in ("PASS", "FAIL", "UNKNOWN"):
                return str(verdict)
        return f"no verdict: ecrl-verify --follow exited {self.process.returncode}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
