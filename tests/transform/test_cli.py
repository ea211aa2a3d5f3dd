"""ecrl-transform's surface: flags, the --explain JSON schema, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from transform.cli import build_parser

PROGRAM = """\
from transform import _checkpoint, checkpoint_params

checkpoint_params(overhead=0.1, ckpt_cost=5, mtbf=3600)
w = 0.0
for step in range(200):
    _cost: 1.5
    w += step
    _checkpoint()
print(w)
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "transform.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


def test_flags_are_pinned() -> None:
    flags = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert flags == {"-h", "--help", "-o", "--output", "--in-place", "--diff", "--check",
                     "--explain", "--format", "--all-hints", "--ckpt-dir", "--overhead",
                     "--ckpt-cost", "--failure-rate", "--mtbf", "--objective", "--profile",
                     "--record-profile", "--write-bandwidth"}


def test_explain_json_schema(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "--explain", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"hints", "chosen", "budget", "expected_recovery", "live"} <= set(data)
    assert set(data["hints"][0]) >= {"id", "line", "cost"}
    assert data["hints"][0] == {**data["hints"][0], "id": 1, "line": 8, "cost": 1.5}
    # Σt = 200 × 1.5 s (+ loop tests); ℓ = ⌈0.1 × 300 / 5⌉ = 7 (the 0.001 s tests round up)
    assert data["budget"] == 7 and data["chosen"] == [1]
    assert data["live"] == {"1": ["w"]}
    assert data["expected_recovery"] < data["expected_recovery_without"]
    region = data["regions"][0]
    assert region["checkpoints"] == 7 and region["firings"][0]["kind"] == "occurrences"
    gaps = [b - a for a, b in zip(region["firings"][0]["occurrences"],
                                  region["firings"][0]["occurrences"][1:], strict=False)]
    assert max(gaps) - min(gaps) <= 1


def test_explain_text_and_cli_overrides(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "--explain", "--overhead", "0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "budget 31 checkpoint(s)" in out.stdout and "saves: w" in out.stdout
    cost = run("train.py", "--explain", "--format", "json", "--objective", "cost", cwd=tmp_path)
    assert json.loads(cost.stdout)["budget"] is None


def test_write_modes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "-o", "out.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    written = (tmp_path / "out.py").read_text()
    assert "import transform.runtime as _ecrl_runtime" in written
    assert written != PROGRAM
    stdout = run("train.py", cwd=tmp_path)
    assert stdout.returncode == 0 and stdout.stdout == written
    diff = run("train.py", "--diff", cwd=tmp_path)
    assert diff.returncode == 0 and diff.stdout.startswith("--- train.py\n+++ train.py")
    assert "+_ECRL = _ecrl_runtime.Program(" in diff.stdout
    assert run("train.py", "--check", "-o", "out.py", cwd=tmp_path).returncode == 0
    (tmp_path / "out.py").write_text(written + "# edited\n")
    stale = run("train.py", "--check", "-o", "out.py", cwd=tmp_path)
    assert stale.returncode == 1 and "out.py would change" in stale.stderr
    assert (tmp_path / "out.py").read_text().endswith("# edited\n")  # --check writes nothing
    assert run("train.py", "--check", cwd=tmp_path).returncode == 1
    assert run("train.py", "--in-place", cwd=tmp_path).returncode == 0
    assert (tmp_path / "train.py").read_text() == written
    # A transformed program is transformed from its original: idempotent, and --check agrees.
    assert run("train.py", "--in-place", cwd=tmp_path).returncode == 0
    assert (tmp_path / "train.py").read_text() == written
    assert run("train.py", "--check", cwd=tmp_path).returncode == 0
    (tmp_path / "train.py").write_text(written + "print(_ecrl.run)\n")
    edited = run("train.py", "-o", "twice.py", cwd=tmp_path)
    assert edited.returncode == 2 and "generated code was edited" in edited.stderr
    assert not (tmp_path / "twice.py").exists()


def test_ckpt_dir_is_written_into_the_program(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "--ckpt-dir", "state/here", "--all-hints", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "'ckpt_dir': 'state/here'" in out.stdout
    assert "'kind': 'always', 'total': 200, 'count': 200" in out.stdout


def test_a_file_without_hints_is_left_unchanged(tmp_path: Path) -> None:
    plain = "x = 1\nprint(x)\n"
    (tmp_path / "plain.py").write_text(plain)
    out = run("plain.py", "--in-place", cwd=tmp_path)
    assert out.returncode == 0
    note = "ecrl-transform: plain.py has no _checkpoint() hints: nothing to do"
    assert out.stderr.strip() == note
    assert (tmp_path / "plain.py").read_text() == plain
    assert run("plain.py", "--check", cwd=tmp_path).returncode == 0
    assert run("plain.py", "-o", "copy.py", cwd=tmp_path).returncode == 0
    assert (tmp_path / "copy.py").read_text() == plain


def test_check_refuses_other_modes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "--check", "--diff", cwd=tmp_path)
    assert out.returncode == 2 and "--check goes alone or with -o" in out.stderr


CODEGEN_BAD = {
    "unsaveable": ("from transform import _checkpoint\ndef f(path):\n"
                   "    lines = (s for s in open(path))\n"
                   "    for i in range(3):\n        _checkpoint()\n        next(lines)\n",
                   "`lines` holds a generator", 3),
    # a generator function of the program's own (a batch stream), live across the loop
    "unsaveable-generator-function": (
        "from transform import _checkpoint\ndef batches(n):\n    while True:\n"
        "        yield list(range(n))\nstream = batches(4)\nfor i in range(3):\n"
        "    _checkpoint()\n    next(stream)\n",
        "`stream` holds a generator (from batches(), a generator function)", 5),
    # f() runs once, so it is its own region (a loop calling it would host its hints)
    "two-levels": ("from transform import _checkpoint\ndef f():\n    for i in range(3):\n"
                   "        _checkpoint()\nf()\nfor j in range(3):\n    _checkpoint()\n",
                   "both at the module's top level and in f()", 4),
    "reserved": ("from transform import _checkpoint\n_ecrl = 1\nfor i in range(3):\n"
                 "    _checkpoint()\n", "`_ecrl` is a name generated code uses", 2),
}


@pytest.mark.parametrize("case", sorted(CODEGEN_BAD))
def test_generation_refuses_what_it_cannot_resume(tmp_path: Path, case: str) -> None:
    source, words, line = CODEGEN_BAD[case]
    (tmp_path / "bad.py").write_text(source)
    out = run("bad.py", "--all-hints", "-o", "out.py", cwd=tmp_path)
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"bad.py:{line}:") and words in first, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "out.py").exists()


