"""Helpers for verifier tests, including end-to-end tests on real ``ecrl run`` output.

>>> result = verify_dir(run_dir)                      # doctest: +SKIP
>>> assert_verdict(result, "PASS")                    # doctest: +SKIP
>>> assert_verdict(result, "FAIL", {"missing_step"})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from verifier import VerifyResult, render_text, verify
from verifier._testing.generate import GeneratedRun, RunSpec, generate_run


def verify_dir(path: str | Path, **kwargs: Any) -> VerifyResult:
    """Run the verifier on a run directory (or a folder of runs) and return the result."""
    return verify(path, **kwargs)


def assert_verdict(result: VerifyResult, verdict: str, kinds: Iterable[str] | None = None,
                   *, exact: bool = False) -> None:
    """The verdict, and for FAIL the anomaly kinds (all present; ``exact``: nothing else)."""
    found = {k for run in result.runs for k in run.anomaly_counts}
    text = render_text(result)
    assert result.verdict == verdict, f"expected {verdict}, got:\n{text}"
    if kinds is not None:
        wanted = set(kinds)
        assert wanted <= found, f"expected kinds {sorted(wanted)}, got:\n{text}"
        if exact:
            assert found == wanted, f"expected exactly {sorted(wanted)}, got:\n{text}"


def make_run(root: Path, **spec: Any) -> GeneratedRun:
    return generate_run(RunSpec(**spec), root)


@st.composite
def run_specs(draw: st.DrawFn, *, log_ids: bool | None = None, max_steps: int = 40,
              unfinished: bool | None = None) -> RunSpec:
    """Whole runs from drawn parameters: geometry, world sizes (divisors of B), failures,
    checkpoint interval, strategy, ID or hash logging, and (``unfinished``; None: drawn, about
    one run in three) a final attempt that stopped, is still running or gave up."""
    batch = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
    size = draw(st.integers(batch, 12 * batch + 7))
    steps = draw(st.integers(2, max_steps))
    divisors = [w for w in range(1, batch + 1) if batch % w == 0]
    worlds = tuple(draw(st.lists(st.sampled_from(divisors), min_size=1, max_size=4)))
    fails = sorted(draw(st.sets(st.integers(0, steps - 2), max_size=3)))
    if unfinished is None:
        unfinished = draw(st.integers(0, 2)) == 0
    stop = draw(st.integers(max(fails, default=-1) + 1, steps - 1)) if unfinished else None
    return RunSpec(
        dataset_size=size, global_batch=batch, target_steps=steps,
        seed=draw(st.integers(0, 2**63 - 1)), world_sizes=worlds, fail_at=tuple(fails),
        ckpt_every=draw(st.sampled_from([0, 1, 2, 3, 5, 7])),
        strategy=draw(st.sampled_from(["none", "blocking", "overlapped", "sharded", "jit"])),
        log_ids=draw(st.booleans()) if log_ids is None else log_ids,
        chaos=draw(st.integers(0, 2**32)), lag=draw(st.booleans()), torn=draw(st.booleans()),
        stop_at=stop, end=draw(st.sampled_from(["stopped", "running", "failed"])))


# Runs on which every mutation of the catalogue applies, so each is exercised in every test run.
RICH = [
    RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 1, 4),
            fail_at=(12, 27), ckpt_every=5, strategy="overlapped", log_ids=True, chaos=3),
    RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 4, 1),
            fail_at=(13, 26), ckpt_every=4, strategy="blocking", log_ids=False, chaos=5,
            digests=True),
    # Stopped mid-step after step 33 (the last durable checkpoint is step 29): tentative records.
    RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 4), fail_at=(12,),
            ckpt_every=5, strategy="blocking", log_ids=True, chaos=1, stop_at=33),
    # A mesh run: DP 2 x TP 2, then DP 1 x TP 2, then DP 4 x TP 1 (the mesh kinds apply).
    RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(4, 2, 4),
            tp_sizes=(2, 2, 1), fail_at=(12, 27), ckpt_every=5, strategy="blocking",
            log_ids=True, chaos=7),
]
