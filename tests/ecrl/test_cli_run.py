"""`ecrl run` refuses bad input with one line and writes nothing (no torch, no torchrun)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def ecrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecrl.apps.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (["--global-batch", "10", "--world-sizes", "2,3"], "not divisible by world size 3"),
    (["--nproc", "3", "--global-batch", "8"], "not divisible by world size 3"),
    (["--model", "resnet34"], "--model 'resnet34' is unknown"),
    (["--strategy", "async"], "--strategy 'async' is unknown"),
    (["--dataset", "cifar10", "--data-dir", "no/such/dir"], "no such directory"),
    (["--dataset", "imagefolder"], "needs --data-dir"),
    (["--steps", "10", "--fail-at", "3,12"], "could never fire"),
    (["--world-sizes", "2,x"], "'x' is not an integer"),
    (["--nproc", "2", "--world-sizes", "2"], "not both"),
    (["--config", "missing.toml"], "no such file"),
    # meshes (issue 31): refused before anything is launched or written
    (["--parallel", "fsdp", "--tp", "2", "--world-sizes", "4,3", "--global-batch", "12"],
     "--tp 2 does not divide world size 3"),
    (["--parallel", "fsdp", "--tp", "2", "--world-sizes", "8", "--global-batch", "6",
      "--model", "tiny-gpt"], "not divisible by the data-parallel size 4"),
    (["--parallel", "hsdp", "--replicate", "3", "--world-sizes", "4"],
     "--replicate 3 does not divide the data-parallel degree 4"),
    (["--parallel", "fsdp", "--tp", "2", "--world-sizes", "2"], "--tp 2 needs --model tiny-gpt"),
    (["--parallel", "zero3"], "--parallel 'zero3' is unknown"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str],
                                                  message: str) -> None:
    out = ecrl("run", "--out", "run", *args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert out.stderr.startswith("ecrl run: error: ")
    assert list(tmp_path.iterdir()) == []


def test_out_must_be_a_run_or_empty(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "thesis.tex").write_text("precious")
    out = ecrl("run", "--out", "run", cwd=tmp_path)
    assert out.returncode == 2 and "is not an ECRL run directory" in out.stderr
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["thesis.tex"]


def test_run_flags_are_pinned() -> None:
    # A change to the surface of `ecrl run` must be deliberate: update this list and the docs.
    from ecrl.apps.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    run = sub.choices["run"]  # type: ignore[attr-defined]
    flags = sorted(o for a in run._actions for o in a.option_strings if o.startswith("--"))
    assert flags == sorted([
        "--help", "--config", "--out", "--nproc", "--world-sizes", "--parallel", "--replicate",
        "--tp", "--dataset", "--data-dir",
        "--dataset-size", "--model", "--global-batch", "--steps", "--epochs", "--ckpt-every",
        "--strategy", "--max-inflight", "--fail-at", "--fail-rank", "--seed", "--log-ids",
        "--max-restarts", "--deadline", "--keep-checkpoints", "--lr", "--image-size",
        "--threads", "--warm-standby", "--verify-follow", "--collective-timeout-s", "--nnodes",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id", "--rdzv-conf", "--deadline-k-step", "--deadline-k-ckpt", "--hang-timeout-s"])


def test_demo_never_replaces_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "demo-run").mkdir()
    (tmp_path / "demo-run" / "notes.txt").write_text("mine")
    out = ecrl("demo", cwd=tmp_path)
    assert out.returncode == 2 and "was not created by ecrl demo" in out.stderr
    assert (tmp_path / "demo-run" / "notes.txt").read_text() == "mine"
