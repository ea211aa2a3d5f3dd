"""The plan: what :mod:`transform.codegen` tells :mod:`transform.runtime` about one program.

Both sides import these frozen dataclasses. The generator builds a :class:`Plan`, writes
:meth:`Plan.to_literal` into the generated program (plain dicts, lists, ints and strings, so the
program needs no import to hold it and a reader can see it), and the program passes that literal
to ``transform.runtime.Program``, which rebuilds the plan with :meth:`Plan.from_literal`. The
literal carries :data:`PLAN_VERSION`: a runtime refuses a plan of another version in one line
(transform the program again with the installed ``ecrl-transform``), never guesses at it.

Torch-free and numpy-free: generated programs import it at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transform._firing import balanced_fires

__all__ = ["PLAN_VERSION", "FrameSpec", "Plan", "PlanError", "RegionSpec", "HintSpec", "SlotRule"]

PLAN_VERSION = 2
"""1: the untyped dict of the first transform; 2: this module (adds ``original``)."""

_KINDS = ("never", "always", "occurrences", "balanced")


class PlanError(ValueError):
    """A plan literal this runtime cannot use (another version, or not a plan at all)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotRule:
    """At which executions (1-based) of a slot — the hints of joined branch arms — it saves."""

    kind: str
    """``never``, ``always``, ``occurrences`` (listed) or ``balanced`` (evenly spaced)."""
    total: int
    """Executions the model counts for the slot."""
    count: int
    """Checkpoints the schedule placed on it."""
    occurrences: frozenset[int] = frozenset()
    """For ``occurrences``: the executions that save."""
    first: int = 0
    """For ``balanced``: the first saving execution."""
    last: int = 0
    """For ``balanced``: the last saving execution."""
    blocks: int = 0
    """For ``balanced``: the number of gaps between ``first`` and ``last``."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise PlanError(f"unknown firing rule kind {self.kind!r}")

    def fires(self, occurrence: int) -> bool:
        """Does the slot save at its ``occurrence``-th execution?

        Past the modelled count (a loop longer than its ``_iterations``) a rule that fired at
        all keeps firing with the model's average spacing: a long run is never left without
        checkpoints.
        """
        if self.kind == "never" or self.count <= 0:
            return False
        if occurrence > self.total:
            period = max(1, round(self.total / self.count)) if self.total else 1
            return (occurrence - self.total) % period == 0
        if self.kind == "always":
            return occurrence >= 1
        if self.kind == "balanced":
            return balanced_fires(occurrence, first=self.first, last=self.last,
                                  blocks=self.blocks, cuts=self.count)
        return occurrence in self.occurrences

    def to_literal(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "total": self.total, "count": self.count}
        if self.kind == "occurrences":
            out["occurrences"] = sorted(self.occurrences)
        elif self.kind == "balanced":
            out.update(first=self.first, last=self.last, blocks=self.blocks)
        return out

    @classmethod
    def from_literal(cls, data: Mapping[str, Any]) -> SlotRule:
        return cls(kind=data["kind"], total=int(data["total"]), count=int(data["count"]),
                   occurrences=frozenset(data.get("occurrences", ())),
                   first=int(data.get("first", 0)), last=int(data.get("last", 0)),
                   blocks=int(data.get("blocks", 0)))


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionSpec:
    """A region that checkpoints (a function, or the module's top level)."""

    params: tuple[str, ...] = ()
    """The function's parameters: anchors when saved unchanged."""
    declared: tuple[str, ...] = ()
    """Names declared ``global`` in the function: read and written in the module's scope."""
    globals: tuple[str, ...] = ()
    """Module values the function may read: saved, and restored in place, as anchors."""

    def to_literal(self) -> dict[str, Any]:
        return {"params": list(self.params), "declared": list(self.declared),
                "globals": list(self.globals)}

    @classmethod
    def from_literal(cls, data: Mapping[str, Any]) -> RegionSpec:
        return cls(params=tuple(data.get("params", ())), declared=tuple(data.get("declared", ())),
                   globals=tuple(data.get("globals", ())))


@dataclass(frozen=True, kw_only=True, slots=True)
class HintSpec:
    """A chosen ``_checkpoint()``: what its save holds and what the walk to it steers."""

    region: str
    line: int
    """The hint's line in the original program."""
    slot: int
    """The slot whose counter and rule decide when it saves."""
    save: tuple[str, ...]
    """Names always bound here: saved, and bound again on resume."""
    maybe: tuple[str, ...] = ()
    """Names that may be unbound here: saved when bound."""
    loops: tuple[int, ...] = ()
    """Sites of the ``for`` loops around the hint, outermost first (their positions are saved)."""
    subjects: tuple[int, ...] = ()
    """Sites of the ``match`` statements around the hint (their subjects are saved)."""
    detach: tuple[str, ...] = ()
    """Names of ``save``/``maybe`` no later read needs the autograd graph of: a tensor among
    them is saved detached (:attr:`transform.liveness.LiveFacts.detach`)."""
    outer: tuple[FrameSpec, ...] = ()
    """For a hint of a hosted function (:mod:`transform._hosting`): the functions on the call
    stack above the hint's own, the region's first; ``save``/``maybe`` are the hint's own
    function's names."""

    def to_literal(self) -> dict[str, Any]:
        literal: dict[str, Any] = {
            "region": self.region, "line": self.line, "slot": self.slot,
            "save": list(self.save), "maybe": list(self.maybe), "loops": list(self.loops),
            "subjects": list(self.subjects)}
        # only where there is one: every other program's plan reads as before
        if self.detach:
            literal["detach"] = list(self.detach)
        if self.outer:
            literal["outer"] = [f.to_literal() for f in self.outer]
        return literal

    @classmethod
    def from_literal(cls, data: Mapping[str, Any]) -> HintSpec:
        return cls(region=data["region"], line=int(data["line"]), slot=int(data["slot"]),
                   save=tuple(data["save"]), maybe=tuple(data.get("maybe", ())),
                   loops=tuple(data.get("loops", ())), subjects=tuple(data.get("subjects", ())),
                   detach=tuple(data.get("detach", ())),
                   outer=tuple(FrameSpec.from_literal(f) for f in data.get("outer", ())))


@dataclass(frozen=True, kw_only=True, slots=True)
class FrameSpec:
    """One function on the call stack of a hosted hint, at the call that leads to it."""

    function: str
    """Its qualified name (``co_qualname`` of its running frame)."""
    save: tuple[str, ...]
    maybe: tuple[str, ...] = ()

    def to_literal(self) -> dict[str, Any]:
        return {"function": self.function, "save": list(self.save), "maybe": list(self.maybe)}

    @classmethod
    def from_literal(cls, data: Mapping[str, Any]) -> FrameSpec:
        return cls(function=str(data["function"]), save=tuple(data["save"]),
                   maybe=tuple(data.get("maybe", ())))


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """Everything the runtime needs to know about the generated program."""

    version: int = PLAN_VERSION
    original: str = ""
    """The original program's file name: run-time messages and tracebacks name it."""
    ckpt_dir: str | None = None
    """``--ckpt-dir`` at transform time (``ECRL_CKPT_DIR`` wins at run time)."""
    regions: Mapping[str, RegionSpec] = field(default_factory=dict)
    hints: Mapping[int, HintSpec] = field(default_factory=dict)
    slots: Mapping[int, SlotRule] = field(default_factory=dict)
    sites: Mapping[int, frozenset[int]] = field(default_factory=dict)
    """Steering site → the hints that lie inside it."""
    ranges: frozenset[int] = frozenset()
    """``for`` sites over a ``range``: restarted by index, no random state needed."""
    settle: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    """Branch site → slot → positions the model counts for the branch."""
    source: str = ""
    """Fingerprint of the original source and the plan: a resume state records it."""

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise PlanError(f"plan version {self.version}, this runtime reads version "
                            f"{PLAN_VERSION}")
        for hint in self.hints.values():
            if hint.slot not in self.slots:
                raise PlanError(f"hint on line {hint.line} has no firing rule")

    def to_literal(self) -> dict[str, Any]:
        """Plain data for the generated program, in a stable order."""
        return {
            "version": self.version,
            "original": self.original,
            "ckpt_dir": self.ckpt_dir,
            "regions": {k: v.to_literal() for k, v in self.regions.items()},
            "hints": {k: v.to_literal() for k, v in sorted(self.hints.items())},
            "slots": {k: v.to_literal() for k, v in sorted(self.slots.items())},
            "sites": {k: sorted(v) for k, v in sorted(self.sites.items())},
            "ranges": sorted(self.ranges),
            "settle": {k: dict(sorted(v.items())) for k, v in sorted(self.settle.items())},
            "source": self.source,
        }

    @classmethod
    def from_literal(cls, data: Mapping[str, Any]) -> Plan:
        """The plan a generated program carries; :class:`PlanError` for another version."""
        if not isinstance(data, Mapping):
            raise PlanError("the plan is not a mapping")
        version = data.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"the program was written for runtime plan version {version}, this "
                            f"runtime reads version {PLAN_VERSION}")
        try:
            return cls(
                version=version, original=str(data.get("original", "")),
                ckpt_dir=data.get("ckpt_dir"),
                regions={k: RegionSpec.from_literal(v) for k, v in data["regions"].items()},
                hints={int(k): HintSpec.from_literal(v) for k, v in data["hints"].items()},
                slots={int(k): SlotRule.from_literal(v) for k, v in data["slots"].items()},
                sites={int(k): frozenset(v) for k, v in data["sites"].items()},
                ranges=frozenset(data.get("ranges", ())),
                settle={int(k): {int(s): int(n) for s, n in v.items()}
                        for k, v in data.get("settle", {}).items()},
                source=str(data["source"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise PlanError(f"the plan is malformed ({type(exc).__name__}: {exc})") from None
