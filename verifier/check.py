"""Verify a run: :mod:`verifier.ingest` streams its logs once into facts, :mod:`verifier.judge`
settles every obligation from them; this module ties them together for one run or a folder of
runs (with ``--reference`` and ``--same-order``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ecrl.contract.runformat import find_runs, is_run_dir
from verifier._parallel import ScannedFile, ScanTask, Submit, process_pool, scan_file
from verifier.anomalies import Note
from verifier.errors import Unusable, VerifierError
from verifier.ingest import Ingest, Progress
from verifier.judge import Judge
from verifier.lineage import lineage_of
from verifier.replay import DEFAULT_TOLERANCE
from verifier.result import RunResult, VerifyResult
from verifier.sameorder import compare_order
from verifier.schema import read_inputs

__all__ = ["verify", "verify_run", "Progress"]


def _unknown(path: Path, reason: str) -> RunResult:
    # Nothing was read, so no window was checked (an unusable audit run said true).
    return RunResult(path=str(path), verdict="UNKNOWN", unknown=(reason,),
                     windows_checked=False)


def verify_run(path: str | Path, *, series: bool = False,
               reference_loss: npt.NDArray[np.float64] | None = None,
               progress: Progress | None = None, windows: bool = False,
               replay_tolerance: float = DEFAULT_TOLERANCE, jobs: int = 1,
               submit: Submit | None = None) -> RunResult:
    """Verify one run directory. Never raises for a bad run: problems become the verdict.

    ``windows``: keep each committed step's global window (count + hash) in ``series``, for
    ``--same-order``. ``replay_tolerance``: relative tolerance of replay consistency where
    bit-identical losses are not expected. ``jobs``: worker processes that scan the rank logs
    (1: all in this process); the result is the same for every number. ``submit``: where to
    scan the rank logs instead (:mod:`verifier._parallel`; ``jobs`` is then ignored)."""
    if submit is None and jobs > 1:
        with workers(jobs) as submit:
            return verify_run(path, series=series, reference_loss=reference_loss,
                              progress=progress, windows=windows,
                              replay_tolerance=replay_tolerance, submit=submit)
    root = Path(path)
    try:
        inputs = read_inputs(root)
    except Unusable as exc:
        return _unknown(root, str(exc))
    lineage = lineage_of(inputs)
    facts = Ingest(inputs, lineage, want_series=series or reference_loss is not None,
                   reference_loss=reference_loss, progress=progress, want_windows=windows,
                   replay_tolerance=replay_tolerance, submit=submit)
    facts.scan()
    return Judge(facts).finish()


def verify(path: str | Path, reference: str | Path | None = None, *, series: bool = False,
           progress: Progress | None = None, same_order: str | Path | None = None,
           replay_tolerance: float = DEFAULT_TOLERANCE, jobs: int = 1,
           submit: Submit | None = None) -> VerifyResult:
    """Verify the run directory ``path``, or every run directory below it.

    ``reference``: a run whose per-step losses the runs are compared with (loss divergence).
    ``same_order``: a run that should have consumed the same global window at every step (same
    seed, other world sizes or failures): compared step by step (:mod:`verifier.sameorder`).
    ``replay_tolerance``: see :mod:`verifier.replay`.
    ``series``: keep per-step losses and timelines for plots (``write_report`` needs them).
    ``jobs``: worker processes that scan the rank logs, ``submit``: another place to scan them
    (see :func:`verify_run`); neither changes the result.
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
    if jobs < 1:
        raise VerifierError(f"--jobs {jobs}: give at least 1 (the number of worker processes)")
    if submit is None and jobs > 1:
        with workers(jobs) as submit:
            return verify(path, reference, series=series, progress=progress,
                          same_order=same_order, replay_tolerance=replay_tolerance,
                          submit=submit)
    reference_loss = None
    notes: list[Note] = []
    if reference is not None:
        ref = Path(reference)
        if not ref.is_dir() or not is_run_dir(ref):
            raise VerifierError(f"--reference {ref}: not a run directory (it needs run.json "
                                "and logs/)")
        ref_result = verify_run(ref, series=True, submit=submit)
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
        other = verify_run(other_root, windows=True, replay_tolerance=replay_tolerance,
                           submit=submit)
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
                            replay_tolerance=replay_tolerance, submit=submit)
        if other is not None:
            result = compare_order(result, other)
        if notes:
            result = _with_notes(result, notes)
        results.append(result)
    return VerifyResult(path=str(root), runs=tuple(results))


@contextmanager
def workers(jobs: int) -> Iterator[Submit]:
    """A pool of ``jobs`` processes that scan rank logs, for the duration of a verification."""
    pool = process_pool(jobs)
    try:
        def submit(task: ScanTask) -> Future[ScannedFile]:
            return pool.submit(scan_file, task)

        yield submit
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _with_notes(result: RunResult, notes: list[Note]) -> RunResult:
    return replace(result, warnings=(*result.warnings, *notes))
