"""The case studies of ``docs/case-studies.md``: the data loaders people resume with, run for real.

Every case is a script in ``docs/examples/`` started by ``ecrl launch`` (real torchrun, gloo, an
injected ``os._exit(137)``, relaunch, world-size changes) and judged by the real ``ecrl-verify``
command. The verdicts asserted here are the findings the page reports; the witnesses are checked
against the logs themselves, and the padding case against what ``DistributedSampler`` pads with.
Each run is made once per session and shared (``runs`` in ``conftest.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Run, RunCache
from sessionshare import locked

pytestmark = pytest.mark.torchrun

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
BLOCKING = ["--strategy", "blocking"]


def _launch(runs: RunCache, name: str, options: list[str], script: str,
            *script_args: str) -> Run:
    run = runs.get(name, [*BLOCKING, *options, "--", sys.executable, str(EXAMPLES / script),
                          *script_args], command="launch")
    assert run.returncode == 0, f"ecrl launch exited {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run


@dataclass(frozen=True)
class Verdict:
    """``ecrl-verify --format json`` of one run, as a user's CI would read it."""

    exit_code: int
    text: str
    run: dict[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.run["verdict"])

    def kinds(self) -> set[str]:
        return set(self.run["anomaly_counts"])

    def anomalies(self, kind: str) -> list[dict[str, Any]]:
        return [a for a in self.run["anomalies"] if a["kind"] == kind]


def verify(root: Path, *options: str) -> Verdict:
    def call(fmt: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format", fmt,
                               *options], capture_output=True, text=True, timeout=300)

    as_json, as_text = call("json"), call("text")
    assert as_json.returncode == as_text.returncode, (as_json.stderr, as_text.stderr)
    (run,) = json.loads(as_json.stdout)["runs"]
    return Verdict(exit_code=as_json.returncode, text=as_text.stdout, run=run)


def world_sizes(verdict: Verdict, planned: int) -> list[int]:
    """The world sizes of the lineage's first ``planned`` attempts. A later attempt can only be
    a relaunch at the schedule's last size (a rank that died at exit after the final step, say):
    the supervisor doing its job, not part of the finding."""
    sizes = [a["world_size"] for a in verdict.run["lineage"]]
    assert set(sizes[planned:]) <= set(sizes[planned - 1:planned])
    return sizes[:planned]


def record(root: Path, file: str, line: int) -> dict[str, Any]:
    """The step record a witness points at (``file`` relative to the run, 1-based ``line``)."""
    lines = (root / file).read_text().splitlines()
    return dict(json.loads(lines[line - 1]))


def committed_ids(root: Path, verdict: Verdict, epoch: int, steps_per_epoch: int) -> list[int]:
    """Every sample ID the committed lineage consumed in ``epoch`` (by global step)."""
    lo, hi = epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch
    out: list[int] = []
    for attempt in verdict.run["lineage"]:
        if attempt["committed"] is None:
            continue
        first, last = attempt["committed"]
        for rank_file in (root / "logs" / f"attempt-{attempt['attempt']:03d}").glob(
                "rank-*.jsonl"):
            for line in rank_file.read_text().splitlines():
                rec = json.loads(line)
                step = rec["global_step"]
                if lo <= step < hi and first <= step <= last:
                    out.extend(rec["sample_ids"])
    return out


# --- the runs ---


@pytest.fixture(scope="module")
def padding(runs: RunCache) -> Run:
    # One failure, resumed exactly: the padding alone makes the duplicates.
    return _launch(runs, "case-padding", ["--nproc", "2", "--ckpt-every", "5", "--fail-at", "6"],
                   "case_padding.py")


@pytest.fixture(scope="module")
def restart_epoch(runs: RunCache) -> Run:
    return _launch(runs, "case-restart-epoch",
                   ["--nproc", "2", "--ckpt-every", "3", "--fail-at", "7"],
                   "case_restart_epoch.py")


