"""The mutation catalogue: known ways to break a run's logs, and ways that must not matter.

Each :class:`Mutation` edits a copy of a correct run directory (generated or real) at a place it
picks with a seeded random generator, and says what the verifier must answer: ``FAIL`` with one
of the named anomaly kinds (a *harmful* mutation), ``UNKNOWN`` (the logs no longer support a
verdict), or what the untouched run gets (a *benign* mutation: replayed work, a torn tail after
a crash, an extra field) — ``PASS``, or ``UNKNOWN`` for a run that has not finished. A mutation
that does not apply to a run (no replayed records to touch, no resume) returns ``None``. The
verifier *kills* a harmful mutation when it reports one of its kinds; the catalogue's kill rate
is killed / applied, and a benign mutation that does not get the untouched run's verdict is a
false alarm.

:func:`verifier.selftest.self_test` runs the whole catalogue on a run (``ecrl-verify
--self-test``), ``tests/verifier/test_verify_properties.py`` draws runs and mutations with
hypothesis, and ``ecrl bench verify`` reports the kill rate over a sample of generated runs. The
catalogue is internal: its mutations are written against ECRL's windows and the run generator's
layout, and may change with them.
"""

from __future__ import annotations

import functools
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ecrl.contract import semantics
from ecrl.contract.runformat import RunManifest, RunPaths, SupervisorState
from verifier.errors import VerifierError
from verifier.lineage import AttemptPlan, lineage_of
from verifier.result import Verdict
from verifier.schema import read_inputs

