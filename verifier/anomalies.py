"""What can be wrong with a run, as data: anomaly kinds, the obligations they refute, witnesses.

Every proof obligation of ARCHITECTURE.md ("Committed lineage") is refuted by its own anomaly
kinds. An :class:`Anomaly` is one *witness*: the smallest piece of evidence that shows the
obligation fails (the record, line, attempt, step, rank and sample IDs involved), plus ``count``,
how many items (steps, records or samples) it stands for. An anomaly is data only: its sentence
is written by the kind's explainer (:mod:`verifier.explain`) when :mod:`verifier.report` renders
it, as Elle's explainers do. This module imports nothing of the verifier, so every checker can
record anomalies without pulling in the prose layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OBLIGATIONS",
    "KINDS",
    "Kind",
    "Location",
    "Anomaly",
    "Note",
    "AnomalySink",
    "WITNESSES_PER_KIND",
]

OBLIGATIONS: Mapping[str, str] = {
    "lineage": "every resumed attempt starts exactly one step after the checkpoint it loaded",
    "steps": "steps 0..target_steps-1 are committed exactly once, and no step beyond them",
    "ranks": "every committed step has one record from each rank 0..W-1 of its attempt, "
             "with B % W == 0",
    "cursor": "every record's (epoch, cursor_step) equals divmod(global_step, S)",
    "shards": "every rank's shard equals the expected shard, and recorded hashes match "
              "recorded IDs",
    "epochs": "per epoch, over the committed lineage: duplicates = 0, missing = 0, extra = 0",
    "batch": "external sampler (audit): the ranks of every committed step consumed disjoint "
             "samples, B in all",
    "replay": "every step a failed attempt ran after its successor's resume point has the "
              "same global loss when the successor ran it again (bit for bit at the same world "
              "size, within the replay tolerance at another)",
    "order": "with --same-order: two runs consume the same global window at every committed "
             "step",
    "state": "every resume loaded the checkpoint it names and restored every object it saved, "
             "with the digest it was saved with",
    "mesh": "on a mesh, every attempt's records name one mesh (DP x TP = W, B % DP == 0, each "
            "rank its own place, unchanged until a resume) and the tensor-parallel peers of "
            "every committed step consumed identical samples",
}
"""Proof obligation name -> what it states (ARCHITECTURE.md, "Committed lineage")."""


@dataclass(frozen=True, slots=True)
class Kind:
    """One anomaly kind: the obligation it refutes and what it means."""

    name: str
    obligation: str
    summary: str


KINDS: Mapping[str, Kind] = {
    k.name: k
    for k in (
        Kind("resume_mismatch", "lineage",
             "a resumed attempt's first step is not the step after the checkpoint it loaded "
             "(a committed step was skipped or repeated)"),
        Kind("unknown_checkpoint", "lineage",
             "an attempt resumed from a step at which no earlier attempt recorded a checkpoint"),
        Kind("missing_step", "steps", "a step below target_steps was never committed"),
        Kind("duplicate_step", "steps", "a step was committed by two attempts"),
        Kind("extra_step", "steps", "a step at or beyond target_steps was committed"),
        Kind("missing_record", "ranks",
             "a committed step has no record from one of its attempt's ranks"),
        Kind("duplicate_record", "ranks", "a rank logged the same committed step twice"),
        Kind("step_order", "ranks", "a rank's records go back to an earlier step"),
        Kind("misplaced_record", "ranks",
             "a record's attempt or rank disagrees with the file it is in, or a rank file lies "
             "outside its attempt's world (rank collision)"),
        Kind("world_size_mismatch", "ranks",
             "a record's world_size or local_batch disagrees with its attempt, or the world size "
             "does not divide the global batch"),
        Kind("wrong_cursor", "cursor",
             "a record's (epoch, cursor_step) differs from divmod(global_step, S)"),
        Kind("shard_mismatch", "shards",
             "a rank consumed other samples than its shard of the step's window"),
        Kind("hash_mismatch", "shards",
             "a record's sample_ids_hash or sample_ids_count disagrees with its sample_ids"),
        Kind("duplicate_sample", "epochs", "a sample was consumed twice in one epoch"),
        Kind("missing_sample", "epochs",
             "a sample of an epoch's committed steps was never consumed"),
        Kind("extra_sample", "epochs",
             "a sample outside the epoch's committed windows (or outside the dataset) was "
             "consumed"),
        Kind("epoch_hash_mismatch", "epochs",
             "external sampler, hash-only logs: an epoch's summed count and multiset hash differ "
             "from those of the declared sample set (a duplicate, missing or extra sample)"),
        Kind("global_batch_mismatch", "batch",
             "external sampler: the ranks of a committed step consumed other than B samples in "
             "all"),
        Kind("rank_overlap", "batch",
             "external sampler: two ranks consumed the same sample at the same step"),
        Kind("replay_divergence", "replay",
             "a replayed step's global loss differs between the failed attempt and its "
             "successor (the resume did not restore the training state or the data position)"),
        Kind("order_mismatch", "order",
             "with --same-order: the two runs consumed different global windows at a step"),
        Kind("state_digest_mismatch", "state",
             "a resumed attempt loaded an object whose digest differs from the one its "
             "checkpoint saved, or the state of another step"),
        Kind("state_not_restored", "state",
             "a resumed attempt did not restore an object its checkpoint saved"),
        Kind("mesh_mismatch", "mesh",
             "a record's mesh coordinates disagree with its attempt's mesh: sizes that do not "
             "make the world size or divide the batch, two ranks at one place, or a mesh that "
             "changed without a resume"),
        Kind("tp_peer_mismatch", "mesh",
             "two tensor-parallel peers (ranks with one data-parallel coordinate) consumed "
             "different samples at a committed step"),
    )
}
"""Every anomaly kind, in the order reports list them."""

WITNESSES_PER_KIND = 20
"""Witnesses kept per kind and run; the rest are counted (scope), not stored."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Location:
    """Where a record lives: a line of a log file, and what it claims."""

    file: str | None = None
    """Path relative to the run directory."""
    line: int | None = None
    attempt: int | None = None
    step: int | None = None
    rank: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "attempt": self.attempt,
                "step": self.step, "rank": self.rank}