@pytest.fixture(scope="module")
def skip_batches(runs: RunCache) -> Run:
    return _launch(runs, "case-skip-batches",
                   ["--world-sizes", "2,1", "--ckpt-every", "4", "--fail-at", "13"],
                   "case_skip_batches.py")


@pytest.fixture(scope="module")
def stateful_mid(runs: RunCache) -> Run:
    pytest.importorskip("torchdata.stateful_dataloader")
    return _launch(runs, "case-stateful-mid", ["--nproc", "2", "--ckpt-every", "3",
                                               "--fail-at", "7"], "case_stateful_dataloader.py")


@pytest.fixture(scope="module")
def stateful_end(runs: RunCache) -> Run:
    pytest.importorskip("torchdata.stateful_dataloader")
    return _launch(runs, "case-stateful-end", ["--nproc", "2", "--ckpt-every", "5",
                                               "--fail-at", "9"], "case_stateful_dataloader.py")


@pytest.fixture(scope="module")
def stateful_end_fixed(runs: RunCache) -> Run:
    pytest.importorskip("torchdata.stateful_dataloader")
    return _launch(runs, "case-stateful-end-fixed", ["--nproc", "2", "--ckpt-every", "5",
                                                     "--fail-at", "9"],
                   "case_stateful_dataloader.py", "--resume-into", "checkpoint")


@pytest.fixture(scope="module")
def mds_shards(runs: RunCache) -> Path:
    """The case's data set as MDS shards, written by Streaming's own ``MDSWriter``."""
    pytest.importorskip("streaming", reason="Mosaic Streaming is not installed: python -m pip "
                        "install --no-deps -r tests/integration/requirements-streaming.txt")
    root = runs.root / "mds"
    with locked(runs.root / "mds.lock"):
        if not (root / "index.json").exists():
            subprocess.run([sys.executable, str(EXAMPLES / "case_streaming.py"),
                            "--write-shards", str(root)], check=True, timeout=300)
    return root


@pytest.fixture(scope="module")
def streaming_resized(runs: RunCache, mds_shards: Path) -> Run:
    return _launch(runs, "case-streaming-2to1", ["--world-sizes", "2,1", "--ckpt-every", "2",
                                                 "--fail-at", "6"],
                   "case_streaming.py", "--data", str(mds_shards))


@pytest.fixture(scope="module")
def streaming_same_size(runs: RunCache, mds_shards: Path) -> Run:
    return _launch(runs, "case-streaming-2to2", ["--world-sizes", "2", "--ckpt-every", "2",
                                                 "--fail-at", "6"],
                   "case_streaming.py", "--data", str(mds_shards))


@pytest.fixture(scope="module")
def ecrl_sampler(runs: RunCache) -> Run:
    return _launch(runs, "case-ecrl-sampler", ["--world-sizes", "2,1,2", "--ckpt-every", "2",
                                               "--fail-at", "4,9"], "case_ecrl_sampler.py")


# --- the broken patterns: FAIL, the right kind, a witness found in the logs ---


def _assert_duplicate_witnessed(root: Path, verdict: Verdict) -> dict[str, Any]:
    (first, *_) = verdict.anomalies("duplicate_sample")
    (sample,) = first["sample_ids"]
    here = record(root, first["file"], first["line"])
    (other,) = first["related"]
    there = record(root, other["file"], other["line"])
    assert sample in here["sample_ids"] and sample in there["sample_ids"]
    assert (here["global_step"], here["rank"]) == (first["step"], first["rank"])
    assert (there["global_step"], there["rank"]) == (other["step"], other["rank"])
    assert here["global_step"] // 5 == there["global_step"] // 5 == first["epoch"]
    return first


