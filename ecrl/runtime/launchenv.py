"""What the supervisor tells each rank about its attempt, through the environment (torch-free).

``ecrl run`` and ``ecrl launch`` start every attempt under torchrun with these variables set; the
library (:mod:`ecrl` public API: the step log, the checkpointer, failure injection) reads them,
so a user's own script needs no extra command-line arguments and its own ``argv`` stays its own.
A script started without the supervisor (plain ``python`` or ``torchrun``) finds none of them:
:meth:`AttemptEnv.from_environ` returns None and the library runs standalone.

One variable per field, named ``ECRL_<FIELD>`` (``ECRL_RUN_DIR``, ``ECRL_ATTEMPT``, …); integer
lists are comma-separated, absent optional values are absent variables.

The checkpoint settings travel under their own names (``ECRL_CKPT_EVERY``, ``ECRL_STRATEGY``, …:
the fields of :class:`ecrl.runtime.settings.CheckpointSettings`), and only those the user gave the
supervisor: an absent variable means "not given", so the script's own Checkpointer argument, or
else the default, applies (:func:`ecrl.runtime.settings.resolve_checkpoint`).

A warm standby's ranks (:mod:`ecrl.runtime.supervision.standby`) are started before their attempt
is decided: they find :data:`GO_VARIABLE` instead, and :func:`await_go` waits for the go file that
carries the attempt's variables.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ecrl.contract.errors import ConfigError
from ecrl.runtime.settings import CheckpointSettings, check_finite, checkpoint_fields

__all__ = ["PREFIX", "GO_VARIABLE", "AttemptEnv", "await_go"]

PREFIX = "ECRL_"
GO_VARIABLE = "ECRL_STANDBY_GO"
"""Set (to the go file's path) in a standby rank's environment instead of the attempt's."""
_POLL_S = 0.005


def await_go(path: str, *, environ: dict[str, str] | None = None) -> None:
    """In a standby rank: wait for the go file, then take its variables into the environment.

    A ``cancel`` go file, or a parent gone (torchrun stopped), ends the process quietly: it never
    started its attempt."""
    env = os.environ if environ is None else environ
    parent = os.getppid()
    go = Path(path)
    while True:
        try:
            message = json.loads(go.read_text())
        except FileNotFoundError:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(_POLL_S)
            continue
        if message.get("cancel"):
            os._exit(0)
        env.pop(GO_VARIABLE, None)
        env.update({str(k): str(v) for k, v in message["environ"].items()})
        return


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
    checkpoint: Mapping[str, Any] = field(default_factory=dict)
    """The checkpoint settings the user gave the supervisor (a flag or its config file), by
    field name; the others are absent (the script's own, or the default)."""
    world_sizes: tuple[int, ...] = ()
    """The run's world-size schedule (for run.json; each attempt's own comes from torchrun)."""
    deadline: float | None = None
    """Unix time by which a final checkpoint must be committed (None: no deadline)."""
    parallel: str | None = None
    """``--parallel`` when the user gave it (None: the script's own, else ddp)."""
    replicate: int | None = None
    """``--replicate`` when the user gave it."""
    tp: int | None = None
    """``--tp`` when the user gave it."""

    def __post_init__(self) -> None:
        check_finite(self)  # ECRL_DEADLINE=inf; the checkpoint settings check their own
        if (self.resume_step is None) != (self.resume_path is None):
            raise ConfigError("ECRL_RESUME_STEP and ECRL_RESUME_PATH come together")
        unknown = sorted(set(self.checkpoint) - set(checkpoint_fields()))
        if unknown:
            raise ConfigError(f"no checkpoint setting {unknown[0]!r}")

    @property
    def mesh(self) -> dict[str, Any]:
        """The mesh settings the user gave the supervisor, by name (None: not given)."""
        return {"parallel": self.parallel, "replicate": self.replicate, "tp": self.tp}

    @property
    def resuming(self) -> bool:
        return self.resume_step is not None

    def to_environ(self) -> dict[str, str]:
        """The variables to add to a rank's environment."""
        out: dict[str, str] = {}
        for name, value in self.checkpoint.items():
            if value is not None:
                out[PREFIX + name.upper()] = str(value)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "checkpoint":
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
        values: dict[str, Any] = {f.name: value for f in fields(cls) if f.name != "checkpoint"
                                  if (value := _parse(env, f.name, str(f.type))) is not None}
        given = {f.name: value for f in fields(CheckpointSettings)
                 if (value := _parse(env, f.name, str(f.type))) is not None}
        return cls(**values, checkpoint=given)


def _parse(env: Mapping[str, str], name: str, kind: str) -> Any:
    """The value of ``ECRL_<NAME>`` as a field of type ``kind``; None when absent."""
    raw = env.get(PREFIX + name.upper())
    if raw is None:
        return None
    try:
        if "tuple" in kind:
            return tuple(int(v) for v in raw.split(",") if v.strip())
        if "float" in kind:
            return float(raw)
        if "int" in kind:
            return int(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{PREFIX}{name.upper()}={raw!r} is malformed: this process was "
                          "started by an incompatible supervisor") from None
