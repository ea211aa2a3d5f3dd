"""Explainers: the one-line message of an anomaly, written from its data.

The checkers (:mod:`verifier.judge`, :mod:`verifier.ingest`, :mod:`verifier.windows`,
:mod:`verifier._witness`, :mod:`verifier.lineage`, :mod:`verifier.audit`, :mod:`verifier.replay`,
:mod:`verifier.sameorder`) record *what* is wrong as data: an
:class:`~verifier.anomalies.Anomaly` with its kind, where (file, line, attempt, step, rank),
``expected``/``actual``, ``related`` records and ``evidence`` (the kind's own facts). This module
turns that data into the sentence people read, one explainer per kind, as Elle's explainers do;
only the report (:mod:`verifier.report`) calls :func:`explain`; an anomaly holds no text.
:func:`account` writes an unfinished run's one-line account from its
:class:`~verifier.result.Unfinished` data. (Warnings and unknown reasons are still written where
they are found.)
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ecrl.contract import semantics
from verifier.anomalies import Location
from verifier.windows import format_ids

if TYPE_CHECKING:
    from verifier.anomalies import Anomaly
    from verifier.result import Unfinished

__all__ = ["explain", "EXPLAINERS", "resume_sentence", "account"]


def _more(count: int, unit: str) -> str:
    return f", and {count - 1} more {unit} after it" if count > 1 else ""


def resume_sentence(*, attempt: int, resumed_from: int | None, expected: int, rank: int,
                    first: int) -> str:
    """Why a resumed attempt's first record is wrong (an anomaly, or a note off the chain)."""
    where = (f"resumed from the checkpoint at step {resumed_from}"
             if resumed_from is not None else "started fresh")
    if first > expected + 1:
        what = f"steps {expected}..{first - 1} were skipped"
    elif first > expected:
        what = f"step {expected} was skipped"
    else:
        what = f"committed step {first} was run again"
    return (f"attempt {attempt} {where}, so its first step must be {expected}; rank {rank}'s "
            f"first record is step {first}: {what}")


def _resume_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    assert a.attempt is not None and a.rank is not None and a.step is not None
    return resume_sentence(attempt=a.attempt, resumed_from=e["resumed_from"],
                           expected=e["expected_step"], rank=a.rank, first=a.step)


def _duplicate_record(a: Anomaly, e: Mapping[str, Any]) -> str:
    first = a.related[0].line
    return (f"rank {a.rank} logged step {a.step} twice (lines {first} and {a.line})"
            + _more(a.count, "steps"))


def _span(e: Mapping[str, Any], attempt: int | None) -> str:
    span = e["span"]
    return (f"attempt {attempt} commits steps {span[0]}..{span[1]}" if span is not None
            else f"attempt {attempt} commits no step")


def _missing_record(a: Anomaly, e: Mapping[str, Any]) -> str:
    seen = ""
    if a.related:
        other = a.related[0]
        seen = f", which rank {other.rank} logged (line {other.line})"
    span = _span(e, a.attempt)
    if not e["exists"]:
        message = (f"{e['file']} does not exist: rank {a.rank} has no record of step {a.step}"
                   f"{seen}; {span}")
    else:
        before, after = e["before"], e["after"]
        context = ""
        if before and after:
            context = (f" (its log goes from step {before[0]} at line {before[1]} to step "
                       f"{after[0]} at line {after[1]})")
        elif before:
            context = f" (its log stops at step {before[0]}, line {before[1]})"
        elif after:
            context = f" (its log starts at step {after[0]}, line {after[1]})"
        message = f"rank {a.rank} has no record of step {a.step}{seen}; {span}{context}"
    if a.count > 1:
        message += f" ({a.count} consecutive steps missing)"
    return message


def _duplicate_step(a: Anomaly, e: Mapping[str, Any]) -> str:
    more = f" (and {a.count - 1} more steps after it)" if a.count > 1 else ""
    return (f"step {a.step} was committed by attempt {a.related[0].attempt} and again by "
            f"attempt {a.attempt}{more}")


