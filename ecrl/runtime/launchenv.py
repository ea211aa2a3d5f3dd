"""What the supervisor tells each rank about its attempt, through the environment (torch-free).

``ecrl run`` and ``ecrl launch`` start every attempt under torchrun with these variables set; the
library (:mod:`ecrl` public API: the step log, the checkpointer, failure injection) reads them,
so a user's own script needs no extra command-line arguments and its own ``argv`` stays its own.
A script started without the supervisor (plain ``python`` or ``torchrun``) finds none of them:
:meth:`AttemptEnv.from_environ` returns None and the library runs standalone.

One variable per field, named ``ECRL_<FIELD>`` (``ECRL_RUN_DIR``, ``ECRL_ATTEMPT``, …); integer
lists are comma-separated, absent optional values are absent variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ecrl.contract.errors import ConfigError
from ecrl.runtime.supervision.standby import GO_VARIABLE, await_go

__all__ = ["PREFIX", "AttemptEnv"]

PREFIX = "ECRL_"


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptEnv:
    """One attempt of a supervised run, as every rank of it sees it."""

    run_dir: str
    """Absolute path of the run directory."""
    attempt: int
    """Attempt number (0 for the first launch)."""
    resume_step: int | None = None
    """Global step of the checkpoint to resume from (None: fresh start)."""
    resume_path: str | None = None
    """That checkpoint's path, relative to ``checkpoints/`` (as ``latest.json`` names it)."""
    resume_checksum: str | None = None
    """That checkpoint's checksum as ``latest.json`` recorded it."""
    fail_at: tuple[int, ...] = ()
    """Global steps after which a failure is still to be injected in this attempt."""
    fail_rank: int = 0
    """The rank that exits at an injected failure."""
    strategy: str = "blocking"
    """Checkpoint strategy of the run."""
    ckpt_every: int = 0
    """Checkpoint after every K-th step (0: never)."""
    keep_checkpoints: int = 2
    """Retention: the newest K checkpoints are kept."""
    max_inflight: int = 2
    """Overlapped strategy: pending background writes before back-pressure."""
    world_sizes: tuple[int, ...] = ()
    """The run's world-size schedule (for run.json; each attempt's own comes from torchrun)."""
    deadline: float | None = None
    """Unix time by which a final checkpoint must be committed (None: no deadline)."""
    deadline_k1: float = 10.0
    """Deadline buffer rule: multiplier of the longest step time
    (:mod:`ecrl.runtime.checkpoint.deadline`)."""
    deadline_k2: float = 2.0
    """Deadline buffer rule: multiplier of the longest checkpoint time."""
    hang_timeout: float | None = None
    """Seconds without a completed step before a rank calls the job hung (None: derived from the
    step times; 0: no watchdog; :mod:`ecrl.runtime.checkpoint.watchdog`)."""

    def __post_init__(self) -> None:
        if (self.resume_step is None) != (self.resume_path is None):
            raise ConfigError("ECRL_RESUME_STEP and ECRL_RESUME_PATH come together")

    @property
    def resuming(self) -> bool:
        return self.resume_step is not None

    def to_environ(self) -> dict[str, str]:
        """The variables to add to a rank's environment."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = ",".join(map(str, value))
            out[PREFIX + f.name.upper()] = str(value)
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> AttemptEnv | None:
        """The attempt this process belongs to, or None when no supervisor started it."""
        env = os.environ if environ is None else environ
        if environ is None and GO_VARIABLE in os.environ:
            # A warm standby rank: its attempt starts when the supervisor says which it is.
            await_go(os.environ[GO_VARIABLE])
        if PREFIX + "RUN_DIR" not in env:
            return None
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(PREFIX + f.name.upper())
            if raw is None:
                continue
            kind = str(f.type)
            try:
                if "tuple" in kind:
                    values[f.name] = tuple(int(v) for v in raw.split(",") if v.strip())
                elif "float" in kind:
                    values[f.name] = float(raw)
                elif "int" in kind:
                    values[f.name] = int(raw)
                else:
                    values[f.name] = raw
            except ValueError:
                raise ConfigError(f"{PREFIX}{f.name.upper()}={raw!r} is malformed: this process "
                                  "was started by an incompatible supervisor") from None
        return cls(**values)
