"""Verify a run: stream its logs once, rebuild the committed lineage, judge every obligation.

One pass reads each attempt's rank logs side by side (so only the epochs in flight hold sample
counts), checks every record as it streams by, and keeps per rank only the runs of steps it
logged. When all attempts are read, interval arithmetic over those runs settles the step-level
obligations (resume points, missing and duplicated steps and records), the epochs still open are
judged, and the metrics are computed from the same data.

A run that has not finished (stopped, still running, given up) is held to every obligation over
its committed prefix — the steps up to the last durable checkpoint (:mod:`verifier.lineage`) —
and its final attempt's later records are tentative: checked record by record, never committed.
If nothing but the steps after the prefix is lacking, the verdict is UNKNOWN with one reason
that says how far the run is proved and how to continue it.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import find_runs, is_run_dir
from verifier import goodput
from verifier._scan import Batch, RankLog
from verifier._witness import report_epochs
from verifier.anomalies import Anomaly, AnomalySink, Location, Note
from verifier.audit import AuditCoverage, EpochHashes, StepAudit
from verifier.coverage import (
    EpochVerdict,
    Interval,
    SampleCoverage,
    StepRuns,
    clip,
    difference,
    merge,
    overlaps,
    size,
)
from verifier.errors import Unusable, VerifierError
from verifier.lineage import AttemptPlan, Lineage, lineage_of
from verifier.replay import DEFAULT_TOLERANCE, ReplayTracker
from verifier.result import (
    AttemptSummary,
    RunResult,
    Series,
    Unfinished,
    Verdict,
    VerifyResult,
)
from verifier.sameorder import compare_order
from verifier.schema import RunInputs, read_inputs
from verifier.windows import RecordContext, check_records, format_ids

__all__ = ["verify", "verify_run", "Progress"]

Progress = Callable[[str], None]

_CRASH = "crash while writing"
_TORN = {"running": "still being written", "stopped": "cut short by the stop"}
"""Why an attempt's log may end in a torn line, by the attempt's status."""


@dataclass(slots=True)
class _AttemptStats:
    records: int = 0
    first_time: float | None = None
    last_time: float | None = None
    commit_time: float | None = None
    timeline: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]] = field(
        default_factory=list)
    timeline_rank: int | None = None


class _RunCheck:
    """The state of one run's verification: what has been read, counted and found so far."""

    def __init__(self, inputs: RunInputs, lineage: Lineage, *, want_series: bool,
                 reference_loss: npt.NDArray[np.float64] | None,
                 progress: Progress | None, want_windows: bool = False,
                 replay_tolerance: float = DEFAULT_TOLERANCE) -> None:
        self.inputs = inputs
        self.lineage = lineage
        self.geometry = inputs.geometry
        self.manifest = inputs.manifest
        self.target = inputs.manifest.target_steps
        # Steps 0..end-1 must be committed: all of them once the run finished, else the prefix
        # up to the last durable checkpoint.
        durable = lineage.durable
        self.end = self.target if lineage.finished else \
            min(self.target, 0 if durable is None else durable + 1)
        self.want_series = want_series
        self.reference_loss = reference_loss
        self.progress = progress
        self.epoch_verdicts: list[EpochVerdict] = []
        self.sink = AnomalySink()
        for anomaly in lineage.anomalies:
            self.sink.add(anomaly)
        self.notes: list[Note] = [*inputs.notes, *lineage.notes]
        self.unknown: list[str] = []
        self.aborted = False
        self.audit = inputs.audit
        self.samples: SampleCoverage | None = None
        if self.manifest.log_ids:
            self.samples = (AuditCoverage(self.geometry, self.end,
                                          require_all=inputs.epoch_coverage == "all")
                            if self.audit else
                            SampleCoverage(self.geometry, self.manifest.seed, self.end))
        # Audit mode (an external sampler): steps judged across ranks, epochs by hash when
        # only hashes are logged.
        self.step_audit = (StepAudit(global_batch=self.geometry.global_batch, sink=self.sink)
                           if self.audit else None)
        self.epoch_hashes = (EpochHashes() if self.audit and not self.manifest.log_ids
                             and inputs.epoch_coverage == "all" else None)
        self.replay = ReplayTracker(plans=lineage.plans,
                                    global_batch=self.geometry.global_batch,
                                    deterministic=inputs.deterministic,
                                    tolerance=replay_tolerance, sink=self.sink)
        # --same-order: each committed step's global window as count + multiset hash (the
        # hash is additive, so the ranks' hashes sum to the window's at any world size).
        self.win_hash = np.zeros(self.target, dtype=np.uint64) if want_windows else None
        self.win_count = np.zeros(self.target, dtype=np.int64) if want_windows else None
        self.finished_epochs: set[int] = set()
        self.late_records = 0
        self.irregular = False
        self.ledgers: dict[tuple[int, int], StepRuns] = {}
        self.files: dict[tuple[int, int], str] = {}
        self.stats: dict[int, _AttemptStats] = {p.attempt: _AttemptStats()
                                                for p in lineage.plans}
        self.records = 0
        self.committed_records = 0
        self.shards = 0
        self.tentative_records = 0
        self.tentative_shards = 0
        self.fast_records = 0
        self.order_only = 0
        self.loss_sum = np.zeros(self.target) if want_series else None
        self.loss_n = np.zeros(self.target, dtype=np.int64) if want_series else None
        self._last_progress = time.monotonic()

    # -- scanning --------------------------------------------------------------------------

    def scan(self) -> None:
        try:
            for plan in self.lineage.plans:
                self._scan_attempt(plan)
        except (RunFormatError, Unusable) as exc:
            self.unknown.append(str(exc))
            self.aborted = True

    def _say(self, message: str, *, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 2.0:
            self._last_progress = now
            self.progress(message)

    def _scan_attempt(self, plan: AttemptPlan) -> None:
        k, w = plan.attempt, plan.world_size
        b = self.geometry.global_batch
        # An external sampler's ranks may hold unequal shares of B: only their sum is checked.
        local = b // w if b % w == 0 and not self.audit else None
        if local is None and not self.audit:
            self.sink.add(Anomaly(
                kind="world_size_mismatch", file="supervisor.json", attempt=k,
                message=f"attempt {k} ran with world size {w}, which does not divide the global "
                        f"batch {b}: no rank can have an exact shard",
                expected=f"a divisor of {b}", actual=str(w)))
        files = self.inputs.paths.rank_logs(k)
        readers = []
        for rank, path in files.items():
            rel = self.inputs.rel(path)
            self.files[(k, rank)] = rel
            if rank >= w:
                if path.stat().st_size:
                    self.sink.add(Anomaly(
                        kind="misplaced_record", file=rel, line=1, attempt=k, rank=rank,
                        message=f"attempt {k} ran with world size {w}, but {rel} holds records "
                                f"of rank {rank} (rank collision or a stray log)",
                        expected=f"ranks 0..{w - 1}", actual=f"rank {rank}"))
                continue
            self.ledgers[(k, rank)] = StepRuns()
            readers.append(RankLog(
                path, attempt=k, rank=rank, world_size=w, local_batch=local,
                geometry=self.geometry, seed=self.manifest.seed, torn_ok=plan.torn_ok,
                start_step=plan.lo, fast=not self.audit,
                log_ids=self.manifest.log_ids,
                want_loss=self.want_series or self.replay.wants(k)))
        stats = self.stats[k]
        stats.timeline_rank = min((r.rank for r in readers), default=None)
        streams = [(r, r.batches()) for r in readers]
        while streams:
            for reader, stream in list(streams):
                batch = next(stream, None)
                if batch is None:
                    streams.remove((reader, stream))
                    if reader.torn is not None:
                        self.notes.append(Note(
                            kind="torn_line", file=self.inputs.rel(reader.path),
                            line=reader.torn[0],
                            message=f"torn last line ignored ({_TORN.get(plan.status, _CRASH)}): "
                                    f"{reader.torn[1]!r}"))
                    continue
                self._take(plan, reader, batch)
            if self.samples is not None and plan.on_chain and not self.irregular:
                reach = min((r.next_step for r, _ in streams), default=None)
                if plan.hi is not None:
                    reach = plan.hi + 1 if reach is None else min(reach, plan.hi + 1)
                if reach is not None:
                    self._judge_epochs(self.samples.finish_before(reach))
            self._say(f"attempt {k}: {self.records:,} records read")
        self.fast_records += sum(r.fast_records for r in readers)
        if self.step_audit is not None:
            self.step_audit.drop_attempt(k)
        self.replay.attempt_done(k)
        self._say(f"attempt {k} done ({self.records:,} records so far)", force=True)

    def _take(self, plan: AttemptPlan, reader: RankLog, batch: Batch) -> None:
        n = len(batch)
        if n == 0:
            return
        k, rank = plan.attempt, reader.rank
        self.records += n
        stats = self.stats[k]
        stats.records += n
        steps = batch.steps
        ledger = self.ledgers[(k, rank)]
        previous = ledger.stops[-1] - 1 if ledger.stops else None
        ledger.add(steps, batch.first_line)
        if not plan.on_chain:
            committed = np.zeros(n, dtype=bool)
        elif plan.hi is None:
            committed = np.ones(n, dtype=bool)
        else:
            committed = steps <= plan.hi
        tentative = ~committed if plan.tentative else np.zeros(n, dtype=bool)
        rel = self.files[(k, rank)]
        self._order(plan, rel, rank, batch, previous, committed)
        ncommit = int(np.count_nonzero(committed))
        ntent = int(np.count_nonzero(tentative))
        self.committed_records += ncommit
        self.tentative_records += ntent
        if batch.fast:
            self.shards += ncommit
            self.tentative_shards += ntent
        else:
            ctx = RecordContext(file=rel, attempt=k, rank=rank, world_size=plan.world_size,
                                local_batch=reader.local_batch, geometry=self.geometry,
                                seed=self.manifest.seed, audit=self.audit)
            compared, reordered = check_records(batch, committed, ctx, self.sink)
            self.shards += compared
            self.order_only += reordered
            if ntent:
                compared, reordered = check_records(batch, tentative, replace(ctx, tentative=True),
                                                    self.sink)
                self.tentative_shards += compared
                self.order_only += reordered
        times = batch.time
        lo_t, hi_t = float(times.min()), float(times.max())
        stats.first_time = lo_t if stats.first_time is None else min(stats.first_time, lo_t)
        stats.last_time = hi_t if stats.last_time is None else max(stats.last_time, hi_t)
        if ncommit:
            t = float(times[committed].max())
            stats.commit_time = t if stats.commit_time is None else max(stats.commit_time, t)
        if self.want_series:
            self._series(batch, committed, rank, stats)
        if self.replay.wants(k):
            self.replay.take(attempt=k, rank=rank, steps=steps, loss=batch.loss,
                             local_batch=reader.local_batch or 0 if batch.fast
                             else batch.column("local_batch"),
                             first_line=batch.first_line, file=rel)
        if self.audit and ncommit:  # audit mode never takes the fast path
            self._audit(plan, rel, rank, batch, committed)
        if self.win_hash is not None and ncommit:
            self._windows(plan, reader, batch, committed)
        if self.samples is not None and ncommit:
            if batch.id_block is not None:
                self._count_block(batch, committed)
            elif batch.ids is not None:
                self._count_samples(plan, rel, rank, batch, committed)

    def _audit(self, plan: AttemptPlan, rel: str, rank: int, batch: Batch,
               committed: npt.NDArray[np.bool_]) -> None:
        """Audit mode: hand the committed records to the cross-rank and epoch-hash checks."""
        rows = np.flatnonzero(committed)
        counts = batch.column("sample_ids_count")
        if self.step_audit is not None:
            for i in rows.tolist():
                self.step_audit.add(
                    attempt=plan.attempt, world_size=plan.world_size, step=int(batch.steps[i]),
                    rank=rank, count=int(counts[i]),
                    ids=batch.ids[i] if batch.ids is not None else None, file=rel,
                    line=batch.first_line + i)
        if self.epoch_hashes is not None:
            assert batch.hashes is not None
            self.epoch_hashes.add(batch.steps[rows] // self.geometry.steps_per_epoch,
                                  counts[rows], batch.hashes[rows])

    def _windows(self, plan: AttemptPlan, reader: RankLog, batch: Batch,
                 committed: npt.NDArray[np.bool_]) -> None:
        assert self.win_hash is not None and self.win_count is not None
        rows = np.flatnonzero(committed & (batch.steps < self.target))
        steps = batch.steps[rows]
        if batch.fast:
            # Proven equal to the expected shards, whose hashes the fast path compared.
            hashes = semantics.shard_hashes(self.geometry, self.manifest.seed, steps,
                                            reader.rank, plan.world_size)
            counts: npt.NDArray[np.int64] | int = reader.local_batch or 0
        else:
            assert batch.hashes is not None
            hashes = batch.hashes[rows]
            counts = batch.column("sample_ids_count")[rows]
        np.add.at(self.win_hash, steps, hashes)
        np.add.at(self.win_count, steps, counts)

    def _order(self, plan: AttemptPlan, rel: str, rank: int, batch: Batch,
               previous: int | None, committed: npt.NDArray[np.bool_]) -> None:
        steps = batch.steps
        before = np.empty_like(steps)
        before[1:] = steps[:-1]
        before[0] = steps[0] if previous is None else previous
        back = np.flatnonzero((steps < before) & committed)
        if back.size == 0:
            return
        self.irregular = True
        self.sink.add_many("step_order", int(back.size), (Anomaly(
            kind="step_order", file=rel, line=batch.first_line + int(i), attempt=plan.attempt,
            step=int(steps[i]), rank=rank,
            message=f"rank {rank} logged step {steps[i]} after step {before[i]}: its records go "
                    "backwards",
            expected=f"step {before[i] + 1}", actual=f"step {steps[i]}") for i in back))

    def _series(self, batch: Batch, committed: npt.NDArray[np.bool_], rank: int,
                stats: _AttemptStats) -> None:
        assert self.loss_sum is not None and self.loss_n is not None
        rows = np.flatnonzero(committed & (batch.steps < self.target))
        if rows.size and batch.loss is not None:
            np.add.at(self.loss_sum, batch.steps[rows], batch.loss[rows])
            np.add.at(self.loss_n, batch.steps[rows], 1)
        if rank == stats.timeline_rank:
            stride = max(1, len(batch) // 64)
            stats.timeline.append((batch.time[::stride].copy(), batch.steps[::stride].copy()))

    def _count_block(self, batch: Batch, committed: npt.NDArray[np.bool_]) -> None:
        """Fast-path IDs: proven equal to the shards, so only counting is left."""
        assert self.samples is not None and batch.id_block is not None
        rows = np.flatnonzero(committed)
        epochs = batch.steps[rows] // self.geometry.steps_per_epoch
        cuts = (np.flatnonzero(epochs[1:] != epochs[:-1]) + 1).tolist()
        for lo, hi in zip([0, *cuts], [*cuts, rows.size], strict=True):
            epoch = int(epochs[lo])
            if epoch in self.finished_epochs:
                self.late_records += hi - lo
                continue
            self.samples.add_epoch(epoch, batch.id_block[rows[lo:hi]].ravel())

    def _count_samples(self, plan: AttemptPlan, rel: str, rank: int, batch: Batch,
                       committed: npt.NDArray[np.bool_]) -> None:
        assert self.samples is not None and batch.ids is not None
        d = self.geometry.dataset_size
        s = self.geometry.steps_per_epoch
        by_epoch: dict[int, list[npt.NDArray[np.int64]]] = {}
        for i in np.flatnonzero(committed).tolist():
            ids = batch.ids[i]
            if ids is None:
                continue
            step = int(batch.steps[i])
            epoch = step // s
            outside = ids[(ids < 0) | (ids >= d)]
            if outside.size:
                self.sink.add(Anomaly(
                    kind="extra_sample", file=rel, line=batch.first_line + i,
                    attempt=plan.attempt, step=step, rank=rank, epoch=epoch,
                    sample_ids=tuple(outside[:8].tolist()), count=int(outside.size),
                    message=f"rank {rank} at step {step} consumed {format_ids(outside)}, outside "
                            f"the dataset's IDs 0..{d - 1}",
                    expected=f"IDs in [0, {d})", actual=format_ids(outside)))
            if epoch in self.finished_epochs:
                self.late_records += 1
                continue
            by_epoch.setdefault(epoch, []).append(ids)
        for epoch, parts in by_epoch.items():
            self.samples.add_epoch(epoch, np.concatenate(parts))

    # -- judging ---------------------------------------------------------------------------

    def _judge_epochs(self, verdicts: list[EpochVerdict]) -> None:
        for v in verdicts:
            self.finished_epochs.add(v.epoch)
            self.epoch_verdicts.append(v)

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
                if self.samples is not None:
                    self._judge_epochs(self.samples.finish_all())
                if self.epoch_hashes is not None:
                    self.epoch_hashes.judge(dataset_size=self.geometry.dataset_size,
                                            steps_per_epoch=self.geometry.steps_per_epoch,
                                            end=self.end, sink=self.sink)
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
            records=self.records, loss=self._mean_loss(), reference=self.reference_loss)
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
                loss=self._mean_loss(), reference_loss=self.reference_loss,
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
            sampler=self.manifest.sampler, replay=self.replay.summary())

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
                          target_steps=self.target, message="")

    def _account(self, u: Unfinished, checked: dict[str, int], *, prefix_only: bool) -> str:
        """The one line on an unfinished run: how far it is proved and what to do."""
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
        if u.status == "running":
            # A supervisor killed outright leaves 'running' behind; `ecrl run` then continues.
            hint = (f"verify again when it has finished (if its supervisor was killed, continue "
                    f"it with `ecrl run --out {shlex.quote(str(self.inputs.root))}`)")
        else:
            hint = f"continue it with `ecrl run --out {shlex.quote(str(self.inputs.root))}`"
        if prefix_only:
            if end == 0:
                return (f"{head}: no durable checkpoint yet, so nothing is committed; {rest} — "
                        f"{hint}")
            proved = "proved exactly once" if self._conclusive(checked) else "committed"
            return (f"{head}: steps 0..{end - 1} {proved} up to the last durable checkpoint; "
                    f"{rest} — {hint}")
        scope = (f"steps 0..{end - 1}, up to the last durable checkpoint" if end
                 else "no step (no durable checkpoint yet)")
        return (f"{head}: the verdict covers the committed prefix, {scope}, and the tentative "
                f"records after it; {rest}")

    def _mean_loss(self) -> npt.NDArray[np.float64] | None:
        if self.loss_sum is None or self.loss_n is None:
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.loss_n > 0, self.loss_sum / np.maximum(self.loss_n, 1), np.nan)

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
        return summaries, chain_sets

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
        where = (f"resumed from the checkpoint at step {plan.resumed_from}"
                 if plan.resumed_from is not None else "started fresh")
        if first > expected + 1:
            what = f"steps {expected}..{first - 1} were skipped"
        elif first > expected:
            what = f"step {expected} was skipped"
        else:
            what = f"committed step {first} was run again"
        message = (f"attempt {k} {where}, so its first step must be {expected}; rank {rank}'s "
                   f"first record is step {first}: {what}")
        if not plan.on_chain:
            self.notes.append(Note(kind="resume", file=self.files[(k, rank)], line=1,
                                   message=message + " (attempt not in the committed lineage)"))
            return
        self.sink.add(Anomaly(kind="resume_mismatch", file=self.files[(k, rank)], line=1,
                              attempt=k, step=first, rank=rank, message=message,
                              expected=f"step {expected}", actual=f"step {first}"))

    def _ranks(self, plan: AttemptPlan, clipped: dict[int, list[tuple[int, int, int]]],
               expected: list[Interval]) -> None:
        k = plan.attempt
        span = (f"attempt {k} commits steps {expected[0][0]}..{expected[-1][1] - 1}"
                if expected else f"attempt {k} commits no step")
        for rank, runs in clipped.items():
            rel = self.files.get((k, rank), f"logs/attempt-{k:03d}/rank-{rank:03d}.jsonl")
            found = overlaps([(s, e) for s, e, _ in runs])
            total = sum(o.stop - o.start for o in found)
            self.sink.add_many("duplicate_record", total, (Anomaly(
                kind="duplicate_record", file=rel, line=runs[o.again][2] + o.start
                - runs[o.again][0], attempt=k, step=o.start, rank=rank,
                count=o.stop - o.start,
                message=f"rank {rank} logged step {o.start} twice (lines "
                        f"{runs[o.first][2] + o.start - runs[o.first][0]} and "
                        f"{runs[o.again][2] + o.start - runs[o.again][0]})"
                        + (f", and {o.stop - o.start - 1} more steps after it"
                           if o.stop - o.start > 1 else ""),
                related=(Location(file=rel, line=runs[o.first][2] + o.start - runs[o.first][0],
                                  attempt=k, step=o.start, rank=rank),)) for o in found))
            have = merge((s, e) for s, e, _ in runs)
            missing = difference(expected, have)
            exists = (k, rank) in self.ledgers
            self.sink.add_many("missing_record", size(missing), (
                self._missing_record(plan, rank, rel, exists, runs, gap, span)
                for gap in missing))

    def _missing_record(self, plan: AttemptPlan, rank: int, rel: str, exists: bool,
                        runs: list[tuple[int, int, int]], gap: Interval, span: str) -> Anomaly:
        k = plan.attempt
        start, stop = gap
        other = next((r for r in range(plan.world_size) if r != rank
                      and (k, r) in self.ledgers
                      and self.ledgers[(k, r)].line_of(start) is not None), None)
        related: tuple[Location, ...] = ()
        seen = ""
        if other is not None:
            line = self.ledgers[(k, other)].line_of(start)
            related = (Location(file=self.files[(k, other)], line=line, attempt=k, step=start,
                                rank=other),)
            seen = f", which rank {other} logged (line {line})"
        if not exists:
            message = (f"{rel} does not exist: rank {rank} has no record of step {start}"
                       f"{seen}; {span}")
            line = None
        else:
            before = [r for r in runs if r[1] <= start]
            after = [r for r in runs if r[0] >= stop]
            line = (before[-1][2] + before[-1][1] - 1 - before[-1][0]) if before else None
            context = ""
            if before and after:
                context = (f" (its log goes from step {before[-1][1] - 1} at line {line} to "
                           f"step {after[0][0]} at line {after[0][2]})")
            elif before:
                context = f" (its log stops at step {before[-1][1] - 1}, line {line})"
            elif after:
                context = f" (its log starts at step {after[0][0]}, line {after[0][2]})"
            message = f"rank {rank} has no record of step {start}{seen}; {span}{context}"
        if stop - start > 1:
            message += f" ({stop - start} consecutive steps missing)"
        return Anomaly(kind="missing_record", file=rel, line=line, attempt=k, step=start,
                       rank=rank, count=stop - start, message=message, related=related)

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
        more = f" (and {stop - start - 1} more steps after it)" if stop - start > 1 else ""
        return Anomaly(kind="duplicate_step", file=b.file, line=b.line, attempt=again,
                       step=start, rank=b.rank, count=stop - start, related=(a,),
                       message=f"step {start} was committed by attempt {first} and again by "
                               f"attempt {again}{more}")

    def _missing_step(self, gap: Interval) -> Anomaly:
        start, stop = gap
        chain = self.lineage.chain
        owner = next((p for p in chain if p.lo <= start and (p.hi is None or start <= p.hi)),
                     None)
        if owner is None:
            why = "no attempt of the committed lineage covers it"
        elif owner.hi is None:
            last = self._last_logged(owner.attempt)
            why = (f"the final attempt {owner.attempt} "
                   + (f"stopped after step {last}, although supervisor.json says it completed"
                      if last is not None and last < start else "logged no record of it"))
        else:
            why = (f"attempt {owner.attempt} should have committed steps "
                   f"{owner.lo}..{owner.hi}, but no rank logged step {start}")
        more = f"; steps {start}..{stop - 1} ({stop - start}) are missing" \
            if stop - start > 1 else ""
        return Anomaly(kind="missing_step", attempt=owner.attempt if owner else None,
                       step=start, count=stop - start,
                       message=f"step {start} was never committed: {why}{more}")

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
                       message=f"attempt {owner} committed step {start}, but the run's target "
                               f"is {self.target} steps (0..{self.target - 1})"
                       + (f"; {stop - start} steps beyond it" if stop - start > 1 else ""))

    def _samples(self) -> None:
        rank_files = {key: (self.inputs.root / rel, rel) for key, rel in self.files.items()}
        report_epochs(self.epoch_verdicts, sink=self.sink, geometry=self.geometry,
                      seed=self.manifest.seed, chain=self.lineage.chain, rank_files=rank_files,
                      order_known=not self.audit)