BAD = {
    "syntax": ("x = (1,\n", "was never closed", 1),
    "hint-arguments": ("from transform import _checkpoint\n_checkpoint(5)\n",
                       "takes no arguments", 2),
    "unbounded-loop": ("from transform import _checkpoint\nwhile True:\n    _checkpoint()\n",
                       "_iterations", 2),
    "generator": ("from transform import _checkpoint\ndef g():\n    _checkpoint()\n"
                  "    yield 1\n", "generator", 4),
    "async": ("from transform import _checkpoint\nasync def g():\n    _checkpoint()\n",
              "async", 2),
    "comprehension": ("from transform import _checkpoint\nx = [_checkpoint() for i in "
                      "range(3)]\n", "comprehension", 2),
    "exec": ("from transform import _checkpoint\ndef f():\n    exec('y = 1')\n"
             "    _checkpoint()\n", "exec()", 3),
    "hint-in-expression": ("from transform import _checkpoint\nx = _checkpoint()\n",
                           "statement of its own", 2),
    "bad-iterations": ("from transform import _checkpoint\nfor i in xs:\n    _iterations: n\n"
                       "    _checkpoint()\n", "integer literal", 3),
    "hint-not-alone": ("from transform import _checkpoint\nx = 1; _checkpoint()\n",
                       "line of its own", 2),
    "hint-after-colon": ("from transform import _checkpoint\nfor i in range(3): _checkpoint()\n",
                         "line of its own", 2),
    "hint-in-class": ("from transform import _checkpoint\nclass C:\n    _checkpoint()\n",
                      "class body", 3),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_line(tmp_path: Path, case: str) -> None:
    source, words, line = BAD[case]
    (tmp_path / "bad.py").write_text(source)
    for mode in (["--explain"], ["-o", "out.py"]):
        out = run("bad.py", *mode, cwd=tmp_path)
        assert out.returncode == 2
        first = out.stderr.splitlines()[0]
        assert first.startswith(f"bad.py:{line}:") and words in first, out.stderr
        assert "Traceback" not in out.stderr
        assert out.stdout == "" and not (tmp_path / "out.py").exists()


def test_explain_with_output_reports_and_writes(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROGRAM)
    alone = run("train.py", "--explain", cwd=tmp_path)
    both = run("train.py", "--explain", "-o", "out.py", cwd=tmp_path)
    assert both.returncode == 0, both.stderr
    assert both.stdout == alone.stdout  # the same report, and only the report, on stdout
    written = run("train.py", "-o", "plain.py", cwd=tmp_path)
    assert written.returncode == 0
    assert (tmp_path / "out.py").read_text() == (tmp_path / "plain.py").read_text()
    clash = run("train.py", "--explain", "--diff", cwd=tmp_path)
    assert clash.returncode == 2 and clash.stdout == ""
    assert clash.stderr.count("\n") == 1 and "--explain" in clash.stderr


def test_columns_count_characters_not_bytes() -> None:
    from transform.analysis import AnalysisFailure, analyze

    result = analyze("from transform import _checkpoint\nname = 'é'; _checkpoint()\n", "u.py")
    assert isinstance(result, AnalysisFailure)
    # "name = 'é'; " is 12 characters (13 bytes): the call starts in column 13.
    assert (result.issue.line, result.issue.column) == (2, 13)


def test_missing_file_and_bad_parameters(tmp_path: Path) -> None:
    out = run("nope.py", "--explain", cwd=tmp_path)
    assert out.returncode == 2 and "cannot read nope.py" in out.stderr
    (tmp_path / "train.py").write_text(PROGRAM)
    out = run("train.py", "--explain", "--failure-rate", "2", cwd=tmp_path)
    assert out.returncode == 2 and "--failure-rate" in out.stderr
    assert "Traceback" not in out.stderr


def test_record_profile_measures_times_and_sizes(tmp_path: Path) -> None:
    program = PROGRAM.replace("    _cost: 1.5\n", "").replace("w = 0.0", "w = [0.0] * 1000")
    program = program.replace("w += step", "w[0] += step")
    (tmp_path / "train.py").write_text(program)
    out = run("train.py", "--explain", "--format", "json", "--record-profile", "prof.json",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["hints"][0]["save_bytes"] > 1000  # a list of 1000 floats
    prof = json.loads((tmp_path / "prof.json").read_text())
    counts = {(a, b): c for a, b, _, c in prof["transitions"]}
    assert counts[(None, 1)] == 1 and counts[(1, 1)] == 199 and counts[(1, None)] == 1
