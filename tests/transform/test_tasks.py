"""The task tree's reading of hint annotations: bounded constant expressions only, one positioned
line for everything else (issue 11 item 7, issue 10 item 6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from transform.analysis import AnalysisFailure, AnalysisSuccess, analyze

HEAD = "from transform import _checkpoint\n"


def loop_with(first: str) -> str:
    return f"{HEAD}while True:\n    {first}\n    _checkpoint()\n    break\n"


def cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A timeout turns "never finishes" (10**10**10 evaluated) into a failure, not a hung suite.
    return subprocess.run([sys.executable, "-m", "transform.cli", str(path), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("annotation", ["10**10**10", "1e400", "2**0.5", "-3", "10**19",
                                        "9**9**9 - 1", "n", "'5'", "True", "(-8) ** 0.5"])
def test_iterations_out_of_bounds_are_one_positioned_line(tmp_path: Path,
                                                          annotation: str) -> None:
    src = tmp_path / "train.py"
    src.write_text(loop_with(f"_iterations: {annotation}"))
    for mode in (["--explain"], ["-o", str(tmp_path / "out.py")]):
        out = cli(src, *mode)
        assert out.returncode == 2, out.stderr
        first = out.stderr.splitlines()[0]
        assert first.startswith(f"{src}:3:18: _iterations needs a non-negative integer"), first
        assert "Traceback" not in out.stderr and "Error" not in out.stderr
        assert not (tmp_path / "out.py").exists()


@pytest.mark.parametrize(("annotation", "count"), [("10**18", 10**18), ("3_600 * 24", 86_400),
                                                    ("2**10 // 3", 341), ("1e6", 10**6),
                                                    ("-(-5)", 5)])
def test_bounded_constant_expressions_are_accepted(annotation: str, count: int) -> None:
    result = analyze(loop_with(f"_iterations: {annotation}"), "t.py")
    assert isinstance(result, AnalysisSuccess), result
    assert result.schedules[0].firings[0].total == count


def test_range_beyond_a_countable_run_is_refused() -> None:
    result = analyze(f"{HEAD}for i in range(10**30):\n    _checkpoint()\n", "t.py")
    assert isinstance(result, AnalysisFailure)
    assert (result.issue.line, result.issue.column) == (2, 10)
    assert "more than the 10**18" in result.issue.message


def test_cost_beyond_a_float_is_refused() -> None:
    result = analyze(loop_with("_iterations: 3\n    _cost: 1e400"), "t.py")
    assert isinstance(result, AnalysisFailure)
    assert result.issue.kind == "bad-cost" and result.issue.line == 4


@pytest.mark.parametrize(("statement", "name"), [("_iterations = 5", "_iterations"),
                                                 ("_iterations: int = 5", "_iterations")])
def test_iterations_assignment_says_it_must_be_an_annotation(tmp_path: Path, statement: str,
                                                            name: str) -> None:
    src = tmp_path / "train.py"
    src.write_text(loop_with(statement))
    out = cli(src, "--explain")
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"{src}:3:5: `{name} = N` is an assignment: write it as an "
                            f"annotation, `{name}: N`"), first


def test_cost_assignment_says_it_must_be_an_annotation() -> None:
    source = f"{HEAD}for i in range(3):\n    _cost = 0.5\n    x = i\n    _checkpoint()\n"
    result = analyze(source, "t.py")
    assert isinstance(result, AnalysisFailure)
    assert result.issue.line == 3 and "`_cost: N`" in result.issue.message


def test_a_variable_the_program_computes_is_not_mistaken_for_the_annotation() -> None:
    source = (f"{HEAD}for i in range(3):\n    _cost = float(i)\n    print(_cost)\n"
              "    _checkpoint()\n")
    assert isinstance(analyze(source, "t.py"), AnalysisSuccess)


def test_unbounded_arithmetic_in_range_and_params_is_never_evaluated(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text(f"{HEAD}for i in range(10**10**10):\n    _checkpoint()\n")
    out = cli(src, "--explain")
    assert out.returncode == 2 and out.stderr.startswith(f"{src}:2:1: this loop holds")
    src.write_text("from transform import _checkpoint, checkpoint_params\n"
                   "checkpoint_params(mtbf=10**10**10)\nfor i in range(3):\n    _checkpoint()\n")
    out = cli(src, "--explain")
    assert out.returncode == 2 and out.stderr.startswith(f"{src}:2:24: checkpoint_params(mtbf")
