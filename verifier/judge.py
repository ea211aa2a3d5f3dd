"""Judgement: settle the step-level obligations from what :mod:`verifier.ingest` read.

Interval arithmetic over each rank's runs of steps finds the resume points, missing and
duplicated steps and records, and the steps beyond the target; the epochs already counted become
sample witnesses (:mod:`verifier._witness`); then the verdict — PASS only with evidence, FAIL on
any witness, UNKNOWN with one reason — and, for a run that has not finished, its account.

A run that has not finished (stopped, still running, given up) is held to every obligation over
its committed prefix — the steps up to the last durable checkpoint (:mod:`verifier.lineage`) —
and its final attempt's later records are tentative: checked record by record, never committed.
If nothing but the steps after the prefix is lacking, the verdict is UNKNOWN with one reason
that says how far the run is proved and how to continue it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from verifier import goodput
from verifier._witness import report_epochs
from verifier.anomalies import Anomaly, Location, Note
from verifier.attemptrecords import RECORDED_BY
from verifier.coverage import Interval, clip, difference, merge, overlaps, size
from verifier.explain import account, resume_sentence
from verifier.ingest import Ingest
from verifier.lineage import AttemptPlan
from verifier.result import AttemptSummary, RunResult, Series, Unfinished, Verdict
from verifier.state import check_state

__all__ = ["Judge"]


class Judge:
    """The obligations of one run, judged over the facts its :class:`Ingest` collected."""

    def __init__(self, facts: Ingest) -> None:
        self.facts = facts
        # What the judgement reads: the run's inputs and lineage, the per-rank ledgers of step
        # runs (with their files), per-attempt statistics and counters, the epochs counted.
        self.inputs = facts.inputs
        self.lineage = facts.lineage
        self.manifest = facts.manifest
        self.geometry = facts.geometry
        self.target = facts.target
        self.end = facts.end
        self.aborted = facts.aborted
        self.audit = facts.audit
        self.ledgers = facts.ledgers
        self.files = facts.files
        self.stats = facts.stats
        self.records = facts.records
        self.committed_records = facts.committed_records
        self.shards = facts.shards
        self.tentative_records = facts.tentative_records
        self.tentative_shards = facts.tentative_shards
        self.fast_records = facts.fast_records
        self.order_only = facts.order_only
        self.late_records = facts.late_records
        self.samples = facts.samples
        self.epoch_hashes = facts.epoch_hashes
        self.step_audit = facts.step_audit
        self.epoch_verdicts = facts.epoch_verdicts
        self.replay = facts.replay
        self.want_series = facts.want_series
        self.reference_loss = facts.reference_loss
        self.win_hash = facts.win_hash
        self.win_count = facts.win_count
        # Found so far, and what the judgement adds (shared with the ingest).
        self.sink = facts.sink
        self.notes = facts.notes
        self.unknown = facts.unknown

    def finish(self) -> RunResult:
        plans = self.lineage.plans
        summaries, chain_sets = self._attempts(plans)
        committed_steps = size(merge(iv for _, ivs in chain_sets for iv in ivs))
        # An unfinished run without a durable checkpoint commits nothing by rule; its account
        # (_account) says so instead of "empty lineage".
        nothing_due = not self.lineage.finished and self.end == 0
        if not self.aborted:
            if self.committed_records:
                self._steps(chain_sets)
            elif not nothing_due:
                self.unknown.append(
                    "the committed lineage is empty: no attempt logged a committed step, so "
                    "nothing can be verified")
        # Epochs judged before the logs became unreadable were complete: their witnesses count.
        if self.epoch_verdicts:
            self._samples()
        if self.late_records:
            self.notes.append(Note(
                kind="late_records",
                message=f"{self.late_records} committed records arrived after their epoch was "
                        "judged (their records go backwards); their samples were not counted"))
        if self.order_only:
            self.notes.append(Note(
                kind="sample_order",
                message=f"{self.order_only} record{'s' if self.order_only != 1 else ''} logged "
                        "their shard's IDs in another order (the same samples)"))
        times = {k: (st.first_time, st.last_time, st.commit_time)
                 for k, st in self.stats.items()}
        metrics = goodput.compute(
            self.inputs, summaries, times, committed_steps=committed_steps,
            records=self.records, loss=self.facts.mean_loss(), reference=self.reference_loss)
        checked = {
            "attempts": len(plans),
            "records": self.records,
            "committed_records": self.committed_records,
            "shards": self.shards,
            "tentative_records": self.tentative_records,
            "tentative_shards": self.tentative_shards,
            "committed_steps": committed_steps,
            "target_steps": self.target,
            "epochs": self.samples.epochs_checked if self.samples is not None
            else self.epoch_hashes.epochs_checked if self.epoch_hashes is not None else 0,
            "fast_path_records": self.fast_records,
        }
        if self.step_audit is not None:
            checked["steps_audited"] = self.step_audit.steps_judged
        if self.audit and not self.manifest.log_ids \
                and self.inputs.epoch_coverage != "all" and not self.aborted:
            self.unknown.append(
                "an external sampler that may drop part of each epoch (epoch_coverage "
                "drop_remainder) logged hashes only: which samples an epoch may leave out is "
                "unknown, so exactly-once cannot be proved from hashes; log sample IDs "
                "(log_ids) to audit it")
        state = check_state(self.inputs, self.lineage, self.sink, self.notes, self.unknown)
        divergent = self.sink.witnesses.get("replay_divergence")
        if divergent and state.matched:
            # The state loaded at the resume was proved equal to the saved one: a divergence
            # then comes from the data or randomness outside the state, not from the restore.
            self.sink.witnesses["replay_divergence"] = [
                replace(a, evidence={**a.evidence, "state_attested": True})
                if a.attempt in state.matched else a for a in divergent]
        unfinished = None if self.lineage.finished else self._unfinished(summaries)
        verdict, prefix_only = self._verdict(checked, unfinished)
        if unfinished is not None:
            unfinished = replace(unfinished, message=self._account(
                unfinished, checked, prefix_only=prefix_only))
            if prefix_only:
                self.unknown.insert(0, unfinished.message)
            else:
                self.notes.insert(0, Note(kind="unfinished", file="supervisor.json",
                                          message=unfinished.message))
        series = None
        if self.want_series:
            series = Series(
                loss=self.facts.mean_loss(), reference_loss=self.reference_loss,
                timeline=[(k, np.concatenate([t for t, _ in st.timeline]),
                           np.concatenate([s for _, s in st.timeline]))
                          for k, st in self.stats.items() if st.timeline],
                checkpoints=goodput.checkpoint_points(self.inputs),
                start_time=min((a.start_time for a in self.inputs.supervisor.attempts),
                               default=None))
        if self.win_hash is not None:
            series = replace(series or Series(), window_hash=self.win_hash,
                             window_count=self.win_count)
        return RunResult(
            path=str(self.inputs.root), verdict=verdict, anomalies=tuple(self.sink.ordered()),
            anomaly_counts={k: self.sink.counts[k] for k in self.sink.witnesses},
            warnings=tuple(self.notes), unknown=tuple(self.unknown), checked=checked,
            metrics=metrics, lineage=tuple(summaries), log_ids=self.manifest.log_ids,
            series=series, unfinished=unfinished, windows_checked=not self.audit,
            sampler=self.manifest.sampler, replay=self.replay.summary(), state=state)

    def _conclusive(self, checked: dict[str, int]) -> bool:
        """Whether the committed records were all compared (the guard against vacuous passes)."""
        return not (checked["committed_records"] == 0 or checked["shards"] == 0
                    or checked["shards"] < checked["committed_records"]
                    or ((self.samples is not None or self.epoch_hashes is not None)
                        and checked["epochs"] == 0))

    def _verdict(self, checked: dict[str, int], unfinished: Unfinished | None
                 ) -> tuple[Verdict, bool]:
        """The verdict, and whether it is UNKNOWN only because the run has not finished."""
        if self.sink:
            return "FAIL", False
        if self.unknown:
            return "UNKNOWN", False
        if unfinished is not None and self.end < self.target:
            # Only steps after the durable prefix are lacking: not a failure, not a proof.
            if self.end and not self._conclusive(checked):
                self.unknown.append(
                    f"nothing conclusive was checked in the committed prefix "
                    f"({checked['shards']} shards of {checked['committed_records']} committed "
                    "records)")
            return "UNKNOWN", True
        vacuous = not self._conclusive(checked) or checked["committed_steps"] < self.target
        if vacuous:
            self.unknown.append(
                f"nothing conclusive was checked ({checked['shards']} shards of "
                f"{checked['committed_records']} committed records, "
                f"{checked['committed_steps']} of {self.target} steps)")
            return "UNKNOWN", False
        return "PASS", False

    def _unfinished(self, summaries: list[AttemptSummary]) -> Unfinished:
        state = self.inputs.supervisor
        final = state.attempts[-1]
        status = state.status if state.status != "completed" else final.status
        k = final.attempt
        w = final.world_size
        lasts = [self.ledgers[(k, r)].last_step if (k, r) in self.ledgers else None
                 for r in range(w)]
        every = [x for x in lasts if x is not None]
        last = min(every) if len(every) == w else summaries[-1].last_step
        return Unfinished(status=status, attempt=k, last_step=last,
                          durable_step=self.lineage.durable, committed_steps=self.end,
                          target_steps=self.target, message="",
                          command="launch" if "launch" in state.extra else (
                              "standalone" if state.extra.get("recorded_by") == RECORDED_BY
                              else "run"))

    def _account(self, u: Unfinished, checked: dict[str, int], *, prefix_only: bool) -> str:
        """The one line on an unfinished run (written by :func:`verifier.explain.account`)."""
        return account(u, root=self.inputs.root, prefix_only=prefix_only,
                       conclusive=self._conclusive(checked))

    def _attempts(self, plans: tuple[AttemptPlan, ...]
                  ) -> tuple[list[AttemptSummary], list[tuple[int, list[Interval]]]]:
        summaries = []
        chain_sets: list[tuple[int, list[Interval]]] = []
        by_attempt = {a.attempt: a for a in self.inputs.supervisor.attempts}
        lows: dict[int, int] = {}
        for plan in plans:
            k, w = plan.attempt, plan.world_size
            ranks = {r: self.ledgers[(k, r)] for (a, r) in self.ledgers if a == k}
            executed = merge((s, e) for runs in ranks.values() for s, e, _ in runs.runs())
            firsts = {r: runs.first_step for r, runs in ranks.items()
                      if runs.first_step is not None}
            lasts = [runs.last_step for runs in ranks.values() if runs.last_step is not None]
            if lasts:
                lows[k] = min(lasts)
            union: list[Interval] = []
            if plan.on_chain and not self.aborted:
                # All committed records (steps run again below lo included) for duplicates;
                # the steps the attempt should run, lo..hi, for the ranks each step needs.
                full = {r: ranks[r].clipped(0, plan.hi) if r in ranks else [] for r in range(w)}
                union = merge((s, e) for runs in full.values() for s, e, _ in runs)
                self._ranks(plan, full, clip(union, plan.lo, 2**63))
            if not self.aborted:
                self._resume(plan, firsts)
            if union:
                chain_sets.append((k, union))
            a = by_attempt[k]
            stats = self.stats[k]
            uncommitted = size(executed) - size(union)
            summaries.append(AttemptSummary(
                attempt=k, world_size=w, resumed_from_step=plan.resumed_from,
                status=a.status, exit_code=a.exit_code,
                first_step=min(firsts.values()) if firsts else None,
                last_step=max(lasts) if lasts else None,
                committed=(union[0][0], union[-1][1] - 1) if union else None,
                records=stats.records,
                replayed_steps=0 if plan.tentative else uncommitted,
                tentative_steps=uncommitted if plan.tentative else 0,
                start_time=a.start_time, end_time=a.end_time))
        self._summary_notes(summaries, lows)
        self._ending_notes(summaries)
        return summaries, chain_sets

    def _ending_notes(self, summaries: list[AttemptSummary]) -> None:
        """What the runtime's attempt endings promise about replayed work (docs/strategies.md):
        a just-in-time checkpoint that was saved replays at most one step; a deadline stop
        replays none (its final checkpoint is its last step)."""
        endings = self.inputs.supervisor.extra.get("endings", {})
        final = self.inputs.supervisor.attempts[-1].attempt
        for s in summaries:
            if s.attempt == final:
                continue
            ending = endings.get(str(s.attempt)) if isinstance(endings, dict) else None
            jit = ending.get("jit") if isinstance(ending, dict) else None
            saved = isinstance(jit, dict) and jit.get("saved") is True
            step = jit.get("global_step") if isinstance(jit, dict) else None
            if s.status in ("jit", "hung") and saved and s.replayed_steps > 1:
                self.notes.append(Note(
                    kind="ending", file="supervisor.json",
                    message=f"attempt {s.attempt} ended {s.status} with a just-in-time "
                            f"checkpoint of step {step}, yet "
                            f"{s.replayed_steps} of its steps were replayed (at most 1 "
                            "expected)"))
            elif s.status == "deadline" and s.replayed_steps > 0:
                self.notes.append(Note(
                    kind="ending", file="supervisor.json",
                    message=f"attempt {s.attempt} stopped at its deadline, yet "
                            f"{s.replayed_steps} of its steps were replayed (its final "
                            "checkpoint should be its last step)"))

    def _summary_notes(self, summaries: list[AttemptSummary], lows: dict[int, int]) -> None:
        for s, a in zip(summaries, self.inputs.supervisor.attempts, strict=True):
            if a.first_step is not None and s.first_step is not None \
                    and a.first_step != s.first_step:
                self.notes.append(Note(
                    kind="supervisor", file="supervisor.json",
                    message=f"attempt {s.attempt}: supervisor.json says first_step "
                            f"{a.first_step}, the logs start at step {s.first_step}"))
            # The runtime records the last step every rank logged; the summary has the last
            # step any rank logged. Ranks of an attempt that did not complete may differ.
            low = lows.get(s.attempt)
            if a.last_step is not None and s.last_step is not None and low is not None \
                    and not low <= a.last_step <= s.last_step:
                self.notes.append(Note(
                    kind="supervisor", file="supervisor.json",
                    message=f"attempt {s.attempt}: supervisor.json says last_step "
                            f"{a.last_step}, the logs end at step "
                            + (f"{s.last_step}" if low == s.last_step
                               else f"{low} (every rank) to {s.last_step} (some rank)")))

    def _resume(self, plan: AttemptPlan, firsts: dict[int, int]) -> None:
        if not firsts:
            return
        k = plan.attempt
        rank, first = min(firsts.items(), key=lambda kv: (kv[1], kv[0]))
        expected = plan.lo
        if first == expected or (first > expected and any(f == expected
                                                          for f in firsts.values())):
            return
        if not plan.on_chain:
            message = resume_sentence(attempt=k, resumed_from=plan.resumed_from,
                                      expected=expected, rank=rank, first=first)
            self.notes.append(Note(kind="resume", file=self.files[(k, rank)], line=1,
                                   message=message + " (attempt not in the committed lineage)"))
            return
        self.sink.add(Anomaly(kind="resume_mismatch", file=self.files[(k, rank)], line=1,
                              attempt=k, step=first, rank=rank,
                              expected=f"step {expected}", actual=f"step {first}",
                              evidence={"resumed_from": plan.resumed_from,
                                        "expected_step": expected}))

    def _ranks(self, plan: AttemptPlan, clipped: dict[int, list[tuple[int, int, int]]],
               expected: list[Interval]) -> None:
        k = plan.attempt
        span = (expected[0][0], expected[-1][1] - 1) if expected else None
        for rank, runs in clipped.items():
            rel = self.files.get((k, rank), f"logs/attempt-{k:03d}/rank-{rank:03d}.jsonl")
            found = overlaps([(s, e) for s, e, _ in runs])
            total = sum(o.stop - o.start for o in found)
            self.sink.add_many("duplicate_record", total, (Anomaly(
                kind="duplicate_record", file=rel, line=runs[o.again][2] + o.start
                - runs[o.again][0], attempt=k, step=o.start, rank=rank,
                count=o.stop - o.start,
                related=(Location(file=rel, line=runs[o.first][2] + o.start - runs[o.first][0],
                                  attempt=k, step=o.start, rank=rank),)) for o in found))
            have = merge((s, e) for s, e, _ in runs)
            missing = difference(expected, have)
            exists = (k, rank) in self.ledgers
            self.sink.add_many("missing_record", size(missing), (
                self._missing_record(plan, rank, rel, exists, runs, gap, span)
                for gap in missing))

    def _missing_record(self, plan: AttemptPlan, rank: int, rel: str, exists: bool,
                        runs: list[tuple[int, int, int]], gap: Interval,
                        span: tuple[int, int] | None) -> Anomaly:
        k = plan.attempt
        start, stop = gap
        other = next((r for r in range(plan.world_size) if r != rank
                      and (k, r) in self.ledgers
                      and self.ledgers[(k, r)].line_of(start) is not None), None)
        related: tuple[Location, ...] = ()
        if other is not None:
            related = (Location(file=self.files[(k, other)],
                                line=self.ledgers[(k, other)].line_of(start), attempt=k,
                                step=start, rank=other),)
        # The rank's own log around the gap: (step, line) of its last record before and its
        # first record after.
        before = after = None
        line = None
        if exists:
            earlier = [r for r in runs if r[1] <= start]
            later = [r for r in runs if r[0] >= stop]
            if earlier:
                line = earlier[-1][2] + earlier[-1][1] - 1 - earlier[-1][0]
                before = (earlier[-1][1] - 1, line)
            if later:
                after = (later[0][0], later[0][2])
        return Anomaly(kind="missing_record", file=rel, line=line, attempt=k, step=start,
                       rank=rank, count=stop - start, related=related,
                       evidence={"exists": exists, "file": rel, "span": span,
                                 "before": before, "after": after})

    def _where(self, attempt: int, step: int) -> Location:
        ranks = sorted(r for (a, r) in self.ledgers if a == attempt)
        for r in ranks:
            line = self.ledgers[(attempt, r)].line_of(step)
            if line is not None:
                return Location(file=self.files[(attempt, r)], line=line, attempt=attempt,
                                step=step, rank=r)
        return Location(attempt=attempt, step=step)

    def _steps(self, chain_sets: list[tuple[int, list[Interval]]]) -> None:
        flat = [(iv, k) for k, ivs in chain_sets for iv in ivs]
        found = overlaps([iv for iv, _ in flat])
        self.sink.add_many("duplicate_step", sum(o.stop - o.start for o in found), (
            self._duplicate_step(flat[o.first][1], flat[o.again][1], o.start, o.stop)
            for o in found))
        union = merge(iv for iv, _ in flat)
        missing = difference([(0, self.end)], union)
        self.sink.add_many("missing_step", size(missing), (
            self._missing_step(gap) for gap in missing))
        extra = clip(union, self.target, 2**63)
        self.sink.add_many("extra_step", size(extra), (
            self._extra_step(flat, gap) for gap in extra))

    def _duplicate_step(self, first: int, again: int, start: int, stop: int) -> Anomaly:
        a, b = self._where(first, start), self._where(again, start)
        return Anomaly(kind="duplicate_step", file=b.file, line=b.line, attempt=again,
                       step=start, rank=b.rank, count=stop - start, related=(a,))

    def _missing_step(self, gap: Interval) -> Anomaly:
        start, stop = gap
        chain = self.lineage.chain
        owner = next((p for p in chain if p.lo <= start and (p.hi is None or start <= p.hi)),
                     None)
        return Anomaly(kind="missing_step", attempt=owner.attempt if owner else None,
                       step=start, count=stop - start,
                       evidence={"owner": owner.attempt if owner else None,
                                 "owner_lo": owner.lo if owner else None,
                                 "owner_hi": owner.hi if owner else None,
                                 "last_logged": self._last_logged(owner.attempt)
                                 if owner is not None and owner.hi is None else None})

    def _last_logged(self, attempt: int) -> int | None:
        lasts = [runs.last_step for (a, _), runs in self.ledgers.items()
                 if a == attempt and runs.last_step is not None]
        return max(lasts) if lasts else None

    def _extra_step(self, flat: list[tuple[Interval, int]], gap: Interval) -> Anomaly:
        start, stop = gap
        owner = next(k for (a, b), k in flat if a <= start < b)
        where = self._where(owner, start)
        return Anomaly(kind="extra_step", file=where.file, line=where.line, attempt=owner,
                       step=start, rank=where.rank, count=stop - start,
                       evidence={"target": self.target})

    def _samples(self) -> None:
        rank_files = {key: (self.inputs.root / rel, rel) for key, rel in self.files.items()}
        report_epochs(self.epoch_verdicts, sink=self.sink, geometry=self.geometry,
                      seed=self.manifest.seed, chain=self.lineage.chain, rank_files=rank_files,
                      order_known=not self.audit)
