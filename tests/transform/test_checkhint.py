"""CheckHint's own programs (seed 001): ``@schedule_checkpoints(allowance=…, checkpoint_cost=…,
failure_prob=…, checkpoint_fn_name=…)`` is honoured, or refused in one positioned line
(issue 10 item 6)."""

from __future__ import annotations

import math
from pathlib import Path

import killresume as kr
import pytest

from transform.analysis import AnalysisFailure, AnalysisSuccess, analyze
from transform.codegen import generate
from transform.plan import ScheduleParams

# CheckHint's decorator is a no-op at run time; a stand-in module keeps the program runnable.
CHECKHINT = """\
def schedule_checkpoints(**kwargs):
    return lambda func: func


def checkpoint():
    pass
"""

PROGRAM = """\
import checkhint
from checkhint import checkpoint


def grad(p):
    return 2.0 * (p - 3.0)


@checkhint.schedule_checkpoints(allowance=0.3, checkpoint_cost=0.5, failure_prob=0.01,
                                checkpoint_fn_name="checkpoint")
def train(grad_fn):
    params = 0.0
    trace = []
    for epoch in range(0, 5):
        _iterations: 5
        for batch in range(0, 50):
            _iterations: 50
            params = params - 0.01 * grad_fn(params)
            checkpoint()
        trace.append(round(params, 9))
        checkpoint()
    return trace


print(train(grad))
"""


def test_decorator_values_are_honoured() -> None:
    result = analyze(PROGRAM, "ch.py")
    assert isinstance(result, AnalysisSuccess), result
    assert [h.position.line for h in result.hints] == [19, 21]
    region = result.schedules[0]
    assert region.params.overhead == 0.3 and region.params.ckpt_cost == 0.5
    assert region.hazard == pytest.approx(-math.log1p(-0.01))
    # ℓ = ⌈o·Σt/t_c⌉ with CheckHint's allowance and cost, not the defaults (0.05, 10 s).
    assert region.budget == min(math.ceil(0.3 * region.total_time / 0.5), 255)
    default = analyze(PROGRAM.replace("allowance=0.3, checkpoint_cost=0.5, failure_prob=0.01,",
                                      ""), "ch.py")
    assert isinstance(default, AnalysisSuccess)
    assert default.schedules[0].budget == 1 and default.schedules[0].params.ckpt_cost == 10.0


def test_command_line_still_wins() -> None:
    result = analyze(PROGRAM, "ch.py", ScheduleParams(overhead=0.01, mtbf=100.0))
    assert isinstance(result, AnalysisSuccess)
    assert result.schedules[0].params.overhead == 0.01
    assert result.schedules[0].hazard == pytest.approx(0.01)


def test_hints_under_another_name_are_found_only_where_declared() -> None:
    undecorated = PROGRAM.replace('checkpoint_fn_name="checkpoint"', "")
    result = analyze(undecorated, "ch.py")
    assert isinstance(result, AnalysisSuccess) and result.hints == ()
    # A function of the same name elsewhere is an ordinary call.
    other = PROGRAM + "\ndef helper():\n    checkpoint()\n"
    found = analyze(other, "ch.py")
    assert isinstance(found, AnalysisSuccess) and len(found.hints) == 2


BAD = {
    "negative allowance": ("allowance=0.3", "allowance=-0.5", "allowance=-0.5",
                           "non-negative fraction"),
    "probability above one": ("failure_prob=0.01", "failure_prob=1.5", "failure_prob=1.5",
                              "in (0, 1)"),
    "zero cost": ("checkpoint_cost=0.5", "checkpoint_cost=0", "checkpoint_cost=0",
                  "positive seconds"),
    "unknown keyword": ("allowance=0.3", "allowance=0.3, budget=3", "budget=3",
                        "takes keywords allowance, checkpoint_cost, failure_prob, "
                        "checkpoint_fn_name"),
    "name not a string": ('checkpoint_fn_name="checkpoint"', "checkpoint_fn_name=checkpoint",
                          "checkpoint_fn_name=checkpoint", "string literal"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_decorator_values_are_one_positioned_line(case: str) -> None:
    old, new, at, words = BAD[case]
    source = PROGRAM.replace(old, new)
    result = analyze(source, "ch.py")
    assert isinstance(result, AnalysisFailure), result
    line = source.splitlines()[result.issue.line - 1]
    assert result.issue.line in (9, 10) and words in result.issue.message, result.issue
    assert line[result.issue.column - 1:].startswith(at.split("=")[-1]) or \
        line[result.issue.column - 1:].startswith(at), (line, result.issue)


def test_a_bad_overhead_in_the_source_is_not_blamed_on_the_flag() -> None:
    source = ("from transform import _checkpoint, checkpoint_params\n"
              "checkpoint_params(overhead=-1)\nfor i in range(3):\n    _checkpoint()\n")
    result = analyze(source, "t.py")
    assert isinstance(result, AnalysisFailure)
    assert result.issue.line == 2 and "--overhead" not in result.issue.message
    assert "checkpoint_params(overhead=-1)" in result.issue.message


def test_checkhint_program_resumes_exactly(tmp_path: Path) -> None:
    (tmp_path / "checkhint.py").write_text(CHECKHINT)
    original = tmp_path / "original.py"
    original.write_text(PROGRAM)
    result = analyze(PROGRAM, str(original))
    assert isinstance(result, AnalysisSuccess)
    program = tmp_path / "train.py"
    program.write_text(generate(result, all_hints=True).code)
    env = kr.environment(tmp_path / "c")
    reference = kr.run_original(original, cwd=tmp_path, env=env)
    killed = kr.inject(program, "137", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == reference.stdout