def _missing_step(a: Anomaly, e: Mapping[str, Any]) -> str:
    owner = e["owner"]
    if owner is None:
        why = "no attempt of the committed lineage covers it"
    elif e["owner_hi"] is None:
        last = e["last_logged"]
        why = (f"the final attempt {owner} "
               + (f"stopped after step {last}, although supervisor.json says it completed"
                  if last is not None and last < a.step else "logged no record of it"))
    else:
        why = (f"attempt {owner} should have committed steps {e['owner_lo']}..{e['owner_hi']}, "
               f"but no rank logged step {a.step}")
    assert a.step is not None
    more = (f"; steps {a.step}..{a.step + a.count - 1} ({a.count}) are missing"
            if a.count > 1 else "")
    return f"step {a.step} was never committed: {why}{more}"


def _extra_step(a: Anomaly, e: Mapping[str, Any]) -> str:
    target = e["target"]
    return (f"attempt {a.attempt} committed step {a.step}, but the run's target is {target} "
            f"steps (0..{target - 1})"
            + (f"; {a.count} steps beyond it" if a.count > 1 else ""))


def _step_order(a: Anomaly, e: Mapping[str, Any]) -> str:
    return (f"rank {a.rank} logged step {a.step} after step {e['previous']}: its records go "
            "backwards")


_TENTATIVE = " (a tentative record: after the last durable checkpoint of an unfinished run)"


def _tentative(e: Mapping[str, Any]) -> str:
    """Record-level witnesses of an unfinished run's tentative records say so."""
    return _TENTATIVE if e.get("tentative") else ""


def _world_size_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    if "says" in e:  # a record disagrees with its attempt
        world, local = e["says"]
        return (f"the record says world_size {world}, local_batch {local}; attempt "
                f"{a.attempt} ran with world size {e['world_size']}"
                + (f" (local batch {e['local_batch']})" if e["local_batch"] else "")
                + _tentative(e))
    return (f"attempt {a.attempt} ran with world size {e['world_size']}, which does not divide "
            f"the global batch {e['global_batch']}: no rank can have an exact shard")


def _misplaced_record(a: Anomaly, e: Mapping[str, Any]) -> str:
    if "claims" in e:  # a record claims another attempt or rank than its file's
        attempt, rank = e["claims"]
        return (f"the record says attempt {attempt}, rank {rank}, but it is in the log of "
                f"attempt {a.attempt}, rank {a.rank}" + _tentative(e))
    return (f"attempt {a.attempt} ran with world size {e['world_size']}, but {a.file} holds "
            f"records of rank {a.rank} (rank collision or a stray log)")


def _wrong_cursor(a: Anomaly, e: Mapping[str, Any]) -> str:
    s = e["steps_per_epoch"]
    epoch, cursor = e["says"]
    assert a.step is not None
    return (f"step {a.step} is (epoch {a.step // s}, cursor {a.step % s}) with {s} steps per "
            f"epoch; the record says (epoch {epoch}, cursor {cursor})" + _tentative(e))


def _hash_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    return (f"sample_ids_hash {semantics.format_hash(e['hash'])} and count {e['count']} do not "
            f"describe the {e['ids_count']} logged IDs, which hash to "
            f"{semantics.format_hash(e['ids_hash'])}" + _tentative(e))


def _shard_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    if "ids" in e:
        return (f"rank {a.rank} at step {a.step} consumed {format_ids(e['ids'])} instead of its "
                f"shard {format_ids(e['shard'])}: unexpected {format_ids(e['unexpected'])}, "
                f"absent {format_ids(e['absent'])}" + _tentative(e))
    return (f"rank {a.rank} at step {a.step} logged {e['count']} IDs hashing to "
            f"{semantics.format_hash(e['hash'])}; its shard is {e['local_batch']} IDs hashing "
            f"to {semantics.format_hash(e['expected_hash'])}" + _tentative(e))


