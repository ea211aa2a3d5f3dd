"""The cost model (issue 10 item 7): parameters resolved once, the measured profile as the easy
path, and the static estimate's error reported next to the measurement."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from transform.analysis import AnalysisSuccess, analyze
from transform.plan import DEFAULT_CKPT_COST, DEFAULT_MTBF, DEFAULT_OVERHEAD, ScheduleParams
from transform.report import explain_json
from transform.tasks import RegionParams

# Ten sleeps of 20 ms between hints: the static estimate (1 ms per statement) is far below.
SLOW = """\
import time
from transform import _checkpoint

w = [0.0] * 2000
for step in range(30):
    time.sleep(0.02)
    w[0] += step
    _checkpoint()
print(w[0])
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "transform.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_parameters_are_resolved_once_with_their_precedence() -> None:
    assert ScheduleParams().resolved() == ScheduleParams(
        overhead=DEFAULT_OVERHEAD, ckpt_cost=DEFAULT_CKPT_COST, mtbf=DEFAULT_MTBF)
    declared = RegionParams(overhead=0.2, failure_rate=0.01)
    got = ScheduleParams(ckpt_cost=3.0).resolved(declared, profile_cost=0.5)
    assert (got.overhead, got.ckpt_cost, got.failure_rate, got.mtbf) == (0.2, 3.0, 0.01, None)
    # A profile's mean cost stands in for t_c only when neither flag nor source gives one.
    assert ScheduleParams().resolved(declared, profile_cost=0.5).ckpt_cost == 0.5
    # The command line's failure model wins as a pair over the source's.
    flag = ScheduleParams(mtbf=60.0).resolved(declared)
    assert (flag.failure_rate, flag.mtbf) == (None, 60.0)


def test_schedules_carry_resolved_parameters() -> None:
    result = analyze(SLOW, "slow.py")
    assert isinstance(result, AnalysisSuccess)
    params = result.schedules[0].params
    assert params.overhead == DEFAULT_OVERHEAD and params.ckpt_cost == DEFAULT_CKPT_COST
    assert params.mtbf == DEFAULT_MTBF
    data = json.loads(explain_json(result))
    region = data["regions"][0]
    assert region["overhead"] == DEFAULT_OVERHEAD and region["ckpt_cost"] == DEFAULT_CKPT_COST
    assert region["times"] == "static" and region["estimate_error"] is None


def test_explain_without_profile_points_to_measuring(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    out = cli("slow.py", "--explain", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "task times are static estimates" in out.stdout
    assert "ecrl-transform slow.py --record-profile PROFILE" in out.stdout
    assert "(overhead 0.05, 10 s per checkpoint)" in out.stdout


def test_explain_reports_the_estimate_error_against_the_profile(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    out = cli("slow.py", "--explain", "--format", "json", "--record-profile", "slow.prof",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    region = json.loads(out.stdout)["regions"][0]
    assert region["times"] == "measured"
    assert region["total_time"] >= 30 * 0.02  # the sleeps, measured
    static = region["static_total_time"]
    assert static == pytest.approx(30 * 0.004 + 0.001 * 31 + 0.002, rel=0.5)
    assert region["estimate_error"] == pytest.approx((static - region["total_time"])
                                                     / region["total_time"])
    assert region["estimate_error"] < -0.5
    # t_c comes from the profile's save sizes, not the 10 s default.
    assert region["ckpt_cost"] < 1.0
    text = cli("slow.py", "--explain", "--profile", "slow.prof", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "the static estimate was" in text.stdout and "%)" in text.stdout
    assert "task times are static estimates" not in text.stdout
    # Per-hint task times are the measured ones too (about 20 ms, not the 3 ms estimate).
    hint_line = next(line for line in text.stdout.splitlines() if "hint 1 (" in line)
    task = float(hint_line.split("task ")[1].split(" s")[0])
    assert task >= 0.015


def test_advise_uses_the_schedulers_budget_function() -> None:
    from ecrl.apps import advise
    from transform import schedule

    assert advise.checkpoint_budget is schedule.checkpoint_budget
    given = advise.AdviceInput(ckpt_cost=7.0, restore_cost=1.0, step_time=1.0,
                               gpu_failure_rate=1e-6, gpus=8, overhead=0.03,
                               job_seconds=10_000.0)
    assert advise.advise(given).checkhint_budget == math.ceil(0.03 * 10_000 / 7)
