"""The three command lines: real --help, one-line errors, exit codes (ARCHITECTURE.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ecrl.runtime.runconfig import RunFlag

ENTRY = {
    "ecrl": "ecrl.apps.cli",
    "ecrl-verify": "verifier.cli",
    "ecrl-transform": "transform.cli",
}


def run_cli(program: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", ENTRY[program], *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.mark.parametrize("program", list(ENTRY))
def test_help(program: str) -> None:
    out = run_cli(program, "--help")
    assert out.returncode == 0
    assert out.stdout.startswith(f"usage: {program}")


@pytest.mark.parametrize(
    ("args", "flags"),
    [
        (["run", "--help"], ["--world-sizes", "--global-batch", "--strategy", "--fail-at",
                             "--log-ids", "--max-restarts", "--deadline", "--config"]),
        (["bench", "--help"], ["--quick", "--format", "--write-docs"]),
    ],
)
def test_ecrl_subcommand_flags(args: list[str], flags: list[str]) -> None:
    out = run_cli("ecrl", *args)
    assert out.returncode == 0
    for flag in flags:
        assert flag in out.stdout


RUN_FLAGS = [
    "--config", "--nproc", "--out", "--world-sizes", "--parallel", "--replicate", "--tp",
    "--dataset", "--data-dir", "--dataset-size",
    "--model", "--global-batch", "--steps", "--epochs", "--ckpt-every", "--strategy",
    "--max-inflight", "--fail-at", "--fail-rank", "--seed", "--log-ids", "--max-restarts",
    "--deadline", "--deadline-k-step", "--deadline-k-ckpt", "--hang-timeout-s",
    "--keep-checkpoints", "--lr", "--image-size", "--threads", "--warm-standby",
    "--verify-follow", "--collective-timeout-s", "--nnodes", "--rdzv-backend", "--rdzv-endpoint",
    "--rdzv-id", "--rdzv-conf",
]


def _assert_help_pins(command: str, pinned: list[str], generated: Iterable[RunFlag]) -> None:
    """``ecrl COMMAND --help`` shows exactly the pinned flags, each with its generated help."""
    import re

    out = run_cli("ecrl", command, "--help")
    assert out.returncode == 0
    shown = re.findall(r"^  (--[a-z-]+)", out.stdout, re.M)
    assert shown == pinned  # a change here is deliberate: update the list and the docs
    text = " ".join(out.stdout.split())
    for f in generated:
        assert " ".join(f.help.replace("%%", "%").split()) in text


def test_run_flags_are_pinned_and_generated_from_the_config_fields() -> None:
    from dataclasses import fields

    from ecrl.runtime.runconfig import RunConfig, run_flags

    _assert_help_pins("run", RUN_FLAGS, run_flags())
    generated = [f.flag for f in run_flags()]
    assert generated == ["--" + f.name.replace("_", "-") for f in fields(RunConfig)
                         if f.name != "explicit"]
    assert generated == RUN_FLAGS[2:]  # --config and --nproc are not settings of a run


LAUNCH_FLAGS = [
    "--out", "--nproc", "--world-sizes", "--parallel", "--replicate", "--tp", "--ckpt-every",
    "--strategy", "--max-inflight",
    "--fail-at", "--fail-rank", "--max-restarts", "--keep-checkpoints", "--deadline",
    "--deadline-k-step", "--deadline-k-ckpt", "--hang-timeout-s", "--threads", "--nnodes",
    "--node-rank", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--warm-standby", "--verify-follow",
]


def test_launch_flags_are_pinned_and_generated_from_the_run_flags() -> None:
    from ecrl.runtime.runconfig import launch_flags

    _assert_help_pins("launch", LAUNCH_FLAGS, launch_flags())
    generated = [f.flag for f in launch_flags()]
    assert generated == [f for f in LAUNCH_FLAGS if f not in ("--out", "--nproc", "--node-rank")]


def test_selfcheck_passes_and_shows_worked_example() -> None:
    out = run_cli("ecrl", "selfcheck")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step 0: window [7, 8, 2, 6]" in out.stdout
    assert "all checks passed" in out.stdout


def test_bad_subcommand_is_a_usage_error() -> None:
    out = run_cli("ecrl", "frobnicate")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr


def test_bench_sampler_quick_json(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro kept\n")
    out = run_cli("ecrl", "bench", "sampler", "--quick", "--format", "json",
                  "--write-docs", str(doc))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    keys = {"candidate", "alternative", "metric", "candidate_value", "alternative_value", "ratio"}
    assert report["rows"] and all(keys <= set(row) for row in report["rows"])
    # randperm cannot materialise 1e10 IDs here: that row says so instead of a number
    skipped = [r for r in report["rows"] if r["alternative_value"] is None]
    assert skipped and all("skipped" in r["note"] for r in skipped)
    text = doc.read_text()
    assert "intro kept" in text and text.count("<!-- bench:sampler:start -->") == 1


def test_docs_section_is_replaced_not_appended(tmp_path: Path) -> None:
    from ecrl.apps.bench._common import BenchResult, BenchRow, write_docs_section

    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro kept\n")
    for value in (1.0, 2.0):
        row = BenchRow(candidate="a", alternative="b", metric="m", candidate_value=value,
                       alternative_value=4.0)
        write_docs_section(doc, BenchResult(name="x", command="ecrl bench x", rows=[row]))
    text = doc.read_text()
    assert text.count("<!-- bench:x:start -->") == 1
    assert "| m | a | 2 | b | 4 | 0.5 |" in text and "intro kept" in text


def test_the_same_benchmark_on_other_hardware_keeps_its_own_section(tmp_path: Path) -> None:
    from ecrl.apps.bench._common import BenchResult, BenchRow, write_docs_section

    doc = tmp_path / "benchmarks.md"
    for section, value in (("", 1.0), ("x-cuda", 2.0), ("", 3.0)):
        row = BenchRow(candidate="a", alternative="b", metric="m", candidate_value=value,
                       alternative_value=4.0)
        write_docs_section(doc, BenchResult(name="x", section=section, command="ecrl bench x",
                                            rows=[row]))
    text = doc.read_text()
    assert text.count("<!-- bench:x:start -->") == text.count("<!-- bench:x-cuda:start -->") == 1
    assert "### `ecrl bench x` (x-cuda)" in text
    assert "| m | a | 2 | b |" in text and "| m | a | 3 | b |" in text  # neither replaced the other


# How each command line ends is one definition (ecrl.contract.cli, tested there); each main uses
# it: Ctrl-C during the work is exit 130 with one line, a closed stdout pipe a quiet exit.
def _interrupt(*args: object, **kwargs: object) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("program", "patch", "args"), [
    ("ecrl", "ecrl.apps.cli._cmd_selfcheck", ["selfcheck"]),
    ("ecrl-verify", "verifier.verify", ["runs/x"]),
    ("ecrl-transform", "transform.cli._run", ["train.py"]),
])
def test_ctrl_c_is_exit_130(program: str, patch: str, args: list[str],
                            monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    monkeypatch.setattr(patch, _interrupt)
    main = importlib.import_module(ENTRY[program]).main
    assert main(args) == 130
    prog = "ecrl selfcheck" if program == "ecrl" else program
    assert capsys.readouterr().err == f"{prog}: interrupted\n"


def test_ecrl_stops_quietly_when_its_reader_does() -> None:
    # `ecrl selfcheck | head -c 1` (ecrl-verify and ecrl-transform: their own test files)
    proc = subprocess.Popen([sys.executable, "-m", ENTRY["ecrl"], "selfcheck"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child printed anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err
