"""Anomalies are data; their messages are written from that data by the explainers."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier import KINDS, Anomaly, render_text, verify
from verifier.explain import EXPLAINERS, explain

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"


def test_every_kind_has_an_explainer() -> None:
    assert set(EXPLAINERS) == set(KINDS)


def test_an_anomaly_is_data_without_text() -> None:
    a = Anomaly(kind="extra_step", step=3)  # building one never writes prose
    assert not hasattr(a, "message") and "message" not in a.as_dict()
    with pytest.raises(KeyError):
        explain(a)  # no evidence to write the message from
    with pytest.raises(ValueError, match="unknown anomaly kind"):
        Anomaly(kind="no_such_kind")


def test_the_message_is_written_from_the_evidence() -> None:
    a = Anomaly(kind="extra_step", attempt=2, step=24, count=2, evidence={"target": 24})
    assert explain(a) == ("attempt 2 committed step 24, but the run's target is 24 steps "
                          "(0..23); 2 steps beyond it")
    b = Anomaly(kind="extra_step", attempt=2, step=24, evidence={"target": 30})
    assert explain(b) != explain(a) and "target is 30 steps (0..29)" in explain(b)


@pytest.mark.parametrize(("case", "kind", "keys"), [
    ("resume-skipped-step", "resume_mismatch", {"resumed_from", "expected_step"}),
    ("missing-record", "missing_record", {"exists", "span", "before", "after"}),
    ("missing-step", "missing_step", {"owner", "owner_lo", "owner_hi"}),
    ("extra-step", "extra_step", {"target"}),
    ("replay-divergence", "replay_divergence", {"failed_loss", "loss", "exact"}),
    ("external-global-batch", "global_batch_mismatch", {"counts", "global_batch"}),
    ("external-rank-overlap", "rank_overlap", {"ranks", "shared"}),
    ("external-epoch-hash", "epoch_hash_mismatch", {"count", "hash", "expected_hash"}),
    ("shard-mismatch-ids", "shard_mismatch", {"ids", "shard", "unexpected", "absent"}),
    ("unfinished-tentative-shard", "shard_mismatch", {"hash", "expected_hash", "tentative"}),
    ("wrong-cursor", "wrong_cursor", {"steps_per_epoch", "says"}),
    ("hash-mismatch", "hash_mismatch", {"hash", "ids_hash"}),
    ("unknown-checkpoint", "unknown_checkpoint", {"recorded"}),
    ("duplicate-sample", "duplicate_sample", {"sample", "scope"}),
    ("extra-sample", "extra_sample", {"outside", "dataset_size"}),
    ("missing-sample", "missing_sample", {"sample", "scope"}),
    ("state-digest-mismatch", "state_digest_mismatch", {"object", "saved", "restored"}),
    ("state-previous-checkpoint", "state_digest_mismatch", {"loaded_step"}),
    ("state-not-restored", "state_not_restored", {"object", "restored_objects"}),
    ("tp-peer-mismatch", "tp_peer_mismatch", {"dp_rank", "peer", "says", "peer_says"}),
    ("mesh-mismatch", "mesh_mismatch", {"reason", "says", "mesh"}),
])
def test_checkers_record_evidence_and_the_explainer_writes_the_message(
        case: str, kind: str, keys: set[str]) -> None:
    run = verify(FIXTURES / case).runs[0]
    witness = next(a for a in run.anomalies if a.kind == kind)
    assert keys <= set(witness.evidence)
    assert explain(witness) in render_text(verify(FIXTURES / case))
