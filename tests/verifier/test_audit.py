"""Audit mode (an external sampler's run) and ``--same-order``: beyond the fixtures, what the
verdicts say and that an unprovable order never passes with windows checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from verifier_helpers import assert_verdict, make_run

from verifier import render_json, render_text, verify

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
EXT = dict(dataset_size=40, global_batch=4, target_steps=24, world_sizes=(2, 1, 2),
           fail_at=(7, 15), ckpt_every=3, chaos=5, seed=11, sampler="external")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verifier.cli", *args], capture_output=True,
                          text=True)


def test_an_external_pass_says_windows_were_not_checked() -> None:
    result = verify(FIXTURES / "pass-external-elastic")
    assert_verdict(result, "PASS")
    text = render_text(result)
    assert "windows not checked: the order came from tests.ShuffledSampler" in text
    assert "shards equal their windows" not in text
    run = json.loads(render_json(result))["runs"][0]
    assert run["windows_checked"] is False and run["sampler"]["kind"] == "external"
    assert run["checked"]["steps_audited"] == 24 and run["checked"]["epochs"] == 3


def test_no_external_run_is_ever_pass_with_windows_checked() -> None:
    for case in sorted(FIXTURES.iterdir()):
        manifest = case / "run.json"
        if not manifest.is_file() or "external" not in manifest.read_text():
            continue
        for run in verify(case).runs:
            assert run.windows_checked is False, case.name


def test_an_ecrl_run_still_checks_windows() -> None:
    run = verify(FIXTURES / "pass-elastic-2-to-1").runs[0]
    assert run.verdict == "PASS" and run.windows_checked and run.sampler is None


def test_ecrl_order_claimed_for_an_external_order_fails(tmp_path: Path) -> None:
    # The same logs with the sampler field removed claim ECRL's order: every shard is wrong.
    run = make_run(tmp_path / "run", **EXT).root
    manifest = json.loads((run / "run.json").read_text())
    del manifest["sampler"]
    (run / "run.json").write_text(json.dumps(manifest))
    assert_verdict(verify(run), "FAIL", {"shard_mismatch"})


def test_uneven_local_batches_are_fine_when_they_sum_to_b(tmp_path: Path) -> None:
    # Rank 0 takes three samples of step 4's window and rank 1 one: B = 4 in all, disjoint.
    run = make_run(tmp_path / "run", **dict(EXT, world_sizes=(2,), fail_at=())).root
    logs = [run / "logs" / "attempt-000" / f"rank-00{r}.jsonl" for r in (0, 1)]
    records = [[json.loads(x) for x in p.read_text().splitlines()] for p in logs]
    a, b = records[0][4], records[1][4]
    moved = b["sample_ids"][0]
    a["sample_ids"].append(moved)
    b["sample_ids"] = b["sample_ids"][1:]
    from ecrl.contract import semantics
    for r in (a, b):
        r["sample_ids_count"] = r["local_batch"] = len(r["sample_ids"])
        r["sample_ids_hash"] = semantics.format_hash(semantics.ids_hash(r["sample_ids"]))
    for path, recs in zip(logs, records, strict=True):
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    assert_verdict(verify(run), "PASS")


def test_same_order_from_the_command_line(tmp_path: Path) -> None:
    good = FIXTURES / "pass-external-same-order"
    out = cli(str(good), "--same-order", str(FIXTURES / "pass-external-elastic"),
              "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    same = json.loads(out.stdout)["runs"][0]["same_order"]
    assert same["first_difference"] is None and same["steps_compared"] == 24
    assert same["by_ids"] is True
    out = cli(str(FIXTURES / "external-order-mismatch"), "--same-order",
              str(FIXTURES / "pass-external-elastic"))
    assert out.returncode == 1 and "✗ order_mismatch" in out.stdout
    assert "step 0 is the first step whose global window differs" in out.stdout
    out = cli(str(good), "--same-order", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "--same-order" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_same_order_finds_the_first_differing_step_across_world_sizes(tmp_path: Path) -> None:
    # Hash-only at world sizes 4, 2, 4 against IDs at 2, 1, 2: the same windows; then one
    # sample of step 13 replaced in the second run: step 13 is the witness.
    a = make_run(tmp_path / "a", **dict(EXT, world_sizes=(4, 2, 4), log_ids=False)).root
    b = make_run(tmp_path / "b", **dict(EXT, torn=False)).root
    assert verify(a, same_order=b).runs[0].same_order.first_difference is None  # type: ignore
    from ecrl.contract import semantics
    for path in sorted(b.glob("logs/attempt-*/rank-000.jsonl")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            r = json.loads(line)
            if r["global_step"] == 13:
                r["sample_ids"][0] = 39 - r["sample_ids"][0]
                r["sample_ids_hash"] = semantics.format_hash(semantics.ids_hash(r["sample_ids"]))
                lines[i] = json.dumps(r, separators=(",", ":"))
        path.write_text("\n".join(lines) + "\n")
    result = verify(a, same_order=b)
    assert_verdict(result, "FAIL", {"order_mismatch"}, exact=True)
    witness = result.runs[0].anomalies[-1]
    assert witness.step == 13 and result.runs[0].same_order.first_difference == 13  # type: ignore
    assert witness.related and witness.related[0].file is not None

    # Given relative to the working directory, the other run's file is shown where it is, not
    # under the first run's path (issue 25, item 8).
    import os

    from verifier import render_text
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        text = render_text(verify("a", same_order="b"))
    finally:
        os.chdir(here)
    shown = [line.strip()[4:].rsplit(":", 1)[0] for line in text.splitlines()
             if line.strip().startswith("and ")]
    # shown relative to the working directory the command ran in
    assert shown and all((tmp_path / f).resolve().is_relative_to(b.resolve())
                         and (tmp_path / f).is_file() for f in shown), shown


@pytest.mark.parametrize("coverage", ["most", 3])
def test_an_unknown_epoch_coverage_is_unknown(tmp_path: Path, coverage: object) -> None:
    run = make_run(tmp_path / "run", **EXT).root
    manifest = json.loads((run / "run.json").read_text())
    manifest["sampler"]["epoch_coverage"] = coverage
    (run / "run.json").write_text(json.dumps(manifest))
    result = verify(run)
    assert result.verdict == "UNKNOWN" and "epoch_coverage" in result.runs[0].unknown[0]
