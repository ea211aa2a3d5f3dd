"""What ``ecrl bench transform`` relies on: its programs installed as package data, and the
runtime's observer of saves and writes (no private import, no monkey-patching)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import killresume as kr
import pytest

from ecrl.apps.bench import transform as bench
from transform.cli import main as transform_main

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"


@pytest.mark.parametrize("case", [bench.FIXTURE, *bench.DEDUP_FIXTURES, bench.VIEWS_FIXTURE,
                                  bench.CALL_STACK_FIXTURE])
def test_the_benchmark_programs_are_the_fixtures(case: str) -> None:
    assert bench._source(case) == (CORPUS / case / "input.py").read_text(encoding="utf-8")


PROGRAM = """
from transform import _checkpoint

data = list(range(1000))
total = 0
for i in range(4):
    total += i
    _checkpoint()
print(total)
"""


def test_saves_and_writes_are_observed(tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(PROGRAM))
    program = tmp_path / "train.py"
    assert transform_main([str(original), "-o", str(program), "--all-hints"]) == 0
    env = {**kr.environment(tmp_path / "ckpt"), "ECRL_TRANSFORM_SYNC": "1"}
    timed = subprocess.run([sys.executable, "-c", bench._SAVE_TIMER, str(program)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True)
    count, median = re.findall(r"SAVES (\d+) (\S+)", timed.stderr)[-1]
    assert int(count) == 4 and float(median) > 0
    counted = subprocess.run([sys.executable, "-c", bench._BYTE_COUNTER, str(program)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    total, writes = map(int, re.findall(r"WRITTEN (\d+) (\d+)", counted.stderr)[-1])
    assert writes == 4
    # The last state's file alone is written whole each time: more than four headers' worth.
    killed = kr.inject(program, "4", cwd=tmp_path, env=env)
    assert killed.returncode == -9
    last = sum(p.stat().st_size for p in (tmp_path / "ckpt").iterdir())
    assert last < total <= 4 * last + 4 * 8192


def test_a_failing_observer_changes_nothing(tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(PROGRAM))
    program = tmp_path / "train.py"
    assert transform_main([str(original), "-o", str(program), "--all-hints"]) == 0
    script = ("import runpy, sys\nimport transform.runtime as runtime\n"
              "def boom(event):\n    raise RuntimeError('observer')\n"
              "runtime.observe(boom)\nsys.argv = sys.argv[1:]\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script, str(program)], cwd=tmp_path,
                          env=kr.environment(tmp_path / "ckpt"), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and done.stdout.strip() == "6", done.stderr
    assert "an observer of checkpoints failed: RuntimeError: observer" in done.stderr
