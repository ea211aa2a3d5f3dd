"""Reading a run directory's small files: manifest, supervisor state, checkpoint events, pointer.

The step logs, which can hold millions of records, are streamed by :mod:`verifier._scan`; this
module reads everything else up front and checks the preconditions a verdict rests on. A broken
precondition raises :class:`~verifier.errors.Unusable` (verdict UNKNOWN) with one line naming the
file, and where known the line, and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError, SemanticsError
from ecrl.contract.runformat import (
    EPOCH_COVERAGES,
    CheckpointEvent,
    JsonlReader,
    LatestPointer,
    RunManifest,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    check_entry,
    read_json_record,
)
from verifier.anomalies import Note
from verifier.attemptrecords import from_attempt_records
from verifier.errors import Unusable

__all__ = ["CheckpointRecord", "DeclaredGeometry", "RunInputs", "read_inputs", "torn_tail_ok",
           "EPOCH_COVERAGES"]



@dataclass(frozen=True, kw_only=True, slots=True)
class DeclaredGeometry(semantics.Geometry):
    """An external sampler's geometry: D and B as for ECRL, but S is the user's loop's steps
    per epoch as ``run.json`` declares it (padding or a dropped remainder make it differ from
    D // B; the audit then finds the duplicates or missing samples that follow)."""

    declared_steps: int

    @property
    def steps_per_epoch(self) -> int:
        return self.declared_steps


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointRecord:
    """A checkpoint event and where it was logged."""

    attempt: int
    line: int
    event: CheckpointEvent


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class RunInputs:
    """Everything but the step logs, validated."""

    root: Path
    paths: RunPaths
    manifest: RunManifest
    geometry: semantics.Geometry
    supervisor: SupervisorState
    checkpoints: Mapping[int, tuple[CheckpointRecord, ...]]
    """Attempt -> its checkpoint events, in log order."""
    latest: LatestPointer | None
    notes: tuple[Note, ...]
    audit: bool = False
    """An external sampler fed the run: audit it (no windows; docs/verifier.md)."""
    epoch_coverage: str = "all"
    """External sampler: ``all`` or ``drop_remainder`` (:data:`EPOCH_COVERAGES`)."""
    deterministic: bool = True
    """False when run.json declares nondeterministic kernels (``"deterministic": false``)."""

    def rel(self, path: Path) -> str:
        """``path`` relative to the run directory, as shown in anomalies."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


def torn_tail_ok(attempt: SupervisorAttempt) -> bool:
    """A torn last line is expected in the files of an attempt that did not complete."""
    return attempt.status != "completed"


def _unusable(error: Exception) -> Unusable:
    return Unusable(str(error))


def read_inputs(root: str | Path) -> RunInputs:
    """Read and check the manifest, supervisor state, checkpoint events and latest pointer."""
    paths = RunPaths.of(root)
    notes: list[Note] = []
    if not os.path.lexists(paths.manifest):  # a link or FIFO is refused by the reader
        raise Unusable(f"{paths.manifest}: file is missing; a run directory written by "
                       "`ecrl run` has one (is this the right directory?)")
    try:
        manifest = read_json_record(paths.manifest, RunManifest, root=paths.root)
    except RunFormatError as exc:
        raise _unusable(exc) from None
    audit = manifest.external_sampler
    coverage = "all"
    if audit:
        assert manifest.sampler is not None
        coverage = manifest.sampler.get("epoch_coverage", "all")
        if coverage not in EPOCH_COVERAGES:
            raise Unusable(f"{paths.manifest}: sampler.epoch_coverage is {coverage!r}; it must "
                           f"be one of {', '.join(map(repr, EPOCH_COVERAGES))} "
                           "(docs/run-format.md)")
    deterministic = manifest.extra.get("deterministic", True)
    if not isinstance(deterministic, bool):
        raise Unusable(f"{paths.manifest}: deterministic must be true or false, got "
                       f"{deterministic!r}")
    perm = (manifest.permutation.get("algorithm"), manifest.permutation.get("version"))
    # An external sampler's run carries ECRL's permutation field but was not fed by it.
    if not audit and perm != (semantics.PERMUTATION_ALGORITHM, semantics.PERMUTATION_VERSION):
        raise Unusable(
            f"{paths.manifest}: the run used permutation {perm[0]} v{perm[1]}, this verifier "
            f"implements {semantics.PERMUTATION_ALGORITHM} v{semantics.PERMUTATION_VERSION}; "
            "verify with the ECRL version that wrote the run")
    try:
        geometry: semantics.Geometry
        if audit:
            geometry = DeclaredGeometry(dataset_size=manifest.dataset_size,
                                        global_batch=manifest.global_batch,
                                        declared_steps=manifest.steps_per_epoch)
        else:
            geometry = semantics.Geometry(dataset_size=manifest.dataset_size,
                                          global_batch=manifest.global_batch)
    except SemanticsError as exc:
        raise Unusable(f"{paths.manifest}: {exc}") from None
    if not audit and manifest.steps_per_epoch != geometry.steps_per_epoch:
        raise Unusable(
            f"{paths.manifest}: steps_per_epoch is {manifest.steps_per_epoch} but dataset size "
            f"{geometry.dataset_size} // global batch {geometry.global_batch} is "
            f"{geometry.steps_per_epoch}; the manifest is inconsistent")
    if manifest.target_steps == 0:
        raise Unusable(f"{paths.manifest}: target_steps is 0, so there is nothing to verify")
    if manifest.seed > semantics.MAX_SEED:
        raise Unusable(f"{paths.manifest}: seed {manifest.seed} is above {semantics.MAX_SEED}")

    if os.path.lexists(paths.supervisor):
        try:
            supervisor = read_json_record(paths.supervisor, SupervisorState, root=paths.root)
        except RunFormatError as exc:
            raise _unusable(exc) from None
    else:  # launched without ecrl launch: the attempts' own records (verifier.attemptrecords)
        supervisor = from_attempt_records(paths)
        notes.append(Note(kind="self_recorded", file="supervisor.json",
                          message="absent (the run was not launched by ecrl launch): the "
                                  "lineage rests on each attempt's own logs/attempt-NNN/"
                                  "attempt.json; exit codes and how attempts ended are unknown"))
    attempts = supervisor.attempts
    if not attempts:
        raise Unusable(f"{paths.supervisor}: no attempts recorded, so nothing ran")
    strays = _check_attempts(paths, [a.attempt for a in attempts])
    notes.extend(Note(kind="stray_attempt", file=_rel(paths, paths.attempt_dir(n)),
                      message=f"a log folder of attempt {n}, which {paths.supervisor.name} does "
                              "not list: no attempt of this run wrote it; skipped, not read")
                 for n in strays)
    if supervisor.restarts != len(attempts) - 1:
        notes.append(Note(kind="supervisor", file="supervisor.json",
                          message=f"restarts is {supervisor.restarts} but "
                                  f"{len(attempts)} attempts are listed"))
    for a in attempts:
        planned = manifest.world_size_of(a.attempt)
        if planned != a.world_size:
            notes.append(Note(kind="world_size_plan", file="supervisor.json",
                              message=f"attempt {a.attempt} ran with world size {a.world_size}; "
                                      f"run.json planned {planned}"))

    checkpoints: dict[int, tuple[CheckpointRecord, ...]] = {}
    for a in attempts:
        log = paths.checkpoint_log(a.attempt)
        if not os.path.lexists(log):  # a link or FIFO is refused, not taken as absent
            checkpoints[a.attempt] = ()
            continue
        reader = JsonlReader(log, CheckpointEvent, torn_tail_ok=torn_tail_ok(a),
                             root=paths.root)
        try:
            events = tuple(CheckpointRecord(attempt=a.attempt, line=n, event=e)
                           for n, e in reader)
        except RunFormatError as exc:
            raise _unusable(exc) from None
        checkpoints[a.attempt] = events
        notes.extend(Note(kind="torn_line", file=_rel(paths, Path(t.path)), line=t.line,
                          message="torn last line ignored (crash while writing)")
                     for t in reader.warnings)

    latest: LatestPointer | None = None
    if os.path.lexists(paths.latest):
        try:
            latest = read_json_record(paths.latest, LatestPointer, root=paths.root)
        except RunFormatError as exc:
            notes.append(Note(kind="latest", file="checkpoints/latest.json",
                              message=f"unreadable, ignored: {exc.message}"))
    recorded = {r.event.global_step for events in checkpoints.values() for r in events}
    if latest is not None and latest.global_step not in recorded:
        notes.append(Note(kind="latest", file="checkpoints/latest.json",
                          message=f"points at step {latest.global_step}, which no checkpoint "
                                  "event records"))
    return RunInputs(root=paths.root, paths=paths, manifest=manifest, geometry=geometry,
                     supervisor=supervisor, checkpoints=checkpoints, latest=latest,
                     notes=tuple(notes), audit=audit, epoch_coverage=str(coverage),
                     deterministic=deterministic)


def _check_attempts(paths: RunPaths, numbers: list[int]) -> list[int]:
    """Check that the attempts ``supervisor.json`` lists are the run's own and that their log
    folders are real folders inside the run; return the stray log folders (those it does not
    list), which are reported and skipped.

    Attempts are numbered 0, 1, … in order. One gap is explained: a supervisor before issue 24
    numbered its next attempt after every ``logs/attempt-NNN`` folder, listed or not, so a folder
    planted (or left) at ``attempt-N`` made it skip to ``N + 1``. A gap is accepted only when that
    folder, unlisted, is there; any other gap means an attempt is missing from the record, and
    no verdict can rest on it.
    """
    for path in (paths.logs, *(paths.attempt_dir(n) for n in numbers)):
        why = check_entry(path, directory=True)
        if why is not None:
            raise Unusable(f"{path}: {why}, not a directory; the verifier never follows a link "
                           "out of the run directory (replace it with the run's own folder)")
    listed = set(numbers)
    try:
        logged = paths.attempts() if check_entry(paths.logs, directory=True) is None else []
    except OSError as exc:
        raise Unusable(f"{paths.logs}: cannot list: {exc.strerror}") from None
    strays = [n for n in logged if n not in listed]
    expected = 0
    for n in numbers:
        if n != expected and not (n > expected and n - 1 in strays):
            raise Unusable(f"{paths.supervisor}: attempts must be numbered 0, 1, … in order, "
                           f"got {numbers}: attempt {expected} is missing from the record")
        expected = n + 1
    return strays


def _rel(paths: RunPaths, path: Path) -> str:
    try:
        return path.relative_to(paths.root).as_posix()
    except ValueError:
        return str(path)
