"""Explainers: the one-line message of an anomaly, written from its data.

The checkers (:mod:`verifier.judge`, :mod:`verifier.ingest`, :mod:`verifier.audit`,
:mod:`verifier.replay`, :mod:`verifier.sameorder`) record *what* is wrong as data: an
:class:`~verifier.anomalies.Anomaly` with its kind, where (file, line, attempt, step, rank),
``expected``/``actual``, ``related`` records and ``evidence`` (the kind's own facts). This module
turns that data into the sentence people read, one explainer per kind, as Elle's explainers do;
:class:`~verifier.anomalies.Anomaly` calls :func:`explain` when it is built without a message.
Kinds whose checkers still write their own sentence (the record-level kinds of
:mod:`verifier.windows`, the sample kinds of :mod:`verifier._witness`, ``unknown_checkpoint``)
have no explainer here yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ecrl.contract import semantics
from verifier.windows import format_ids

if TYPE_CHECKING:
    from verifier.anomalies import Anomaly

__all__ = ["explain", "EXPLAINERS", "resume_sentence"]


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


def _world_size_mismatch(a: Anomaly, e: Mapping[str, Any]) -> str:
    return (f"attempt {a.attempt} ran with world size {e['world_size']}, which does not divide "
            f"the global batch {e['global_batch']}: no rank can have an exact shard")


def _misplaced_record(a: Anomaly, e: Mapping[str, Any]) -> str:
    return (f"attempt {a.attempt} ran with world size {e['world_size']}, but {a.file} holds "
            f"records of rank {a.rank} (rank collision or a stray log)")


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
    return (f"step {a.step}: attempt {e['failed_attempt']} (world size "
            f"{e['failed_world_size']}) computed global loss {e['failed_loss']!r}; attempt "
            f"{a.attempt} (world size {e['world_size']}), resumed from the checkpoint at step "
            f"{e['resumed_from']}, computed {e['loss']!r} (relative difference "
            f"{e['relative_difference']:.3g}, {why}): the resume did not restore the training "
            "state")


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
    "global_batch_mismatch": _global_batch_mismatch,
    "rank_overlap": _rank_overlap,
    "epoch_hash_mismatch": _epoch_hash_mismatch,
    "replay_divergence": _replay_divergence,
    "order_mismatch": _order_mismatch,
}
"""Kind -> explainer, for the kinds whose checkers record evidence instead of a sentence."""


def explain(anomaly: Anomaly) -> str:
    """The message of ``anomaly``, from its fields and evidence."""
    explainer = EXPLAINERS.get(anomaly.kind)
    if explainer is None:
        raise ValueError(f"anomaly kind {anomaly.kind!r} has no explainer: give its message")
    return explainer(anomaly, anomaly.evidence)
