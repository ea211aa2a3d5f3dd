"""State digests: each resume must load the checkpoint it names and restore every saved object
with the digest it was saved with (``restored.json`` against the checkpoint event)."""

from __future__ import annotations

import json
from pathlib import Path

from verifier_helpers import assert_verdict, make_run

from verifier import render_json, render_text, verify

STATE = dict(dataset_size=40, global_batch=4, target_steps=24, world_sizes=(2, 1, 2),
             fail_at=(7, 15), ckpt_every=3, chaos=5, seed=11, log_ids=False, digests=True)


def test_a_run_with_digests_passes_and_says_so(tmp_path: Path) -> None:
    result = verify(make_run(tmp_path / "run", **STATE).root)
    assert_verdict(result, "PASS")
    state = result.runs[0].state
    assert state is not None and state.resumes_checked == 2 and state.objects_compared == 10
    assert "proved: 2 resumes restored every saved object" in render_text(result)
    assert json.loads(render_json(result))["runs"][0]["state"]["resumes_checked"] == 2


def test_without_digests_nothing_is_claimed_and_the_pass_says_so(tmp_path: Path) -> None:
    """A resume from a checkpoint without digests (sharded, sharded-async and jit write none)
    is not attested, and the PASS text says which and why (issue 25, item 9)."""
    result = verify(make_run(tmp_path / "run", **dict(STATE, digests=False,
                                                      strategy="sharded")).root)
    assert_verdict(result, "PASS")
    state = result.runs[0].state
    assert state is not None and state.resumes_checked == 0
    assert state.undigested == (1, 2) and state.undigested_strategies == ("sharded",)
    text = render_text(result)
    assert "restored every saved object" not in text
    assert "not attested: the state loaded by 2 resumes (attempt 1, 2), whose checkpoints " \
        "record no state digests (written by sharded): not compared" in text
    assert json.loads(render_json(result))["runs"][0]["state"]["undigested"] == [1, 2]
    with_digests = verify(make_run(tmp_path / "digests", **STATE).root)
    assert "not attested" not in render_text(with_digests)


def test_a_missing_restored_json_is_a_warning_not_a_proof(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **STATE).root
    (run / "logs" / "attempt-001" / "restored.json").unlink()
    result = verify(run)
    assert_verdict(result, "PASS")
    r = result.runs[0]
    assert r.state is not None and r.state.unattested == (1,) and r.state.resumes_checked == 1
    assert any(w.kind == "state" and "not attested" in w.message for w in r.warnings)


def test_a_malformed_restored_json_is_unknown(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **STATE).root
    (run / "logs" / "attempt-002" / "restored.json").write_text('{"schema_version": 1}')
    result = verify(run)
    assert result.verdict == "UNKNOWN"
    assert "restored.json" in result.runs[0].unknown[0]


def test_every_unrestored_object_is_named(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **STATE).root
    path = run / "logs" / "attempt-001" / "restored.json"
    data = json.loads(path.read_text())
    del data["digests"]["optimizer"], data["digests"]["rng"]
    data["digests"]["extra"] = "sha256:" + "1" * 64
    path.write_text(json.dumps(data))
    result = verify(run)
    assert_verdict(result, "FAIL", {"state_not_restored"}, exact=True)
    run_result = result.runs[0]
    assert run_result.anomaly_counts["state_not_restored"] == 2
    assert {a.evidence["object"] for a in run_result.anomalies} == {"optimizer", "rng"}
    assert all(a.related[0].file == "logs/attempt-000/checkpoint_rank0.jsonl"
               for a in run_result.anomalies)
    assert any(w.kind == "state" and "extra" in w.message for w in run_result.warnings)
