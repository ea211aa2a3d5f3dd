"""The checkpoint settings: one name, one default and one documented precedence each (torch-free).

A setting has one home, :class:`CheckpointSettings`: its field name is the flag (``ckpt_every`` is
``--ckpt-every``), the TOML key, the environment variable the supervisor sets for the ranks
(``ECRL_CKPT_EVERY``, :mod:`ecrl.runtime.launchenv`) and the field the
:class:`ecrl.Checkpointer` reads; its default is written once, here.

Precedence, applied by :func:`resolve_checkpoint` in every rank:

1. a value the user gave ``ecrl launch``/``ecrl run`` (on the command line or in its ``--config``
   file): the supervisor passes to the ranks *only* those;
2. else the script's own constructor argument (``Checkpointer(..., every=8)`` or
   ``Checkpointer(..., checkpoint=CheckpointSettings(ckpt_every=8))``);
3. else the default below.

So a setting the user did not give never silently replaces one the script did. ``ecrl run`` is
the same rule applied to the built-in trainer, which passes its run configuration as its
constructor arguments. The resolved values and where each came from are recorded by rank 0 in
``logs/attempt-NNN/checkpoint-settings.json`` (:data:`SETTINGS_FILE`), from which the supervisor's
summary says what was in effect.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint.registry import strategy_names

__all__ = ["SOURCES", "SETTINGS_FILE", "DEFAULTS", "CheckpointSettings", "ResolvedCheckpoint",
           "resolve_checkpoint", "script_values", "field_docs", "checkpoint_fields"]

SOURCES = ("flag", "script", "default")
"""Where a resolved setting came from: given to the supervisor (a flag or its config file), the
script's constructor argument, or the default."""
SETTINGS_FILE = "checkpoint-settings.json"
"""Rank 0's record of the settings in effect, in each attempt's log folder."""
_SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSettings:
    """How the :class:`ecrl.Checkpointer` saves: the checkpoint section of a run."""

    # Each field is a flag of `ecrl run` and `ecrl launch`: its docstring is the flag's help, after
    # an optional "METAVAR: " prefix; {strategies} and {background} are filled in from the
    # registry (every strategy; those that write in the background).
    strategy: str = "overlapped"
    """NAME: {strategies} (docs/strategies.md)."""
    ckpt_every: int = 50
    """K: checkpoint after every K-th step (0: never)."""
    max_inflight: int = 2
    """N: {background}: checkpoints that may be pending in the background."""
    keep_checkpoints: int = 2
    """K: retention: the newest K >= 2 checkpoints are kept."""
    deadline_k_step: float = 10.0
    """K: deadline buffer: multiple of the longest step time kept in reserve."""
    deadline_k_ckpt: float = 2.0
    """K: deadline buffer: multiple of the longest checkpoint time kept in reserve."""
    hang_timeout_s: float | None = None
    """S: a rank whose step does not complete in S seconds is hung (default: 10 x the p99 step
    time, at least 30 s; 0: no watchdog)."""

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, str) or self.strategy not in strategy_names():
            raise ConfigError(f"--strategy {self.strategy!r} is unknown: choose one of "
                              f"{', '.join(strategy_names())}")
        for name, low in (("ckpt_every", 0), ("max_inflight", 1), ("keep_checkpoints", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"--{_flag(name)} must be an integer >= {low}, got {value!r}")
        for name in ("deadline_k_step", "deadline_k_ckpt", "hang_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "hang_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"--{_flag(name)} must be a number >= 0, got {value!r}")

    @property
    def effective_ckpt_every(self) -> int:
        """0 when the strategy takes no checkpoints."""
        return 0 if self.strategy == "none" else self.ckpt_every


def _flag(name: str) -> str:
    return name.replace("_", "-")


@functools.cache
def checkpoint_fields() -> tuple[str, ...]:
    """The names of the checkpoint settings, in their order."""
    return tuple(f.name for f in fields(CheckpointSettings))


DEFAULTS = CheckpointSettings()
"""Every checkpoint setting at its default."""


def script_values(section: CheckpointSettings | None = None, **arguments: Any) -> dict[str, Any]:
    """What a script gave its Checkpointer: the fields of its ``section`` that differ from the
    default, and the keyword ``arguments`` that are not None (field names). Both naming the same
    setting differently is a mistake."""
    unknown = sorted(set(arguments) - set(checkpoint_fields()))
    if unknown:
        raise ConfigError(f"no checkpoint setting {unknown[0]!r}")
    out = {k: v for k, v in arguments.items() if v is not None}
    if section is not None:
        for name in checkpoint_fields():
            value = getattr(section, name)
            if value == getattr(DEFAULTS, name):
                continue
            if name in out and out[name] != value:
                raise ConfigError(f"Checkpointer: {name} given twice ({out[name]!r} and "
                                  f"checkpoint.{name}={value!r}): give it once")
            out[name] = value
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedCheckpoint:
    """The checkpoint settings in effect, and where each came from."""

    settings: CheckpointSettings
    """The values in effect."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Setting name → one of :data:`SOURCES`."""

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def record(self) -> dict[str, Any]:
        """The JSON object of :data:`SETTINGS_FILE`."""
        return {"schema_version": _SCHEMA_VERSION,
                "settings": {name: {"value": getattr(self.settings, name),
                                    "source": self.source(name)}
                             for name in checkpoint_fields()}}

    @classmethod
    def from_record(cls, data: Any) -> ResolvedCheckpoint | None:
        """The record read back; None when it is not one (another version, damage)."""
        if not isinstance(data, dict) or data.get("schema_version") != _SCHEMA_VERSION \
                or not isinstance(data.get("settings"), dict):
            return None
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, entry in data["settings"].items():
            if name not in checkpoint_fields() or not isinstance(entry, dict) \
                    or entry.get("source") not in SOURCES:
                return None
            values[name], sources[name] = entry.get("value"), entry["source"]
        try:
            return cls(settings=CheckpointSettings(**values), sources=sources)
        except (ConfigError, TypeError):
            return None

    def describe(self) -> str:
        """``checkpoint every 8 steps (script), strategy overlapped (default)``."""
        s = self.settings
        every = (f"no periodic checkpoints ({self.source('ckpt_every')})"
                 if s.effective_ckpt_every == 0 and s.strategy != "none"
                 else "no checkpoints" if s.strategy == "none"
                 else f"checkpoint every {s.ckpt_every} steps ({self.source('ckpt_every')})")
        return f"{every}, strategy {s.strategy} ({self.source('strategy')})"


def resolve_checkpoint(*, flags: Mapping[str, Any], script: Mapping[str, Any]
                       ) -> ResolvedCheckpoint:
    """The settings in effect: each from ``flags`` (given to the supervisor), else ``script``
    (the Checkpointer's constructor), else the default."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in checkpoint_fields():
        if name in flags and flags[name] is not None:
            values[name], sources[name] = flags[name], "flag"
        elif name in script and script[name] is not None:
            values[name], sources[name] = script[name], "script"
        else:
            sources[name] = "default"
    return ResolvedCheckpoint(settings=CheckpointSettings(**values), sources=sources)


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a settings dataclass, read from its module's source (attribute
    docstrings are not kept at run time), whitespace folded."""
    source = inspect.getsourcefile(cls)
    assert source is not None
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for item, after in zip(node.body, node.body[1:], strict=False):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            docs[item.target.id] = " ".join(after.value.value.split())
    return docs