def test_padded_distributed_sampler_fails_with_the_padding_as_duplicates(padding: Run) -> None:
    from torch.utils.data import DistributedSampler

    verdict = verify(padding.root)
    assert (verdict.verdict, verdict.exit_code) == ("FAIL", 1)
    assert verdict.kinds() == {"duplicate_sample"}
    _assert_duplicate_witnessed(padding.root, verdict)
    # What torch pads with: the epoch's order is extended by its own first indices.
    for epoch in (0, 1):
        orders: list[int] = []
        for rank in (0, 1):
            sampler: DistributedSampler[int] = DistributedSampler(
                list(range(39)), num_replicas=2, rank=rank, shuffle=True, seed=0,  # type: ignore[arg-type]
                drop_last=False)
            sampler.set_epoch(epoch)
            orders.extend(sampler)
        padded = sorted(i for i in set(orders) if orders.count(i) > 1)
        found = sorted({a["sample_ids"][0] for a in verdict.anomalies("duplicate_sample")
                        if a["epoch"] == epoch})
        assert found == padded == sorted(
            i for i in set(committed_ids(padding.root, verdict, epoch, 5))
            if committed_ids(padding.root, verdict, epoch, 5).count(i) > 1)


def test_restart_epoch_loop_fails_with_duplicates(restart_epoch: Run) -> None:
    verdict = verify(restart_epoch.root)
    assert verdict.verdict == "FAIL"
    assert "duplicate_sample" in verdict.kinds()
    first = _assert_duplicate_witnessed(restart_epoch.root, verdict)
    # The first duplicate: the resumed attempt's first step repeats the epoch's first batch.
    assert first["attempt"] == 1 and first["step"] == 6
    assert first["related"][0]["attempt"] == 0 and first["related"][0]["step"] == 5
    # The loop's own cursor restarted at 0 where the step count says 1.
    (cursor, *_) = verdict.anomalies("wrong_cursor")
    assert (cursor["attempt"], cursor["step"]) == (1, 6)
    assert record(restart_epoch.root, cursor["file"], cursor["line"])["cursor_step"] == 0


def test_skipping_consumed_over_world_size_after_2_to_1_loses_samples(skip_batches: Run) -> None:
    verdict = verify(skip_batches.root)
    assert verdict.verdict == "FAIL"
    assert "missing_sample" in verdict.kinds()
    missing = verdict.anomalies("missing_sample")
    epoch = missing[0]["epoch"]
    assert epoch == 1
    consumed = set(committed_ids(skip_batches.root, verdict, epoch, 10))
    lost = {a["sample_ids"][0] for a in missing if a["epoch"] == epoch}
    assert lost and not lost & consumed
    # The resumed rank skipped 4 of its batches where 2 steps had been taken: its first record
    # is the loop's cursor 4 at step 12.
    (cursor, *_) = verdict.anomalies("wrong_cursor")
    rec = record(skip_batches.root, cursor["file"], cursor["line"])
    assert (rec["attempt"], rec["world_size"], rec["global_step"], rec["cursor_step"]) == (
        1, 1, 12, 4)


# --- the libraries' own resume: what the verifier finds ---


def test_stateful_dataloader_mid_epoch_resume_passes_the_audit(stateful_mid: Run) -> None:
    verdict = verify(stateful_mid.root)
    assert verdict.verdict == "PASS", verdict.text
    assert verdict.run["windows_checked"] is False
    assert verdict.run["checked"]["epochs"] == 3
    assert verdict.run["replay"]["compared"] >= 1  # steps 6 and 7 were run twice, same loss
    assert "windows not checked" in verdict.text


def test_stateful_dataloader_resumed_after_an_epochs_last_step_skips_an_epoch(
        stateful_end: Run, stateful_mid: Run) -> None:
    verdict = verify(stateful_end.root)
    assert verdict.verdict == "FAIL"
    assert verdict.kinds() == {"wrong_cursor"}
    (first, *_) = verdict.anomalies("wrong_cursor")
    rec = record(stateful_end.root, first["file"], first["line"])
    # Step 10 opens epoch 2, but the restored loader's first pass yielded nothing: the loop is
    # already in its epoch 3.
    assert (rec["attempt"], rec["global_step"], rec["epoch"], rec["cursor_step"]) == (1, 10, 3, 0)
    # Same seed, another failure: the two runs part at step 10.
    compared = verify(stateful_end.root, "--same-order", str(stateful_mid.root))
    (order, *_) = compared.anomalies("order_mismatch")
    assert order["step"] == compared.run["same_order"]["first_difference"] == 10


