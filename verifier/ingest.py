"""Ingest: stream a run's logs once into facts for the judgement (:mod:`verifier.judge`).

One pass reads each attempt's rank logs side by side (so only the epochs in flight hold sample
counts), checks every record as it streams by (:mod:`verifier.windows`: fields, shards, hashes;
in audit mode :mod:`verifier.audit`), counts samples per epoch, collects the replay windows
(:mod:`verifier.replay`) and keeps per rank only the runs of steps it logged. What it leaves
behind — ledgers of step runs with their lines, per-attempt statistics, counters, the epochs
judged — is what :class:`verifier.judge.Judge` settles the step-level obligations from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import check_entry
from verifier._parallel import ScannedFile, ScannedLog, ScanTask, Submit
from verifier._scan import Batch, RankLog
from verifier.anomalies import Anomaly, AnomalySink, Note
from verifier.audit import AuditCoverage, EpochHashes, StepAudit
from verifier.coverage import EpochVerdict, SampleCoverage, StepRuns
from verifier.errors import Unusable
from verifier.lineage import AttemptPlan, Lineage
from verifier.mesh import AttemptMesh, TpPeers, attempt_mesh, first_record
from verifier.replay import DEFAULT_TOLERANCE, ReplayTracker
from verifier.schema import RunInputs
from verifier.windows import RecordContext, check_records, format_ids

__all__ = ["Ingest", "AttemptStats", "Progress"]

Progress = Callable[[str], None]

_CRASH = "crash while writing"
_TORN = {"running": "still being written", "stopped": "cut short by the stop"}
"""Why an attempt's log may end in a torn line, by the attempt's status."""


@dataclass(slots=True)
class AttemptStats:
    records: int = 0
    first_time: float | None = None
    last_time: float | None = None
    commit_time: float | None = None
    timeline: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]] = field(
        default_factory=list)
    timeline_rank: int | None = None


class Ingest:
    """Reading one run's logs into facts: what each rank logged (runs of steps with their lines),
    what each attempt's records say, the per-record and per-epoch checks made while streaming."""

    def __init__(self, inputs: RunInputs, lineage: Lineage, *, want_series: bool,
                 reference_loss: npt.NDArray[np.float64] | None,
                 progress: Progress | None, want_windows: bool = False,
                 replay_tolerance: float = DEFAULT_TOLERANCE,
                 submit: Submit | None = None) -> None:
        self.inputs = inputs
        self.submit = submit
        self._scans: dict[int, dict[int, Future[ScannedFile]]] = {}
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
        self.stats: dict[int, AttemptStats] = {p.attempt: AttemptStats()
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
        self.meshes: dict[int, AttemptMesh] = {}
        self._peeked: dict[int, AttemptMesh | None] = {}
        """Attempts that ran on a mesh (:mod:`verifier.mesh`); the others are plain DDP."""
        self.tp_peers = TpPeers()

    # -- scanning --------------------------------------------------------------------------

    def scan(self) -> None:
        plans = self.lineage.plans
        try:
            for i, plan in enumerate(plans):
                # With workers: the next attempt's files are scanned while this one is judged.
                for ahead in plans[i : i + 2]:
                    self._start_scans(ahead)
                self._scan_attempt(plan)
        except (RunFormatError, Unusable) as exc:
            self.unknown.append(str(exc))
            self.aborted = True
        finally:
            for futures in self._scans.values():
                for future in futures.values():
                    future.cancel()
        self.close()

    def _local_batch(self, plan: AttemptPlan) -> int | None:
        b, w = self.geometry.global_batch, plan.world_size
        # An external sampler's ranks may hold unequal shares of B: only their sum is checked.
        return b // w if b % w == 0 and not self.audit else None

    def _log_options(self, plan: AttemptPlan, rank: int, *, ahead: bool = False
                     ) -> dict[str, Any]:
        """RankLog's arguments for one rank log of ``plan`` (other than the path). ``ahead``:
        for a scan started before the attempts before it are judged (losses read whenever
        the replay check may want them; reading more never changes a verdict)."""
        wants = self.replay.may_want if ahead else self.replay.wants
        mesh = self._peek_mesh(plan)
        place = mesh.places.get(rank) if mesh is not None else None
        return dict(attempt=plan.attempt, rank=rank, world_size=plan.world_size,
                    local_batch=place.local_batch if place is not None
                    else self._local_batch(plan),
                    shard_rank=place.shard_rank if place is not None else None,
                    shard_world=place.shard_world if place is not None else None,
                    mesh_fields=place.fields if place is not None else None,
                    geometry=self.geometry,
                    seed=self.manifest.seed, torn_ok=plan.torn_ok, start_step=plan.lo,
                    fast=not self.audit, root=self.inputs.root, log_ids=self.manifest.log_ids,
                    want_loss=self.want_series or wants(plan.attempt))

    def _start_scans(self, plan: AttemptPlan) -> None:
        if self.submit is None or plan.attempt in self._scans:
            return
        try:
            files = self.inputs.paths.rank_logs(plan.attempt)
        except OSError:
            # Not ahead of time: the attempt's own turn lists it again and meets the error
            # where reading in process would.
            return
        self._scans[plan.attempt] = {
            rank: self.submit(ScanTask(path, self._log_options(plan, rank, ahead=True)))
            for rank, path in files.items() if rank < plan.world_size}

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
        mesh = self._attempt_mesh(plan)
        local = self._local_batch(plan)
        scans = self._scans.pop(k, None)
        if local is None and not self.audit and mesh is None:
            self.sink.add(Anomaly(
                kind="world_size_mismatch", file="supervisor.json", attempt=k,
                expected=f"a divisor of {b}", actual=str(w),
                evidence={"world_size": w, "global_batch": b}))
        files = self.inputs.paths.rank_logs(k)
        readers: list[RankLog | ScannedLog] = []
        for rank, path in files.items():
            rel = self.inputs.rel(path)
            self.files[(k, rank)] = rel
            if rank >= w:
                why = check_entry(path)
                if why is not None:
                    raise RunFormatError(rel, None, f"{why}, not a regular file (a run "
                                         "directory's files are never followed through links)")
                if path.stat().st_size:
                    self.sink.add(Anomaly(
                        kind="misplaced_record", file=rel, line=1, attempt=k, rank=rank,
                        expected=f"ranks 0..{w - 1}", actual=f"rank {rank}",
                        evidence={"world_size": w}))
                continue
            self.ledgers[(k, rank)] = StepRuns()
            if scans is not None and rank in scans:
                options = self._log_options(plan, rank)  # the worker's RankLog had these
                readers.append(ScannedLog(
                    path, scans[rank], rank=rank, local_batch=options["local_batch"],
                    start_step=plan.lo, world_size=w, shard_rank=options["shard_rank"],
                    shard_world=options["shard_world"], mesh_fields=options["mesh_fields"]))
            else:
                readers.append(RankLog(path, **self._log_options(plan, rank)))
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

    def _peek_mesh(self, plan: AttemptPlan) -> AttemptMesh | None:
        """:meth:`_attempt_mesh` without reporting (a scan's options, possibly ahead of the
        attempt's turn: its anomalies are reported in that turn, in the order of one process)."""
        if plan.attempt not in self._peeked:
            self._peeked[plan.attempt] = self._attempt_mesh(plan, sink=AnomalySink(),
                                                            keep=False)
        return self._peeked[plan.attempt]

    def _attempt_mesh(self, plan: AttemptPlan, *, sink: AnomalySink | None = None,
                      keep: bool = True) -> AttemptMesh | None:
        """The mesh ``plan``'s attempt ran on, from its ranks' first records (None: DDP)."""
        if self.audit:
            return None
        files = {r: p for r, p in self.inputs.paths.rank_logs(plan.attempt).items()
                 if r < plan.world_size}
        mesh = attempt_mesh(
            attempt=plan.attempt, world_size=plan.world_size,
            global_batch=self.geometry.global_batch,
            firsts={r: first_record(p, self.inputs.root) for r, p in files.items()},
            file_of=lambda r: self.inputs.rel(files[r]) if r in files
            else f"logs/attempt-{plan.attempt:03d}/rank-{r:03d}.jsonl",
            sink=self.sink if sink is None else sink)
        if mesh is not None and keep:
            self.meshes[plan.attempt] = mesh
            self.replay.tp_sizes[plan.attempt] = mesh.tp_size
        return mesh

    def _primary(self, attempt: int, rank: int) -> bool:
        """Whether a rank's records count samples and loss (tensor-parallel coordinate 0)."""
        mesh = self.meshes.get(attempt)
        return mesh is None or rank not in mesh.places or mesh.place(rank).primary

    def _take(self, plan: AttemptPlan, reader: RankLog | ScannedLog, batch: Batch) -> None:
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
                                seed=self.manifest.seed, audit=self.audit,
                                shard_rank=reader.shard_rank, shard_world=reader.shard_world,
                                mesh=reader.mesh_fields,
                                tp_peers=self.tp_peers if k in self.meshes else None)
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
        primary = self._primary(k, rank)
        if self.replay.wants(k):
            self.replay.take(attempt=k, rank=rank, steps=steps, loss=batch.loss,
                             local_batch=reader.local_batch or 0 if batch.fast
                             else batch.column("local_batch"),
                             first_line=batch.first_line, file=rel)
        if self.audit and ncommit:  # audit mode never takes the fast path
            self._audit(plan, rel, rank, batch, committed)
        if self.win_hash is not None and ncommit and primary:
            self._windows(plan, reader, batch, committed)
        if self.samples is not None and ncommit and (primary or not batch.fast):
            if batch.id_block is not None:
                self._count_block(batch, committed)
            elif batch.ids is not None:
                # A tensor-parallel peer's IDs are its shard's copy: checked, not counted.
                self._count_samples(plan, rel, rank, batch, committed, count=primary)

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

    def _windows(self, plan: AttemptPlan, reader: RankLog | ScannedLog, batch: Batch,
                 committed: npt.NDArray[np.bool_]) -> None:
        assert self.win_hash is not None and self.win_count is not None
        rows = np.flatnonzero(committed & (batch.steps < self.target))
        steps = batch.steps[rows]
        if batch.fast:
            # Proven equal to the expected shards, whose hashes the fast path compared.
            hashes = semantics.shard_hashes(self.geometry, self.manifest.seed, steps,
                                            reader.shard_rank, reader.shard_world)
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
            step=int(steps[i]), rank=rank, evidence={"previous": int(before[i])},
            expected=f"step {before[i] + 1}", actual=f"step {steps[i]}") for i in back))

    def _series(self, batch: Batch, committed: npt.NDArray[np.bool_], rank: int,
                stats: AttemptStats) -> None:
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
            # Proven equal to the expected shards of distinct steps: distinct, in range.
            self.samples.add_distinct(epoch, batch.id_block[rows[lo:hi]].ravel())

    def _count_samples(self, plan: AttemptPlan, rel: str, rank: int, batch: Batch,
                       committed: npt.NDArray[np.bool_], *, count: bool = True) -> None:
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
                    expected=f"IDs in [0, {d})", actual=format_ids(outside),
                    evidence={"outside": outside.tolist(), "dataset_size": d}))
            if not count:
                continue
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

    def close(self) -> None:
        """After the last attempt: judge the epochs still open (unless the logs became
        unreadable or nothing was committed)."""
        if self.aborted or not self.committed_records:
            return
        if self.meshes:
            self.tp_peers.judge(meshes=self.meshes, ledgers=self.ledgers, files=self.files,
                                sink=self.sink)
        if self.samples is not None:
            self._judge_epochs(self.samples.finish_all())
        if self.epoch_hashes is not None:
            self.epoch_hashes.judge(dataset_size=self.geometry.dataset_size,
                                    steps_per_epoch=self.geometry.steps_per_epoch,
                                    end=self.end, sink=self.sink)

    def mean_loss(self) -> npt.NDArray[np.float64] | None:
        if self.loss_sum is None or self.loss_n is None:
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.loss_n > 0, self.loss_sum / np.maximum(self.loss_n, 1), np.nan)