def _unknown_checkpoint(a: Anomaly, e: Mapping[str, Any]) -> str:
    shown = ", ".join(map(str, e["recorded"])) or "none"
    return (f"attempt {a.attempt} resumed from step {a.step}, but no earlier attempt recorded a "
            f"checkpoint at step {a.step} (recorded: {shown})")


def _describe(loc: Location) -> str:
    return f"step {loc.step} rank {loc.rank} (attempt {loc.attempt}, {loc.file}:{loc.line})"


def _consumers(a: Anomaly) -> list[Location]:
    """The records that consumed a sample witness, in lineage order (the anomaly's own record
    is the last of them)."""
    if a.file is None:
        return list(a.related)
    return [*a.related, Location(file=a.file, line=a.line, attempt=a.attempt, step=a.step,
                                 rank=a.rank)]


def _scope(a: Anomaly, e: Mapping[str, Any]) -> str:
    """The epoch's scope, after its first witness only."""
    scope = e.get("scope")
    if scope is None:
        return ""
    word = {"duplicate_sample": "duplicated", "missing_sample": "missing",
            "extra_sample": "extra"}[a.kind]
    n, ids = scope["count"], scope["ids"]
    return (f"; {n} {word} sample{'s' if n != 1 else ''} in epoch {a.epoch}: {format_ids(ids)}"
            + (f" (first {len(ids)} shown)" if n > len(ids) else ""))


def _duplicate_sample(a: Anomaly, e: Mapping[str, Any]) -> str:
    found = _consumers(a)
    how = (" by " + " and ".join(_describe(f) for f in found[:2])) if found else ""
    return f"sample {e['sample']} was consumed twice in epoch {a.epoch}{how}" + _scope(a, e)


def _extra_sample(a: Anomaly, e: Mapping[str, Any]) -> str:
    if "outside" in e:  # IDs outside the data set, found record by record
        return (f"rank {a.rank} at step {a.step} consumed {format_ids(e['outside'])}, outside "
                f"the dataset's IDs 0..{e['dataset_size'] - 1}")
    found = _consumers(a)
    how = (" by " + _describe(found[0])) if found else ""
    return (f"sample {e['sample']} is not in epoch {a.epoch}'s committed windows but was "
            f"consumed{how}" + _scope(a, e))


def _missing_sample(a: Anomaly, e: Mapping[str, Any]) -> str:
    if a.step is None:
        return f"sample {e['sample']} of epoch {a.epoch} was never consumed" + _scope(a, e)
    who = f", rank {a.rank}" if a.rank is not None else ""
    return (f"sample {e['sample']} of epoch {a.epoch} was never consumed: it belongs to step "
            f"{a.step}{who}" + _scope(a, e))


def _global_batch_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    counts: Mapping[int, int] = e["counts"]
    listed = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
    return (f"step {a.step} consumed {sum(counts.values())} samples over its {len(counts)} "
            f"ranks ({listed}); the global batch is {e['global_batch']}")


def _rank_overlap(a: Anomaly, e: Mapping[str, Any]) -> str:
    first, second = e["ranks"]
    shared = e["shared"]
    return (f"ranks {first} and {second} both consumed sample {shared[0]} at step {a.step}"
            + (f"; {a.count} samples shared between ranks at this step: "
               f"{format_ids(shared)}" if a.count > 1 else ""))


def _epoch_hash_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    d, s, count = e["dataset_size"], e["steps_per_epoch"], e["count"]
    epoch = a.epoch or 0
    how = ("more samples than declared (a duplicate or extra sample)" if count > d
           else "fewer samples than declared (a missing sample)" if count < d
           else "as many samples as declared, but not the same ones")
    return (f"epoch {epoch} (steps {epoch * s}..{(epoch + 1) * s - 1}) consumed {count} samples "
            f"hashing to {semantics.format_hash(e['hash'])}: {how}; the declared set "
            f"0..{d - 1} hashes to {semantics.format_hash(e['expected_hash'])} (log sample IDs "
            "to see which)")