__all__ = ["Outcome", "Mutation", "CATALOGUE", "RunView", "apply", "judge"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What a mutation did and what the verifier must answer."""

    mutation: str
    where: str
    """What was changed, at ``file:line``."""
    verdict: Verdict
    kinds: frozenset[str] = frozenset()
    """For FAIL: the verifier must report at least one of these kinds."""


@dataclass(slots=True)
class _Line:
    number: int
    raw: bytes
    data: dict[str, Any]


@dataclass(slots=True)
class _Log:
    path: Path
    attempt: int
    rank: int
    lines: list[_Line]
    torn: bytes

    def write(self) -> None:
        body = b"".join(line.raw + b"\n" for line in self.lines)
        self.path.write_bytes(body + self.torn)


@dataclass(slots=True)
class RunView:
    """A correct run's logs in memory, with the lineage that says which records count."""

    root: Path
    manifest: RunManifest
    supervisor: SupervisorState
    plans: tuple[AttemptPlan, ...]
    logs: dict[tuple[int, int], _Log]
    clean: Verdict = "PASS"
    """The verdict of the untouched run: PASS, or UNKNOWN for a run that has not finished."""
    geometry: semantics.Geometry = field(init=False)

    def __post_init__(self) -> None:
        self.geometry = semantics.Geometry(dataset_size=self.manifest.dataset_size,
                                           global_batch=self.manifest.global_batch)

    @classmethod
    def load(cls, root: Path) -> RunView:
        inputs = read_inputs(root)
        lineage = lineage_of(inputs)
        logs: dict[tuple[int, int], _Log] = {}
        paths = inputs.paths
        for a in inputs.supervisor.attempts:
            for rank, path in paths.rank_logs(a.attempt).items():
                data = path.read_bytes()
                cut = data.rfind(b"\n") + 1
                body, torn = data[:cut], data[cut:]
                lines = [_Line(i + 1, raw, orjson.loads(raw))
                         for i, raw in enumerate(body.split(b"\n")[:-1])]
                logs[(a.attempt, rank)] = _Log(path, a.attempt, rank, lines, torn)
        target = inputs.manifest.target_steps
        durable = lineage.durable
        short = not lineage.finished and (durable is None or durable + 1 < target)
        return cls(root=Path(root), manifest=inputs.manifest, supervisor=inputs.supervisor,
                   plans=lineage.plans, logs=logs, clean="UNKNOWN" if short else "PASS")

    @property
    def finished(self) -> bool:
        return not self.plans[-1].tentative

    def rel(self, log: _Log) -> str:
        return log.path.relative_to(self.root).as_posix()

    def committed(self, log: _Log, line: _Line) -> bool:
        return self.plans[log.attempt].committed(int(line.data["global_step"]))

    def tentative(self, log: _Log, line: _Line) -> bool:
        """A record an unfinished run's final attempt logged after the last durable checkpoint."""
        return self.plans[log.attempt].tentative and not self.committed(log, line)

    def records(self, *, committed: bool) -> list[tuple[_Log, _Line]]:
        """Committed records, or (``committed=False``) replayed ones; never tentative ones."""
        return [(log, line) for _, log in sorted(self.logs.items()) for line in log.lines
                if self.committed(log, line) == committed and not self.tentative(log, line)]

    def tentative_records(self) -> list[tuple[_Log, _Line]]:
        return [(log, line) for _, log in sorted(self.logs.items()) for line in log.lines
                if self.tentative(log, line)]

    def ids_logged(self) -> bool:
        return self.manifest.log_ids

    def mesh_of(self, attempt: int, rank: int) -> semantics.MeshCoords | None:
        """Where ``rank`` sits on its attempt's mesh, as its first record says (None: DDP)."""
        log = self.logs.get((attempt, rank))
        first = log.lines[0].data if log is not None and log.lines else {}
        if "dp_rank" not in first:
            return None
        return semantics.MeshCoords(dp_rank=first["dp_rank"], dp_size=first["dp_size"],
                                    tp_rank=first["tp_rank"], tp_size=first["tp_size"])

    def record(self, attempt: int, rank: int, step: int) -> dict[str, Any]:
        """A correct step record (as the runtime would write it) for a new line."""
        w = self.plans[attempt].world_size
        coords = self.mesh_of(attempt, rank) or semantics.MeshCoords.ddp(rank, w)
        ids = semantics.mesh_shard(self.geometry, self.manifest.seed, step, coords)
        epoch, cursor = self.geometry.locate(step)
        out: dict[str, Any] = {
            "schema_version": 1, "attempt": attempt, "global_step": step, "epoch": epoch,
            "cursor_step": cursor, "rank": rank, "world_size": w,
            "local_batch": int(ids.size), "sample_ids_count": int(ids.size),
            "sample_ids_hash": semantics.format_hash(semantics.ids_hash(ids)), "loss": 1.0,
            "time": 0.0}
        if self.manifest.log_ids:
            out["sample_ids"] = ids.tolist()
        if self.mesh_of(attempt, rank) is not None:
            out.update(coords.as_fields())
        return out


def _dump(data: dict[str, Any]) -> bytes:
    return orjson.dumps(data)


def _set(line: _Line, **changes: Any) -> None:
    line.data.update(changes)
    line.raw = _dump(line.data)


def _rehash(line: _Line) -> None:
    ids = line.data["sample_ids"]
    _set(line, sample_ids=ids, sample_ids_count=len(ids),
         sample_ids_hash=semantics.format_hash(semantics.ids_hash(ids)))


def _where(view: RunView, log: _Log, line: _Line) -> str:
    return f"{view.rel(log)}:{line.number} (step {line.data['global_step']})"


Apply = Callable[[RunView, random.Random], Outcome | None]


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    summary: str
    harmful: bool
    """False: the verifier must still PASS."""
    apply: Apply = field(repr=False)


def _fail(name: str, where: str, *kinds: str) -> Outcome:
    return Outcome(mutation=name, where=where, verdict="FAIL", kinds=frozenset(kinds))


def _fail_unless_empty(view: RunView, name: str, where: str, *kinds: str) -> Outcome:
    """A removal that leaves no committed record makes the lineage empty: UNKNOWN, not FAIL."""
    if not view.records(committed=True):
        return _unknown(name, where + " (no committed record left)")
    return _fail(name, where, *kinds)


def _benign(view: RunView, name: str, where: str) -> Outcome:
    """The untouched run's verdict (PASS, or UNKNOWN for an unfinished run) must stand."""
    return Outcome(mutation=name, where=where, verdict=view.clean)


def _unknown(name: str, where: str) -> Outcome:
    return Outcome(mutation=name, where=where, verdict="UNKNOWN")


def _pick(rng: random.Random, items: Sequence[Any]) -> Any:
    return items[rng.randrange(len(items))] if items else None


# --- harmful --------------------------------------------------------------------------------


def _drop_record(view: RunView, rng: random.Random) -> Outcome | None:
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    log.lines.remove(line)
    log.write()
    w = view.plans[log.attempt].world_size
    kinds = ("missing_record",) if w > 1 else ("missing_step", "resume_mismatch")
    return _fail_unless_empty(view, "drop_record", _where(view, log, line), *kinds)


def _repeat_record(view: RunView, rng: random.Random) -> Outcome | None:
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    log.lines.insert(log.lines.index(line) + 1, _Line(line.number, line.raw, dict(line.data)))
    log.write()
    return _fail("repeat_record", _where(view, log, line), "duplicate_record")


def _same_epoch_pair(view: RunView, rng: random.Random
                     ) -> tuple[_Log, _Line, _Log, _Line] | None:
    records = view.records(committed=True)
    s = view.geometry.steps_per_epoch
    by_epoch: dict[int, list[tuple[_Log, _Line]]] = {}
    for log, line in records:
        by_epoch.setdefault(int(line.data["global_step"]) // s, []).append((log, line))
    pairs = [group for group in by_epoch.values()
             if len({int(li.data["global_step"]) for _, li in group}) > 1]
    group = _pick(rng, pairs)
    if group is None:
        return None
    a = _pick(rng, group)
    others = [x for x in group if x[1].data["global_step"] != a[1].data["global_step"]]
    b = _pick(rng, others)
    return a[0], a[1], b[0], b[1]


def _swap_ids(view: RunView, rng: random.Random) -> Outcome | None:
    if not view.ids_logged():
        return None
    pair = _same_epoch_pair(view, rng)
    if pair is None:
        return None
    la, a, lb, b = pair
    ids_a, ids_b = list(a.data["sample_ids"]), list(b.data["sample_ids"])
    i, j = rng.randrange(len(ids_a)), rng.randrange(len(ids_b))
    ids_a[i], ids_b[j] = ids_b[j], ids_a[i]
    a.data["sample_ids"], b.data["sample_ids"] = ids_a, ids_b
    _rehash(a)
    _rehash(b)
    la.write()
    lb.write()
    return _fail("swap_ids", f"{_where(view, la, a)} <-> {_where(view, lb, b)}",
                 "shard_mismatch")


def _swap_shards(view: RunView, rng: random.Random) -> Outcome | None:
    pair = _same_epoch_pair(view, rng)
    if pair is None:
        return None
    la, a, lb, b = pair
    if a.data["sample_ids_hash"] == b.data["sample_ids_hash"]:
        return None
    keys = ["sample_ids_hash", "sample_ids_count"] + (["sample_ids"] if view.ids_logged()
                                                      else [])
    da = {k: a.data[k] for k in keys}
    db = {k: b.data[k] for k in keys}
    _set(a, **db)
    _set(b, **da)
    la.write()
    lb.write()
    return _fail("swap_shards", f"{_where(view, la, a)} <-> {_where(view, lb, b)}",
                 "shard_mismatch")


def _out_of_range_id(view: RunView, rng: random.Random) -> Outcome | None:
    if not view.ids_logged():
        return None
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    ids = list(line.data["sample_ids"])
    ids[rng.randrange(len(ids))] = view.geometry.dataset_size + rng.randrange(1000)
    line.data["sample_ids"] = ids
    _rehash(line)
    log.write()
    return _fail("out_of_range_id", _where(view, log, line), "extra_sample")


def _duplicate_id(view: RunView, rng: random.Random) -> Outcome | None:
    if not view.ids_logged():
        return None
    pair = _same_epoch_pair(view, rng)
    if pair is None:
        return None
    la, a, _, b = pair
    ids = list(a.data["sample_ids"])
    ids[rng.randrange(len(ids))] = _pick(rng, b.data["sample_ids"])
    a.data["sample_ids"] = ids
    _rehash(a)
    la.write()
    # On a mesh a tensor-parallel peer's IDs are checked against its peers', not counted
    # again (its data-parallel rank's copy is): there the disagreement is the witness.
    peer = (c := view.mesh_of(la.attempt, la.rank)) is not None and c.tp_rank > 0
    return _fail("duplicate_id", _where(view, la, a),
                 *(("duplicate_sample", "tp_peer_mismatch") if peer else ("duplicate_sample",)))


def _field(name: str, key: str, kinds: tuple[str, ...],
           change: Callable[[RunView, _Line, random.Random], Any]) -> Apply:
    def apply(view: RunView, rng: random.Random) -> Outcome | None:
        picked = _pick(rng, view.records(committed=True))
        if picked is None:
            return None
        log, line = picked
        _set(line, **{key: change(view, line, rng)})
        log.write()
        return _fail(name, _where(view, log, line), *kinds)

    return apply


def _cursor(view: RunView, line: _Line, rng: random.Random) -> int:
    s = view.geometry.steps_per_epoch
    return (int(line.data["cursor_step"]) + 1 + rng.randrange(max(1, s - 1))) % s \
        if s > 1 else int(line.data["cursor_step"]) + 1


def _tamper(view: RunView, rng: random.Random, name: str,
            records: list[tuple[_Log, _Line]]) -> Outcome | None:
    """Change one hex digit of a record's sample_ids_hash."""
    picked = _pick(rng, records)
    if picked is None:
        return None
    log, line = picked
    h = line.data["sample_ids_hash"]
    i = rng.randrange(16)
    digit = "0123456789abcdef".replace(h[i], "")[rng.randrange(15)]
    _set(line, sample_ids_hash=h[:i] + digit + h[i + 1:])
    log.write()
    kind = "hash_mismatch" if view.ids_logged() else "shard_mismatch"
    return _fail(name, _where(view, log, line), kind)


def _tamper_hash(view: RunView, rng: random.Random) -> Outcome | None:
    return _tamper(view, rng, "tamper_hash", view.records(committed=True))


def _tamper_count(view: RunView, rng: random.Random) -> Outcome | None:
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    _set(line, sample_ids_count=int(line.data["sample_ids_count"]) + 1 + rng.randrange(3))
    log.write()
    kind = "hash_mismatch" if view.ids_logged() else "shard_mismatch"
    return _fail("tamper_count", _where(view, log, line), kind)


def _rank_collision(view: RunView, rng: random.Random) -> Outcome | None:
    candidates = [(log, line) for log, line in view.records(committed=True)
                  if view.plans[log.attempt].world_size > 1]
    picked = _pick(rng, candidates)
    if picked is None:
        return None
    log, line = picked
    w = view.plans[log.attempt].world_size
    other = _pick(rng, [r for r in range(w) if r != log.rank])
    _set(line, rank=other)
    log.write()
    return _fail("rank_collision", _where(view, log, line), "misplaced_record")


def _resumed(view: RunView, *, min_steps: int) -> list[AttemptPlan]:
    out = []
    for p in view.plans:
        if not p.on_chain or p.resumed_from is None:
            continue
        steps = {int(li.data["global_step"]) for (k, _), log in view.logs.items()
                 if k == p.attempt for li in log.lines}
        if len([s for s in steps if p.committed(s)]) >= min_steps:
            out.append(p)
    return out


def _skip_step_at_resume(view: RunView, rng: random.Random) -> Outcome | None:
    plan = _pick(rng, _resumed(view, min_steps=2))
    if plan is None:
        return None
    for (k, _), log in view.logs.items():
        if k == plan.attempt:
            log.lines = [li for li in log.lines if int(li.data["global_step"]) != plan.lo]
            log.write()
    return _fail("skip_step_at_resume", f"attempt {plan.attempt}: step {plan.lo} removed",
                 "resume_mismatch")


def _repeat_step_at_resume(view: RunView, rng: random.Random) -> Outcome | None:
    plan = _pick(rng, _resumed(view, min_steps=1))
    if plan is None:
        return None
    step = plan.lo - 1
    for (k, rank), log in view.logs.items():
        if k == plan.attempt and rank < plan.world_size:
            data = view.record(k, rank, step)
            log.lines.insert(0, _Line(0, _dump(data), data))
            log.write()
    return _fail("repeat_step_at_resume", f"attempt {plan.attempt}: step {step} run again",
                 "resume_mismatch")


def _truncate_final(view: RunView, rng: random.Random) -> Outcome | None:
    final = view.plans[-1].attempt
    logs = [log for (k, _), log in view.logs.items() if k == final and log.lines]
    if not logs:
        return None
    if not view.finished:
        return _truncate_unfinished(view, rng, logs)
    n = 1 + rng.randrange(3)
    for log in logs:
        log.lines = log.lines[:-n] if len(log.lines) > n else []
        log.write()
    return _fail_unless_empty(view, "truncate_final_attempt",
                              f"attempt {final}: last {n} records of every rank", "missing_step")


def _truncate_unfinished(view: RunView, rng: random.Random, logs: list[_Log]
                         ) -> Outcome | None:
    """An unfinished run: its last committed steps and the tentative records after them go."""
    plan = view.plans[-1]
    if not plan.on_chain or plan.hi is None or plan.hi < plan.lo:
        return None  # it commits nothing yet: cutting its records cuts only tentative ones
    n = 1 + rng.randrange(min(3, plan.hi - plan.lo + 1))
    cut = plan.hi - n + 1
    for log in logs:
        log.lines = [li for li in log.lines if int(li.data["global_step"]) < cut]
        log.write()
    return _fail_unless_empty(view, "truncate_final_attempt",
                              f"attempt {plan.attempt}: every rank's records from step {cut} on "
                              f"(the last {n} committed steps)", "missing_step")


def _drop_rank_file(view: RunView, rng: random.Random) -> Outcome | None:
    candidates = [log for (k, _), log in view.logs.items()
                  if view.plans[k].world_size > 1
                  and any(view.committed(log, li) for li in log.lines)]
    log = _pick(rng, candidates)
    if log is None:
        return None
    log.path.unlink()
    del view.logs[(log.attempt, log.rank)]
    return _fail_unless_empty(view, "drop_rank_file", view.rel(log), "missing_record")


def _stray_rank_file(view: RunView, rng: random.Random) -> Outcome | None:
    log = _pick(rng, [log for log in view.logs.values() if log.lines])
    if log is None:
        return None
    w = view.plans[log.attempt].world_size
    target = log.path.with_name(f"rank-{w:03d}.jsonl")
    shutil.copyfile(log.path, target)
    return _fail("stray_rank_file", target.relative_to(view.root).as_posix(),
                 "misplaced_record")


def _drop_checkpoint_event(view: RunView, rng: random.Random, *, keep_testimony: bool = False
                           ) -> Outcome | None:
    """Delete the event of a checkpoint a resume loaded. With the supervisor's testimony of that
    checkpoint (``resume_points``) this is the trace of a writer killed between publishing and
    logging, and benign; without it the resume point has no provenance."""
    points = view.supervisor.extra.get("resume_points")
    points = points if isinstance(points, dict) else {}
    plans = [p for p in view.plans if p.on_chain and p.resumed_from is not None
             and p.writer is not None
             and (not keep_testimony or str(p.attempt) in points)]
    plan = _pick(rng, plans)
    if plan is None:
        return None
    assert plan.writer is not None and plan.resumed_from is not None
    # Every attempt that recorded this step must lose the event, or an older one is found.
    changed = []
    for k in range(plan.attempt):
        path = RunPaths.of(view.root).checkpoint_log(k)
        if not path.is_file():
            continue
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        lines = data[:cut].split(b"\n")[:-1]
        kept = [raw for raw in lines if orjson.loads(raw).get("global_step") != plan.resumed_from]
        if len(kept) != len(lines):
            path.write_bytes(b"".join(raw + b"\n" for raw in kept) + data[cut:])
            changed.append(path.relative_to(view.root).as_posix())
    if not changed:
        return None
    where = f"{', '.join(changed)}: event of step {plan.resumed_from} removed"
    if keep_testimony:
        return _benign(view, "lose_checkpoint_event", where)
    if str(plan.attempt) in points:
        path = RunPaths.of(view.root).supervisor
        data = orjson.loads(path.read_bytes())
        del data["resume_points"][str(plan.attempt)]
        path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
        where += f", and the supervisor's testimony for attempt {plan.attempt}"
    return _fail("drop_checkpoint_event", where, "unknown_checkpoint")


def _reorder(view: RunView, rng: random.Random) -> Outcome | None:
    candidates = []
    for log in view.logs.values():
        for i in range(len(log.lines) - 1):
            if view.committed(log, log.lines[i]) and view.committed(log, log.lines[i + 1]):
                candidates.append((log, i))
    picked = _pick(rng, candidates)
    if picked is None:
        return None
    log, i = picked
    log.lines[i], log.lines[i + 1] = log.lines[i + 1], log.lines[i]
    log.write()
    return _fail("reorder_records", _where(view, log, log.lines[i]), "step_order")


def _extra_step(view: RunView, rng: random.Random) -> Outcome | None:
    final = view.plans[-1]
    if not view.finished:
        return None  # past the last durable checkpoint the step would only be tentative
    step = view.manifest.target_steps
    for (k, rank), log in view.logs.items():
        if k == final.attempt and rank < final.world_size:
            data = view.record(k, rank, step)
            log.lines.append(_Line(len(log.lines) + 1, _dump(data), data))
            log.write()
    return _fail("extra_step", f"attempt {final.attempt}: step {step} appended", "extra_step")


def _resume_elsewhere(view: RunView, rng: random.Random) -> Outcome | None:
    inputs = read_inputs(view.root)
    options = []
    for p in view.plans:
        if not p.on_chain or p.resumed_from is None:
            continue
        older = sorted({r.event.global_step for k in range(p.attempt)
                        for r in inputs.checkpoints.get(k, ())} - {p.resumed_from})
        if older:
            options.append((p, older))
    picked = _pick(rng, options)
    if picked is None:
        return None
    plan, older = picked
    step = _pick(rng, older)
    path = RunPaths.of(view.root).supervisor
    data = orjson.loads(path.read_bytes())
    data["attempts"][plan.attempt]["resumed_from_step"] = step
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    return _fail("resume_elsewhere",
                 f"supervisor.json: attempt {plan.attempt} resumed_from_step "
                 f"{plan.resumed_from} -> {step}", "resume_mismatch", "duplicate_step")


# --- unusable ---------------------------------------------------------------------------------


def _tear_completed(view: RunView, rng: random.Random) -> Outcome | None:
    completed = {a.attempt for a in view.supervisor.attempts if a.status == "completed"}
    log = _pick(rng, [log for (k, _), log in view.logs.items() if k in completed and log.lines])
    if log is None:
        return None
    last = log.lines.pop()
    log.torn = last.raw[: max(1, len(last.raw) // 2)]
    log.write()
    return _unknown("tear_completed_line", f"{view.rel(log)}:{last.number}")


def _garbage_line(view: RunView, rng: random.Random) -> Outcome | None:
    log = _pick(rng, [log for log in view.logs.values() if len(log.lines) > 1])
    if log is None:
        return None
    i = 1 + rng.randrange(len(log.lines) - 1)
    garbage = _pick(rng, [b'{"schema_version": 1, "glob', b"not json", b"[1, 2, 3]",
                          b'{"schema_version": 1}', b""])
    log.lines.insert(i, _Line(i + 1, garbage, {}))
    log.write()
    return _unknown("garbage_line", f"{view.rel(log)}:{i + 1}")


def _drop_ids_field(view: RunView, rng: random.Random) -> Outcome | None:
    if not view.ids_logged():
        return None
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    del line.data["sample_ids"]
    line.raw = _dump(line.data)
    log.write()
    return _unknown("drop_ids_field", _where(view, log, line))


def _bool_field(view: RunView, rng: random.Random) -> Outcome | None:
    picked = _pick(rng, view.records(committed=True))
    if picked is None:
        return None
    log, line = picked
    key = _pick(rng, ["rank", "attempt", "world_size"])
    _set(line, **{key: True})
    log.write()
    return _unknown("bool_field", _where(view, log, line) + f" ({key}: true)")


# --- benign -----------------------------------------------------------------------------------


def _replayed(view: RunView, rng: random.Random, name: str,
              edit: Callable[[_Log, _Line, random.Random], None]) -> Outcome | None:
    picked = _pick(rng, view.records(committed=False))
    if picked is None:
        return None
    log, line = picked
    where = _where(view, log, line)
    edit(log, line, rng)
    log.write()
    return _benign(view, name, where)


def _drop_replayed(view: RunView, rng: random.Random) -> Outcome | None:
    return _replayed(view, rng, "drop_replayed_record", lambda log, line, _: log.lines.remove(line))


def _repeat_replayed(view: RunView, rng: random.Random) -> Outcome | None:
    def edit(log: _Log, line: _Line, _: random.Random) -> None:
        log.lines.insert(log.lines.index(line), _Line(line.number, line.raw, dict(line.data)))

    return _replayed(view, rng, "repeat_replayed_record", edit)


def _tamper_tentative(view: RunView, rng: random.Random) -> Outcome | None:
    return _tamper(view, rng, "tamper_tentative_hash", view.tentative_records())


def _drop_tentative(view: RunView, rng: random.Random) -> Outcome | None:
    picked = _pick(rng, view.tentative_records())
    if picked is None:
        return None
    log, line = picked
    where = _where(view, log, line)
    log.lines.remove(line)
    log.write()
    return _benign(view, "drop_tentative_record", where)


def _tamper_replayed(view: RunView, rng: random.Random) -> Outcome | None:
    def edit(log: _Log, line: _Line, rng: random.Random) -> None:
        _set(line, sample_ids_hash=f"{rng.getrandbits(64):016x}")

    return _replayed(view, rng, "tamper_replayed_hash", edit)


def _tear_failed_tail(view: RunView, rng: random.Random) -> Outcome | None:
    failed = {a.attempt for a in view.supervisor.attempts if a.status != "completed"}
    log = _pick(rng, [log for (k, _), log in view.logs.items() if k in failed])
    if log is None:
        return None
    log.torn = b'{"schema_version":1,"attempt":' + str(log.attempt).encode() + b',"glo'
    log.write()
    return _benign(view, "tear_failed_tail", f"{view.rel(log)}:{len(log.lines) + 1}")


def _replay_pairs(view: RunView) -> set[tuple[int, int]]:
    """``(attempt, step)`` of both records of every replayed step that replay consistency
    compares: a failed attempt's step after its successor's resume point, which every rank of
    both attempts logged (:mod:`verifier.replay`)."""
    steps: dict[tuple[int, int], set[int]] = {}
    for (k, rank), log in view.logs.items():
        for line in log.lines:
            steps.setdefault((k, int(line.data["global_step"])), set()).add(rank)
    pairs: set[tuple[int, int]] = set()
    for failed, succ in zip(view.plans, view.plans[1:], strict=False):
        if succ.resumed_from is None:
            continue
        for (k, step), ranks in steps.items():
            if k != failed.attempt or step <= succ.resumed_from:
                continue
            again = steps.get((succ.attempt, step), set())
            if ranks == set(range(failed.world_size)) and again == set(range(succ.world_size)):
                pairs |= {(k, step), (succ.attempt, step)}
    return pairs


def _perturb_replayed_loss(view: RunView, rng: random.Random) -> Outcome | None:
    pairs = _replay_pairs(view)
    # The failed attempt's side of a pair: its successor has the same step in a pair too.
    picked = _pick(rng, [(log, line) for _, log in sorted(view.logs.items())
                         for line in log.lines
                         if (log.attempt, int(line.data["global_step"])) in pairs
                         and (log.attempt + 1, int(line.data["global_step"])) in pairs
                         and isinstance(line.data.get("loss"), (int, float))])
    if picked is None:
        return None
    log, line = picked
    # Far beyond any tolerance below 1, whatever the rank's share of the batch.
    _set(line, loss=float(line.data["loss"]) + 1000.0)
    log.write()
    return _fail("perturb_replayed_loss", _where(view, log, line), "replay_divergence")


def _restored(view: RunView, rng: random.Random, name: str,
              edit: Callable[[dict[str, Any], random.Random], str | None], kind: str
              ) -> Outcome | None:
    """Change one resumed attempt's ``restored.json`` (runs with state digests only)."""
    files = sorted(view.root.glob("logs/attempt-*/restored.json"))
    path = _pick(rng, files)
    if path is None:
        return None
    data = orjson.loads(path.read_bytes())
    what = edit(data, rng)
    if what is None:
        return None
    path.write_bytes(orjson.dumps(data))
    return _fail(name, f"{path.relative_to(view.root).as_posix()}: {what}", kind)


def _tamper_restored_digest(view: RunView, rng: random.Random) -> Outcome | None:
    def edit(data: dict[str, Any], rng: random.Random) -> str | None:
        name = _pick(rng, sorted(data.get("digests", {})))
        if name is None:
            return None
        data["digests"][name] = "sha256:" + f"{rng.getrandbits(256):064x}"
        return f"digest of {name} changed"

    return _restored(view, rng, "tamper_restored_digest", edit, "state_digest_mismatch")


def _drop_restored_object(view: RunView, rng: random.Random) -> Outcome | None:
    def edit(data: dict[str, Any], rng: random.Random) -> str | None:
        name = _pick(rng, sorted(data.get("digests", {})))
        if name is None:
            return None
        del data["digests"][name]
        return f"{name} not restored"

    return _restored(view, rng, "drop_restored_object", edit, "state_not_restored")


def _benign_field(name: str, change: Callable[[_Line, random.Random], dict[str, Any]],
                  *, keep_replays: bool = False) -> Apply:
    def apply(view: RunView, rng: random.Random) -> Outcome | None:
        records = (view.records(committed=True) + view.records(committed=False)
                   + view.tentative_records())
        if keep_replays:
            # A replayed step's loss is compared across attempts: changing it is harmful.
            pairs = _replay_pairs(view)
            records = [(log, line) for log, line in records
                       if (log.attempt, int(line.data["global_step"])) not in pairs]
        picked = _pick(rng, records)
        if picked is None:
            return None
        log, line = picked
        _set(line, **change(line, rng))
        log.write()
        return _benign(view, name, _where(view, log, line))

    return apply


# --- meshes -----------------------------------------------------------------------------------


def _give_shard(view: RunView, line: _Line, coords: semantics.MeshCoords) -> None:
    """Make ``line`` hold the shard of ``coords`` at its step (IDs, count and hash agree)."""
    ids = semantics.mesh_shard(view.geometry, view.manifest.seed,
                               int(line.data["global_step"]), coords)
    changes: dict[str, Any] = {
        "sample_ids_count": int(ids.size), "local_batch": int(ids.size),
        "sample_ids_hash": semantics.format_hash(semantics.ids_hash(ids))}
    if view.ids_logged():
        changes["sample_ids"] = ids.tolist()
    _set(line, **changes)


def _tp_peers_disagree(view: RunView, rng: random.Random) -> Outcome | None:
    """A tensor-parallel peer consumes another data-parallel rank's shard (or, at DP = 1, the
    next step's), keeping its coordinates: its peers consumed the step's shard."""
    picked = _pick(rng, [(lg, li) for lg, li in view.records(committed=True)
                         if (c := view.mesh_of(lg.attempt, lg.rank)) is not None
                         and c.tp_size > 1])
    if picked is None:
        return None
    log, line = picked
    c = view.mesh_of(log.attempt, log.rank)
    assert c is not None
    if c.dp_size > 1:
        other = semantics.MeshCoords(dp_rank=(c.dp_rank + 1 + rng.randrange(c.dp_size - 1))
                                     % c.dp_size, dp_size=c.dp_size)
        _give_shard(view, line, other)
    else:
        step = int(line.data["global_step"])
        ids = semantics.mesh_shard(view.geometry, view.manifest.seed, step + 1, c)
        _set(line, sample_ids_hash=semantics.format_hash(semantics.ids_hash(ids)),
             **({"sample_ids": ids.tolist()} if view.ids_logged() else {}))
    log.write()
    return _fail("tp_peers_disagree", _where(view, log, line), "tp_peer_mismatch")


def _dp_shard_wrong_rank(view: RunView, rng: random.Random) -> Outcome | None:
    """One record of a data-parallel rank holds another data-parallel rank's shard of its
    step (its coordinates unchanged): that shard was logged by the wrong rank."""
    picked = _pick(rng, [(lg, li) for lg, li in view.records(committed=True)
                         if (c := view.mesh_of(lg.attempt, lg.rank)) is not None
                         and c.dp_size > 1])
    if picked is None:
        return None
    log, line = picked
    c = view.mesh_of(log.attempt, log.rank)
    assert c is not None
    other = semantics.MeshCoords(
        dp_rank=(c.dp_rank + 1 + rng.randrange(c.dp_size - 1)) % c.dp_size, dp_size=c.dp_size)
    _give_shard(view, line, other)
    log.write()
    return _fail("dp_shard_wrong_rank", _where(view, log, line), "shard_mismatch")


def _mesh_changed_without_resume(view: RunView, rng: random.Random) -> Outcome | None:
    """From a committed step after an attempt's first on, every rank of the attempt names
    another mesh of the same world size (and consumes its shards, consistently): the mesh
    changed within the attempt, without a resume."""
    options = []
    b = view.geometry.global_batch
    for plan in view.plans:
        w = plan.world_size
        current = view.mesh_of(plan.attempt, 0)
        tp_now = current.tp_size if current is not None else None
        others = [tp for tp in range(1, w + 1) if w % tp == 0 and b % (w // tp) == 0
                  and tp != tp_now]
        steps = sorted({int(li.data["global_step"]) for (k, _), lg in view.logs.items()
                        if k == plan.attempt for li in lg.lines
                        if plan.committed(int(li.data["global_step"]))})
        later = [st for st in steps if st > plan.lo]
        if others and later and all(view.logs[(plan.attempt, r)].lines
                                    for r in range(w) if (plan.attempt, r) in view.logs):
            options.append((plan, others, later))
    picked = _pick(rng, options)
    if picked is None:
        return None
    plan, others, later = picked
    tp = _pick(rng, others)
    start = _pick(rng, later)
    for (k, rank), log in view.logs.items():
        if k != plan.attempt or rank >= plan.world_size:
            continue
        coords = semantics.MeshCoords.of_rank(rank, plan.world_size, tp_size=tp)
        for line in log.lines:
            if int(line.data["global_step"]) >= start:
                _give_shard(view, line, coords)
                _set(line, **coords.as_fields())
        log.write()
    return _fail("mesh_changed_without_resume",
                 f"attempt {plan.attempt}: TP {tp} from step {start} on", "mesh_mismatch")


def _shuffle_ids(view: RunView, rng: random.Random) -> Outcome | None:
    if not view.ids_logged():
        return None
    picked = _pick(rng, [(lg, li) for lg, li in view.records(committed=True)
                         if len(set(li.data["sample_ids"])) > 1])
    if picked is None:
        return None
    log, line = picked
    ids = list(line.data["sample_ids"])
    while ids == line.data["sample_ids"]:
        rng.shuffle(ids)
    _set(line, sample_ids=ids)
    log.write()
    return _benign(view, "shuffle_ids_in_record", _where(view, log, line))


CATALOGUE: tuple[Mutation, ...] = (
    Mutation("drop_record", "delete a committed record", True, _drop_record),
    Mutation("repeat_record", "log a committed record twice", True, _repeat_record),
    Mutation("swap_ids", "swap one sample ID between two steps of one epoch (hashes fixed)",
             True, _swap_ids),
    Mutation("swap_shards", "swap the shards of two steps of one epoch", True, _swap_shards),
    Mutation("out_of_range_id", "replace a sample ID with one outside the dataset", True,
             _out_of_range_id),
    Mutation("duplicate_id", "replace a sample ID with one another step of the epoch consumed",
             True, _duplicate_id),
    Mutation("wrong_world_size", "change a record's world_size", True,
             _field("wrong_world_size", "world_size", ("world_size_mismatch",),
                    lambda v, li, r: int(li.data["world_size"]) * 2 + r.randrange(2))),
    Mutation("wrong_local_batch", "change a record's local_batch", True,
             _field("wrong_local_batch", "local_batch", ("world_size_mismatch",),
                    lambda v, li, r: int(li.data["local_batch"]) + 1 + r.randrange(3))),
    Mutation("wrong_cursor", "change a record's cursor_step", True,
             _field("wrong_cursor", "cursor_step", ("wrong_cursor",), _cursor)),
    Mutation("wrong_epoch", "change a record's epoch", True,
             _field("wrong_epoch", "epoch", ("wrong_cursor",),
                    lambda v, li, r: int(li.data["epoch"]) + 1 + r.randrange(3))),
    Mutation("wrong_attempt", "change a record's attempt", True,
             _field("wrong_attempt", "attempt", ("misplaced_record",),
                    lambda v, li, r: int(li.data["attempt"]) + 1 + r.randrange(3))),
    Mutation("tamper_hash", "change one hex digit of a record's sample_ids_hash", True,
             _tamper_hash),
    Mutation("tamper_count", "change a record's sample_ids_count", True, _tamper_count),
    Mutation("rank_collision", "make a record claim another rank of its world", True,
             _rank_collision),
    Mutation("skip_step_at_resume", "remove a resumed attempt's first step from every rank",
             True, _skip_step_at_resume),
    Mutation("repeat_step_at_resume", "make a resumed attempt run its checkpoint's step again",
             True, _repeat_step_at_resume),
    Mutation("resume_elsewhere", "claim an attempt resumed from another recorded checkpoint",
             True, _resume_elsewhere),
    Mutation("truncate_final_attempt", "cut the last records of the final attempt", True,
             _truncate_final),
    Mutation("drop_rank_file", "delete one rank's log of a multi-rank attempt", True,
             _drop_rank_file),
    Mutation("stray_rank_file", "add a log for a rank outside the attempt's world", True,
             _stray_rank_file),
    Mutation("drop_checkpoint_event", "delete the checkpoint event a resume loaded and the "
             "supervisor's testimony of it", True, _drop_checkpoint_event),
    Mutation("lose_checkpoint_event", "delete the checkpoint event a resume loaded, keeping "
             "the supervisor's testimony (a writer killed between publishing and logging)",
             False, functools.partial(_drop_checkpoint_event, keep_testimony=True)),
    Mutation("reorder_records", "swap two adjacent committed records", True, _reorder),
    Mutation("extra_step", "run every rank of the final attempt one step past the target",
             True, _extra_step),
    Mutation("tear_completed_line", "cut the last line of a completed attempt's log", True,
             _tear_completed),
    Mutation("garbage_line", "insert a malformed line", True, _garbage_line),
    Mutation("drop_ids_field", "remove sample_ids from a record of an ID-logging run", True,
             _drop_ids_field),
    Mutation("bool_field", "write true where an integer belongs", True, _bool_field),
    Mutation("tamper_tentative_hash", "change a tentative record's hash (an unfinished run, "
             "after its last durable checkpoint)", True, _tamper_tentative),
    Mutation("drop_replayed_record", "delete a replayed record", False, _drop_replayed),
    Mutation("repeat_replayed_record", "log a replayed record twice", False, _repeat_replayed),
    Mutation("tamper_replayed_hash", "change a replayed record's hash", False,
             _tamper_replayed),
    Mutation("tear_failed_tail", "end a failed attempt's log with a torn line", False,
             _tear_failed_tail),
    Mutation("drop_tentative_record", "delete a tentative record (an unfinished run, after "
             "its last durable checkpoint)", False, _drop_tentative),
    Mutation("add_field", "add an unknown field to a record", False,
             _benign_field("add_field", lambda li, r: {"note": f"n{r.randrange(100)}"})),
    Mutation("change_loss", "change the loss of a record whose step was not replayed", False,
             _benign_field("change_loss", lambda li, r: {"loss": round(r.random(), 4)},
                           keep_replays=True)),
    Mutation("perturb_replayed_loss", "change a failed attempt's loss of a step its successor "
             "ran again", True, _perturb_replayed_loss),
    Mutation("tamper_restored_digest", "change the digest of an object a resumed attempt "
             "restored (runs with state digests)", True, _tamper_restored_digest),
    Mutation("drop_restored_object", "leave a saved object out of what a resumed attempt "
             "restored (runs with state digests)", True, _drop_restored_object),
    Mutation("change_time", "change a record's time", False,
             _benign_field("change_time",
                           lambda li, r: {"time": float(li.data["time"]) + r.random()})),
    Mutation("shuffle_ids_in_record", "reorder the IDs inside one record's shard", False,
             _shuffle_ids),
    Mutation("tp_peers_disagree", "make a tensor-parallel peer consume other samples than the "
             "other peers of its step (mesh runs)", True, _tp_peers_disagree),
    Mutation("dp_shard_wrong_rank", "make a record hold another data-parallel rank's shard of "
             "its step (mesh runs)", True, _dp_shard_wrong_rank),
    Mutation("mesh_changed_without_resume", "make every rank of an attempt name another mesh "
             "of its world size from a later step on", True, _mesh_changed_without_resume),
)
"""Every mutation; ``harmful`` ones must be caught, the others must pass."""

_BY_NAME = {m.name: m for m in CATALOGUE}


def apply(mutation: Mutation | str, run: str | Path, into: str | Path, rng: random.Random
          ) -> Outcome | None:
    """Copy ``run`` to ``into`` and apply the mutation there; None if it does not apply."""
    m = _BY_NAME[mutation] if isinstance(mutation, str) else mutation
    target = Path(into)
    if target.exists():
        raise VerifierError(f"{target}: already exists; mutate into a new directory")
    shutil.copytree(run, target)
    return m.apply(RunView.load(target), rng)


def judge(outcome: Outcome, verdict: str, kinds: Sequence[str]) -> bool:
    """Did the verifier answer what the mutation requires?"""
    if outcome.verdict == "FAIL":
        return verdict == "FAIL" and bool(outcome.kinds.intersection(kinds))
    return verdict == outcome.verdict