@dataclass(frozen=True, kw_only=True, slots=True)
class Anomaly:
    """One witness that an obligation fails. Its fields are the evidence."""

    kind: str
    """A key of :data:`KINDS`."""
    file: str | None = None
    """Log file (relative to the run directory) of the record that shows it."""
    line: int | None = None
    attempt: int | None = None
    step: int | None = None
    rank: int | None = None
    epoch: int | None = None
    sample_ids: tuple[int, ...] = ()
    """Sample IDs involved (capped; ``count`` says how many there are)."""
    expected: str | None = None
    actual: str | None = None
    related: tuple[Location, ...] = ()
    """Other records of the same witness (the first consumer of a duplicate, …)."""
    count: int = 1
    """How many items (steps, records or samples) this witness stands for."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """The kind's own facts beyond the fields above (for example the checkpoint a resume
    loaded, both losses of a replayed step); its explainer writes the message from them."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown anomaly kind {self.kind!r}")
        if self.count < 1:
            raise ValueError("an anomaly stands for at least one item")

    @property
    def obligation(self) -> str:
        return KINDS[self.kind].obligation

    def as_dict(self) -> dict[str, Any]:
        """The witness as data (the report adds its message: ``verifier.report``)."""
        return {
            "kind": self.kind,
            "obligation": self.obligation,
            "file": self.file,
            "line": self.line,
            "attempt": self.attempt,
            "step": self.step,
            "rank": self.rank,
            "epoch": self.epoch,
            "sample_ids": list(self.sample_ids),
            "expected": self.expected,
            "actual": self.actual,
            "related": [r.as_dict() for r in self.related],
            "count": self.count,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Note:
    """A warning: something worth knowing that does not refute any obligation."""

    kind: str
    message: str
    file: str | None = None
    line: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "file": self.file, "line": self.line}

    def __str__(self) -> str:
        if self.file is None:
            return self.message
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.message}"


@dataclass(slots=True)
class AnomalySink:
    """Collects witnesses with a cap per kind, and counts everything (the scope)."""

    cap: int = WITNESSES_PER_KIND
    witnesses: dict[str, list[Anomaly]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def wants(self, kind: str) -> int:
        """How many more witnesses of ``kind`` would be kept."""
        return self.cap - len(self.witnesses.get(kind, ()))

    def add(self, anomaly: Anomaly) -> None:
        self.counts[anomaly.kind] = self.counts.get(anomaly.kind, 0) + anomaly.count
        kept = self.witnesses.setdefault(anomaly.kind, [])
        if len(kept) < self.cap:
            kept.append(anomaly)

    def add_many(self, kind: str, total: int, witnesses: Iterable[Anomaly]) -> None:
        """``total`` items of ``kind``; ``witnesses`` (lazily built) are the first of them."""
        if total <= 0:
            return
        self.counts[kind] = self.counts.get(kind, 0) + total
        kept = self.witnesses.setdefault(kind, [])
        for w in witnesses:
            if len(kept) >= self.cap:
                break
            kept.append(w)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def ordered(self) -> list[Anomaly]:
        """Witnesses by kind, in catalogue order."""
        return [a for name in KINDS for a in self.witnesses.get(name, ())]