def _replay_divergence(a: Anomaly, e: Mapping[str, Any]) -> str:
    why = ("bit-identical expected at the same world size" if e["exact"]
           else f"above the relative tolerance {e['tolerance']:g}")
    cause = ("the state it loaded matched every saved digest, so the data it was given at the "
             "resume (its position in the data order) or randomness outside the saved state "
             "differs" if e.get("state_attested") else
             "the resume did not restore the training state, or not the data position")
    return (f"step {a.step}: attempt {e['failed_attempt']} (world size "
            f"{e['failed_world_size']}) computed global loss {e['failed_loss']!r}; attempt "
            f"{a.attempt} (world size {e['world_size']}), resumed from the checkpoint at step "
            f"{e['resumed_from']}, computed {e['loss']!r} (relative difference "
            f"{e['relative_difference']:.3g}, {why}): {cause}")


def _order_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    other = e["other"]
    if e["only_here"] is not None:
        what = (f"only here {format_ids(e['only_here'])}, only in {other} "
                f"{format_ids(e['only_there'])}")
    else:
        what = (f"{e['count']} samples hashing to {semantics.format_hash(e['hash'])} here, "
                f"{e['other_count']} hashing to {semantics.format_hash(e['other_hash'])} there")
    more = f"; {a.count} steps differ in all" if a.count > 1 else ""
    return f"step {a.step} is the first step whose global window differs from {other}'s: " \
        f"{what}{more}"


def account(u: Unfinished, *, root: Path, prefix_only: bool, conclusive: bool) -> str:
    """The one line on an unfinished run: how far it is proved and what to do.

    ``prefix_only``: nothing but the steps after the committed prefix is lacking (the verdict is
    UNKNOWN for that reason alone); ``conclusive``: the prefix's records were all compared."""
    if u.last_step is None:
        head = f"run not finished (status {u.status!r}; attempt {u.attempt} logged no step)"
    elif u.status == "running":
        head = f"run not finished (status 'running', at step {u.last_step})"
    else:
        head = f"run not finished (status {u.status!r} after step {u.last_step})"
    t, end = u.target_steps, u.committed_steps
    if end >= t:
        return (f"{head}, but its last durable checkpoint (step {u.durable_step}) already "
                f"commits every target step 0..{t - 1}")
    rest = f"steps {end}..{t - 1} not committed yet"
    if u.command == "standalone":
        # No supervisor: 'running' may be a live attempt or one that died.
        hint = ("verify again when it has finished, or, if it died, launch the script again on "
                f"{shlex.quote(str(root))} (it resumes from its last checkpoint)")
    elif u.status == "running":
        # A supervisor killed outright leaves 'running' behind; `ecrl run` then continues.
        hint = (f"verify again when it has finished (if its supervisor was killed, continue "
                f"it with `ecrl {u.command} --out {shlex.quote(str(root))}`)")
    else:
        hint = f"continue it with `ecrl {u.command} --out {shlex.quote(str(root))}`"
    if prefix_only:
        if end == 0:
            return (f"{head}: no durable checkpoint yet, so nothing is committed; {rest} — "
                    f"{hint}")
        proved = "proved exactly once" if conclusive else "committed"
        return (f"{head}: steps 0..{end - 1} {proved} up to the last durable checkpoint; "
                f"{rest} — {hint}")
    scope = (f"steps 0..{end - 1}, up to the last durable checkpoint" if end
             else "no step (no durable checkpoint yet)")
    return (f"{head}: the verdict covers the committed prefix, {scope}, and the tentative "
            f"records after it; {rest}")


def _state_digest_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    saved_at = a.related[0]
    if e["form"] == "step":
        return (f"attempt {a.attempt} resumed from the checkpoint at step {a.step} "
                f"({saved_at.file}:{saved_at.line}), but the state it loaded is that of step "
                f"{e['loaded_step']}")
    return (f"attempt {a.attempt} restored {e['object']} with digest {e['restored']}, but the "
            f"checkpoint at step {a.step} saved it with digest {e['saved']} "
            f"({saved_at.file}:{saved_at.line})")


