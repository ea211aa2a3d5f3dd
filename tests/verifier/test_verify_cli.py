"""``ecrl-verify``: the flags (pinned), exit codes, output formats, one-line errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from verifier_helpers import make_run

from verifier._mutations import apply


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verifier.cli", *args], capture_output=True,
                          text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("cli")
    good = make_run(base / "runs" / "good", world_sizes=(1, 2), fail_at=(6,), ckpt_every=3,
                    log_ids=False).root
    apply("truncate_final_attempt", good, base / "runs" / "bad", random.Random(0))
    make_run(base / "stopped", world_sizes=(2,), ckpt_every=3, stop_at=20, log_ids=False)
    (base / "broken" / "logs").mkdir(parents=True)
    return base


def test_flags_are_pinned() -> None:
    out = cli("--help")
    assert out.returncode == 0
    assert out.stdout.startswith("usage: ecrl-verify [-h] [--format {text,json,junit}] "
                                 "[--reference RUN]")
    for flag in ("--format {text,json,junit}", "--reference RUN", "--report DIR", "--self-test",
                 "--same-order RUN2", "--replay-tolerance REL", "--jobs N", "--ray [ADDRESS]",
                 "--follow", "PATH"):
        assert flag in out.stdout


@pytest.mark.parametrize(("target", "code", "first"), [
    ("runs/good", 0, "PASS"), ("runs/bad", 1, "FAIL"), ("broken", 2, "UNKNOWN"),
    ("runs", 1, "FAIL"), ("stopped", 2, "UNKNOWN"),
])
def test_exit_codes(runs: Path, target: str, code: int, first: str) -> None:
    out = cli(str(runs / target))
    assert out.returncode == code, out.stdout + out.stderr
    assert out.stdout.startswith(first)
    assert "Traceback" not in out.stderr


def test_json_and_junit(runs: Path) -> None:
    out = cli(str(runs / "runs"), "--format", "json")
    data = json.loads(out.stdout)
    assert data["verdict"] == "FAIL" and [r["verdict"] for r in data["runs"]] == ["FAIL", "PASS"]
    assert out.returncode == 1
    out = cli(str(runs / "runs" / "good"), "--format", "junit")
    assert out.returncode == 0
    assert ET.fromstring(out.stdout).get("failures") == "0"


@pytest.mark.parametrize("args", [
    ["/no/such/run"], ["{file}"], ["{good}", "--reference", "/no/such/ref"],
    ["{empty}"],
])
def test_bad_input_is_one_line_and_exit_2(runs: Path, tmp_path: Path, args: list[str]) -> None:
    file = tmp_path / "file.txt"
    file.write_text("x")
    (tmp_path / "empty").mkdir()
    args = [a.format(file=file, good=runs / "runs" / "good", empty=tmp_path / "empty")
            for a in args]
    out = cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    message = (out.stderr + out.stdout).strip()
    assert len(message.splitlines()) == 1, message


def test_report_flag_writes_the_report(runs: Path, tmp_path: Path) -> None:
    out = cli(str(runs / "runs" / "good"), "--report", str(tmp_path / "rep"),
              "--reference", str(runs / "runs" / "good"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "rep" / "report.md").is_file()
    assert (tmp_path / "rep" / "loss.png").is_file()
    assert "wrote" in out.stderr


def test_self_test_only_when_asked(runs: Path, tmp_path: Path) -> None:
    out = cli(str(runs / "runs"), "--self-test", "--report", str(tmp_path / "rep"))
    assert out.returncode == 1, out.stderr
    lines = [line for line in out.stderr.splitlines() if "self-test" in line]
    assert len(lines) == 2, out.stderr
    assert any("not run: the run does not pass" in line for line in lines)
    assert any("caught" in line and "(0 false alarms)" in line for line in lines)
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "### Mutation self-test" in report and "kill rate 100%" in report
    out = cli(str(runs / "runs" / "good"), "--report", str(tmp_path / "plain"))
    assert "self-test" not in out.stderr
    assert "Mutation self-test" not in (tmp_path / "plain" / "report.md").read_text()


def test_a_reader_that_stops_early_keeps_the_verdict(runs: Path) -> None:
    # `ecrl-verify RUNS | head -1`: the pipe closes before the report is written
    proc = subprocess.Popen([sys.executable, "-m", "verifier.cli", str(runs / "runs"),
                             "--format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child has printed anything: its print meets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1  # FAIL, not "error" (2)
    assert "Broken pipe" not in err and "Traceback" not in err


def test_a_folder_of_runs_skips_hidden_folders_and_folders_without_run_json(
        runs: Path, tmp_path: Path) -> None:
    # Issue 11 item 9: `.git` has a logs/ folder; it was verified as a run (UNKNOWN, exit 2).
    folder = tmp_path / "project"
    make_run(folder / "good", world_sizes=(2,), ckpt_every=3, log_ids=False)
    (folder / ".git" / "logs" / "refs").mkdir(parents=True)
    (folder / ".git" / "logs" / "HEAD").write_text("0000 1111 someone\n")
    (folder / ".cache" / "old-run" / "logs").mkdir(parents=True)
    (folder / "notes" / "logs").mkdir(parents=True)  # no run.json: not a run
    out = cli(str(folder), "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [Path(r["path"]).name for r in json.loads(out.stdout)["runs"]] == ["good"]
    # Named directly, a folder with logs/ but no run.json still gets a verdict saying so.
    out = cli(str(folder / "notes"))
    assert out.returncode == 2 and "run.json" in out.stdout