def _unknown(path: Path, reason: str) -> RunResult:
    return RunResult(path=str(path), verdict="UNKNOWN", unknown=(reason,))


def verify_run(path: str | Path, *, series: bool = False,
               reference_loss: npt.NDArray[np.float64] | None = None,
               progress: Progress | None = None, windows: bool = False,
               replay_tolerance: float = DEFAULT_TOLERANCE) -> RunResult:
    """Verify one run directory. Never raises for a bad run: problems become the verdict.

    ``windows``: keep each committed step's global window (count + hash) in ``series``, for
    ``--same-order``. ``replay_tolerance``: relative tolerance of replay consistency where
    bit-identical losses are not expected."""
    root = Path(path)
    try:
        inputs = read_inputs(root)
    except Unusable as exc:
        return _unknown(root, str(exc))
    lineage = lineage_of(inputs)
    check = _RunCheck(inputs, lineage, want_series=series or reference_loss is not None,
                      reference_loss=reference_loss, progress=progress, want_windows=windows,
                      replay_tolerance=replay_tolerance)
    check.scan()
    return check.finish()


def verify(path: str | Path, reference: str | Path | None = None, *, series: bool = False,
           progress: Progress | None = None, same_order: str | Path | None = None,
           replay_tolerance: float = DEFAULT_TOLERANCE) -> VerifyResult:
    """Verify the run directory ``path``, or every run directory below it.

    ``reference``: a run whose per-step losses the runs are compared with (loss divergence).
    ``same_order``: a run that should have consumed the same global window at every step (same
    seed, other world sizes or failures): compared step by step (:mod:`verifier.sameorder`).
    ``replay_tolerance``: see :mod:`verifier.replay`.
    ``series``: keep per-step losses and timelines for plots (``write_report`` needs them).
    Raises :class:`~verifier.errors.VerifierError` only when ``path`` or ``reference`` is not
    something to verify at all; a bad run is a verdict, not an exception.
    """
    root = Path(path)
    if not (replay_tolerance >= 0 and math.isfinite(replay_tolerance)):
        raise VerifierError(f"--replay-tolerance {replay_tolerance}: give a finite relative "
                            "tolerance >= 0 (for example 1e-5)")
    if not root.exists():
        raise VerifierError(f"{root}: no such file or directory; give a run directory or a "
                            "folder of runs")
    if not root.is_dir():
        raise VerifierError(f"{root}: not a directory; give a run directory (the folder with "
                            "run.json and logs/) or a folder of runs")
    reference_loss = None
    notes: list[Note] = []
    if reference is not None:
        ref = Path(reference)
        if not ref.is_dir() or not is_run_dir(ref):
            raise VerifierError(f"--reference {ref}: not a run directory (it needs run.json "
                                "and logs/)")
        ref_result = verify_run(ref, series=True)
        if ref_result.series is not None:
            reference_loss = ref_result.series.loss
        account = ref_result.unfinished.message if ref_result.unfinished is not None else None
        if ref_result.verdict == "UNKNOWN" and ref_result.unknown == (account,):
            assert ref_result.unfinished is not None
            notes.append(Note(kind="reference",
                              message=f"the reference run {ref} is unfinished: losses are "
                                      f"compared over its committed steps 0.."
                                      f"{ref_result.unfinished.committed_steps - 1}"))
        elif ref_result.verdict != "PASS":
            notes.append(Note(kind="reference",
                              message=f"the reference run {ref} is {ref_result.verdict} itself; "
                                      "its losses may not be a fair reference"))
    other = None
    if same_order is not None:
        other_root = Path(same_order)
        if not other_root.is_dir() or not is_run_dir(other_root):
            raise VerifierError(f"--same-order {other_root}: not a run directory (it needs "
                                "run.json and logs/)")
        other = verify_run(other_root, windows=True, replay_tolerance=replay_tolerance)
    try:
        runs = find_runs(root)
    except OSError as exc:
        raise VerifierError(f"{root}: cannot list: {exc.strerror}") from None
    if not runs:
        return VerifyResult(path=str(root), runs=(), unknown=(
            f"{root}: no run directory here or below (a run directory holds run.json; hidden "
            "folders are skipped)",))
    results = []
    for run in runs:
        if progress is not None:
            progress(f"verifying {run}")
        result = verify_run(run, series=series, reference_loss=reference_loss,
                            progress=progress, windows=other is not None,
                            replay_tolerance=replay_tolerance)
        if other is not None:
            result = compare_order(result, other)
        if notes:
            result = _with_notes(result, notes)
        results.append(result)
    return VerifyResult(path=str(root), runs=tuple(results))


def _with_notes(result: RunResult, notes: list[Note]) -> RunResult:
    return replace(result, warnings=(*result.warnings, *notes))