def _state_not_restored(a: Anomaly, e: Mapping[str, Any]) -> str:
    saved_at = a.related[0]
    restored = ", ".join(e["restored_objects"]) or "nothing"
    return (f"attempt {a.attempt} resumed from the checkpoint at step {a.step}, which saved "
            f"{e['object']} ({saved_at.file}:{saved_at.line}), but did not restore it "
            f"(restored: {restored})")


_MESH_REASONS = {
    "sizes": "names another mesh than rank {reference} of its attempt",
    "product": "names a mesh whose DP x TP is not the attempt's world size",
    "batch": "names a data-parallel size that does not divide the global batch",
    "range": "names coordinates outside its mesh",
    "collision": "names the place on the mesh that rank {other} holds",
    "unnamed": "names no mesh coordinates while rank {reference} of its attempt does",
    "partial": "names only some of dp_rank, dp_size, tp_rank, tp_size",
}


def _mesh_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    if e["reason"] == "changed":
        return (f"rank {a.rank} at step {a.step} names {a.actual}, but it began attempt "
                f"{a.attempt} with {a.expected}: a mesh changes only at a resume"
                + _tentative(e))
    why = _MESH_REASONS[e["reason"]].format(reference=e.get("reference"), other=e.get("other"))
    return (f"rank {a.rank} of attempt {a.attempt} (world size {e['world_size']}) {why}: it "
            f"says {a.actual}, expected {a.expected}")


def _tp_peer_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    def said(value: list[int] | None) -> str:
        if value is None:
            return "its shard"
        ids = "ID" if value[0] == 1 else "IDs"
        return f"{value[0]} {ids} hashing to {semantics.format_hash(value[1])}"

    peer = a.related[0]
    return (f"ranks {a.rank} and {e['peer']} share data-parallel rank {e['dp_rank']} (of "
            f"{e['tp_size']} tensor-parallel peers), yet at step {a.step} rank {a.rank} "
            f"consumed {said(e['says'])} and rank {e['peer']} {said(e['peer_says'])} "
            f"({peer.file}:{peer.line})")


EXPLAINERS: Mapping[str, Callable[[Anomaly, Mapping[str, Any]], str]] = {
    "resume_mismatch": _resume_mismatch,
    "duplicate_record": _duplicate_record,
    "missing_record": _missing_record,
    "duplicate_step": _duplicate_step,
    "missing_step": _missing_step,
    "extra_step": _extra_step,
    "step_order": _step_order,
    "world_size_mismatch": _world_size_mismatch,
    "misplaced_record": _misplaced_record,
    "wrong_cursor": _wrong_cursor,
    "hash_mismatch": _hash_mismatch,
    "shard_mismatch": _shard_mismatch,
    "unknown_checkpoint": _unknown_checkpoint,
    "duplicate_sample": _duplicate_sample,
    "extra_sample": _extra_sample,
    "missing_sample": _missing_sample,
    "global_batch_mismatch": _global_batch_mismatch,
    "rank_overlap": _rank_overlap,
    "epoch_hash_mismatch": _epoch_hash_mismatch,
    "replay_divergence": _replay_divergence,
    "order_mismatch": _order_mismatch,
    "state_digest_mismatch": _state_digest_mismatch,
    "state_not_restored": _state_not_restored,
    "mesh_mismatch": _mesh_mismatch,
    "tp_peer_mismatch": _tp_peer_mismatch,
}
"""Kind -> explainer, for the kinds whose checkers record evidence instead of a sentence."""


def explain(anomaly: Anomaly) -> str:
    """The message of ``anomaly``, from its fields and evidence."""
    explainer = EXPLAINERS.get(anomaly.kind)
    if explainer is None:
        raise ValueError(f"anomaly kind {anomaly.kind!r} has no explainer: give its message")
    return explainer(anomaly, anomaly.evidence)