def test_stateful_dataloader_resumed_into_the_checkpoints_epoch_is_exact(
        stateful_end_fixed: Run, stateful_mid: Run) -> None:
    verdict = verify(stateful_end_fixed.root, "--same-order", str(stateful_mid.root))
    assert verdict.verdict == "PASS", verdict.text
    assert verdict.run["windows_checked"] is False
    same = verdict.run["same_order"]
    assert (same["steps_compared"], same["first_difference"]) == (15, None)
    # The kill came after the epoch's last step: the resumed attempt starts a new epoch.
    first = verdict.run["lineage"][1]["first_step"]
    assert first == 10


def test_streaming_resumed_2_to_1_keeps_exactly_once_and_its_order(
        streaming_resized: Run, streaming_same_size: Run) -> None:
    verdict = verify(streaming_resized.root)
    assert verdict.verdict == "PASS", verdict.text
    assert verdict.run["windows_checked"] is False
    assert world_sizes(verdict, 2) == [2, 1]
    assert verdict.run["checked"]["epochs"] == 2
    assert verdict.run["replay"]["compared"] >= 1  # step 6 ran at world size 2, then at 1
    # Elastic determinism: the same global window at every step as the run that stayed at 2.
    compared = verify(streaming_resized.root, "--same-order", str(streaming_same_size.root))
    assert compared.verdict == "PASS", compared.text
    same = compared.run["same_order"]
    assert (same["steps_compared"], same["by_ids"], same["first_difference"]) == (10, True, None)


# --- ECRL's sampler: PASS with windows checked ---


def test_ecrl_sampler_passes_with_windows_checked_at_2_1_2(ecrl_sampler: Run) -> None:
    verdict = verify(ecrl_sampler.root)
    assert verdict.verdict == "PASS", verdict.text
    assert verdict.run["windows_checked"] is True
    assert world_sizes(verdict, 3) == [2, 1, 2]
    assert verdict.run["checked"]["shards"] == verdict.run["checked"]["committed_records"] > 0
    assert "windows not checked" not in verdict.text


@pytest.mark.parametrize("case", ["padding", "restart_epoch", "skip_batches", "stateful_mid",
                                  "stateful_end", "stateful_end_fixed", "streaming_resized"])
def test_an_external_sampler_is_never_claimed_window_checked(
        case: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(case)
    verdict = verify(run.root)
    assert verdict.run["windows_checked"] is False
    assert verdict.run["sampler"]["kind"] == "external"
    assert verdict.verdict in {"PASS", "FAIL"}


def test_drop_last_with_a_remainder_passes_after_the_one_argument_change(
        runs: RunCache, tmp_path: Path) -> None:
    """DistributedSampler(drop_last=True) and a loader's drop_last with D % B != 0 leave IDs out
    of every epoch (issue 25, item 6): declared with StepLog(epoch_coverage="drop_remainder"),
    an uninterrupted run PASSes; the same logs held to every ID fail with missing samples."""
    run = _launch(runs, "case-drop-last", ["--nproc", "2"], "case_restart_epoch.py",
                  "--dataset-size", "42", "--epoch-coverage", "drop_remainder")
    declared = verify(run.root)
    assert declared.verdict == "PASS", declared.text
    assert not declared.run["windows_checked"]
    undeclared = tmp_path / "undeclared"
    shutil.copytree(run.root, undeclared)
    manifest = json.loads((undeclared / "run.json").read_text())
    assert manifest["sampler"]["epoch_coverage"] == "drop_remainder"
    manifest["sampler"]["epoch_coverage"] = "all"
    (undeclared / "run.json").write_text(json.dumps(manifest))
    held = verify(undeclared)
    assert held.verdict == "FAIL" and held.kinds() == {"missing_sample"}, held.text
