"""Rendering: the JSON schema (pinned), JUnit XML, text (witness first, capped), the markdown
report with its plots and the mutation catalogue's kill rate."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from verifier_helpers import make_run

from verifier import (
    KINDS,
    OBLIGATIONS,
    render_json,
    render_junit,
    render_text,
    verify,
    write_report,
)
from verifier._mutations import apply
from verifier.selftest import self_test_runs

TOP_KEYS = {"verdict", "path", "unknown", "runs"}
RUN_KEYS = {"path", "verdict", "anomalies", "anomaly_counts", "warnings", "unknown", "checked",
            "metrics", "lineage", "log_ids", "unfinished", "windows_checked", "sampler",
            "replay", "same_order", "state"}
REPLAY_KEYS = {"replayed_steps", "compared", "exact", "tolerant", "tolerance", "max_rel_diff"}
ANOMALY_KEYS = {"kind", "obligation", "message", "file", "line", "attempt", "step", "rank",
                "epoch", "sample_ids", "expected", "actual", "related", "count"}
METRIC_KEYS = {"committed_steps", "restarts", "replayed_steps", "tentative_steps", "wall_s",
               "goodput", "stall_s", "write_s", "snapshot_s", "enqueue_s", "backpressure_s",
               "checkpoints", "records", "restart_s", "lost_s", "loss_max_abs_diff",
               "loss_mean_abs_diff", "loss_steps_compared", "replayed_per_failure", "endings"}
ATTEMPT_KEYS = {"attempt", "world_size", "resumed_from_step", "status", "exit_code",
                "first_step", "last_step", "committed", "records", "replayed_steps",
                "tentative_steps",
                "start_time", "end_time"}
WARNING_KEYS = {"kind", "message", "file", "line"}
UNFINISHED_KEYS = {"status", "attempt", "last_step", "durable_step", "committed_steps",
                   "target_steps", "message", "command"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("report")
    good = make_run(base / "good", world_sizes=(2, 1), fail_at=(9,), ckpt_every=4, chaos=2,
                    torn=True).root
    apply("duplicate_id", good, base / "bad", random.Random(1))
    # Apart: the test of a folder of runs expects the two above.
    stopped = make_run(tmp_path_factory.mktemp("report-unfinished") / "stopped",
                       world_sizes=(2, 1), fail_at=(9,), ckpt_every=4, chaos=2, stop_at=25).root
    return {"good": good, "bad": base / "bad", "stopped": stopped}


def test_json_schema_is_pinned(runs: dict[str, Path]) -> None:
    data = json.loads(render_json(verify(runs["bad"])))
    assert set(data) == TOP_KEYS and data["verdict"] == "FAIL"
    run = data["runs"][0]
    assert set(run) == RUN_KEYS
    assert set(run["metrics"]) == METRIC_KEYS
    assert {k for a in run["anomalies"] for k in a} == ANOMALY_KEYS
    assert all(set(a) == ANOMALY_KEYS for a in run["anomalies"])
    assert all(set(a) == ATTEMPT_KEYS for a in run["lineage"])
    assert all(set(w) == WARNING_KEYS for w in run["warnings"])
    assert {a["kind"] for a in run["anomalies"]} == set(run["anomaly_counts"])
    assert "duplicate_sample" in run["anomaly_counts"]
    assert run["unfinished"] is None
    assert run["windows_checked"] is True and run["sampler"] is None
    assert set(run["replay"]) == REPLAY_KEYS and run["same_order"] is None
    stopped = json.loads(render_json(verify(runs["stopped"])))["runs"][0]
    assert set(stopped) == RUN_KEYS and stopped["verdict"] == "UNKNOWN"
    assert set(stopped["unfinished"]) == UNFINISHED_KEYS
    assert stopped["unknown"] == [stopped["unfinished"]["message"]]
    assert stopped["metrics"]["tentative_steps"] == stopped["lineage"][-1]["tentative_steps"]


def test_duplicate_witness_names_both_records(runs: dict[str, Path]) -> None:
    run = verify(runs["bad"]).runs[0]
    dup = next(a for a in run.anomalies if a.kind == "duplicate_sample")
    assert dup.file and dup.line and dup.step is not None and dup.rank is not None
    assert len(dup.sample_ids) == 1 and len(dup.related) == 1
    first = dup.related[0]
    assert (first.file, first.line) != (dup.file, dup.line)
    text = render_text(verify(runs["bad"]))
    lines = text.splitlines()
    assert lines[0].startswith("FAIL  ")
    at = next(i for i, line in enumerate(lines) if "duplicate_sample" in line)
    assert f"sample {dup.sample_ids[0]} was consumed twice" in lines[at + 1]
    assert f"{dup.file}:{dup.line}" in lines[at + 2]


def test_text_caps_long_lists(runs: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "many"
    import shutil

    shutil.copytree(runs["good"], target)
    for path in target.glob("logs/*/rank-*.jsonl"):
        path.write_bytes(path.read_bytes().replace(b'"epoch":', b'"epoch":1'))
    result = verify(target)
    run = result.runs[0]
    assert run.anomaly_counts["wrong_cursor"] > 20
    assert len([a for a in run.anomalies if a.kind == "wrong_cursor"]) == 20
    text = render_text(result)
    assert text.count("at ") >= 3 and "more witnesses" in text
    assert f"({run.anomaly_counts['wrong_cursor']:,} items)" in text


def test_pass_text_states_what_was_proved(runs: dict[str, Path]) -> None:
    text = render_text(verify(runs["good"]))
    assert text.startswith("PASS  ")
    assert "committed exactly once across 2 attempts (1 restart, world size 2→1)" in text
    assert "epochs without duplicate, missing or extra samples" in text
    assert "goodput" in text and "torn last line ignored" in text


def test_junit_has_a_case_per_obligation(runs: dict[str, Path]) -> None:
    root = ET.fromstring(render_junit(verify(runs["bad"].parent)))
    suites = root.findall("testsuite")
    assert len(suites) == 2
    for suite in suites:
        cases = suite.findall("testcase")
        assert len(cases) == 1 + len(OBLIGATIONS)
        assert int(suite.get("tests", 0)) == len(cases)
    bad = next(s for s in suites if s.get("name", "").endswith("bad"))
    failed = [c.get("name", "").split(":")[0] for c in bad.findall("testcase")
              if c.find("failure") is not None]
    assert "epochs" in failed and "shards" in failed
    assert int(root.get("failures", 0)) == len(failed)
    good = next(s for s in suites if s.get("name", "").endswith("good"))
    assert good.get("failures") == "0" and good.get("errors") == "0"


def test_junit_reports_unknown_as_an_error(tmp_path: Path) -> None:
    (tmp_path / "run" / "logs").mkdir(parents=True)
    root = ET.fromstring(render_junit(verify(tmp_path / "run")))
    assert root.get("errors") == "1"
    error = root.find("testsuite/testcase/error")
    assert error is not None and "run.json: file is missing" in error.get("message", "")


def test_every_kind_belongs_to_an_obligation() -> None:
    assert {k.obligation for k in KINDS.values()} == set(OBLIGATIONS)


def test_markdown_json_and_plots(runs: dict[str, Path], tmp_path: Path) -> None:
    result = verify(runs["good"], reference=runs["good"], series=True)
    written = write_report(result, tmp_path / "report", self_tests=self_test_runs(result))
    names = sorted(p.name for p in written)
    assert names == ["loss.png", "progress.png", "report.json", "report.md", "stall.png"]
    for png in (p for p in written if p.suffix == ".png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report" / "report.md").read_text()
    assert report.startswith("# ecrl-verify report: PASS")
    assert "![loss](loss.png)" in report and "### Lineage" in report
    assert "kill rate 100%" in report
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    test = data["runs"][0]["mutation_self_test"]
    assert test["killed"] == test["harmful"] > 10 and test["false_alarms"] == 0
    assert data["runs"][0]["metrics"]["loss_max_abs_diff"] == 0.0


def test_report_of_a_failing_run_skips_the_self_test(runs: dict[str, Path], tmp_path: Path
                                                     ) -> None:
    result = verify(runs["bad"], series=True)
    write_report(result, tmp_path / "r", self_tests=self_test_runs(result))
    report = (tmp_path / "r" / "report.md").read_text()
    assert "Not run: the run does not pass" in report and "`duplicate_sample`" in report


def test_reordered_ids_pass_with_a_warning(runs: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "shuffled"
    outcome = apply("shuffle_ids_in_record", runs["good"], target, random.Random(3))
    assert outcome is not None
    run = verify(target).runs[0]
    assert run.verdict == "PASS"
    assert [w.message for w in run.warnings if w.kind == "sample_order"] == [
        "1 record logged their shard's IDs in another order (the same samples)"]


def test_unfinished_run_in_text_junit_and_markdown(runs: dict[str, Path], tmp_path: Path
                                                   ) -> None:
    result = verify(runs["stopped"])
    run = result.runs[0]
    assert run.unfinished is not None and run.unfinished.durable_step == 23
    lines = render_text(result).splitlines()
    assert lines[0].startswith("UNKNOWN  ")
    # The account, not "cannot verify": the committed prefix was verified.
    assert lines[1] == f"  {run.unfinished.message}"
    assert "steps 0..23 proved exactly once" in lines[1] and "tentative step" in lines[2]
    suite = ET.fromstring(render_junit(result)).find("testsuite")
    assert suite is not None
    cases = {c.get("name", "").split(":")[0]: c for c in suite.findall("testcase")}
    assert cases["finished"].find("error") is not None
    assert cases["readable"].find("error") is None
    # The obligations were checked over the committed prefix: they pass. An ECRL run has no
    # audit-only obligation (batch), and no second run was named (order).
    assert all(cases[name].find("failure") is None and cases[name].find("skipped") is None
               for name in OBLIGATIONS if name not in ("batch", "order", "replay", "state"))
    assert cases["state"].find("skipped") is not None  # no state digests recorded
    assert run.replay is not None
    assert (cases["replay"].find("skipped") is None) == run.replay.tested
    assert cases["batch"].find("skipped") is not None
    assert cases["order"].find("skipped") is not None
    assert suite.get("errors") == "1" and suite.get("tests") == str(2 + len(OBLIGATIONS))
    stopped = verify(runs["stopped"], series=True)
    write_report(stopped, tmp_path / "r", self_tests=self_test_runs(stopped))
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"- {run.unfinished.message}" in report and "| tentative |" in report
    assert "Not run: the run does not pass" in report


def test_a_report_runs_no_self_test_unless_asked(runs: dict[str, Path], tmp_path: Path) -> None:
    write_report(verify(runs["good"], series=True), tmp_path / "r")
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["runs"][0]["mutation_self_test"] is None
    assert "Mutation self-test" not in (tmp_path / "r" / "report.md").read_text()
