"""The typed plan between codegen and runtime: round trip; another version refused in one line."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import killresume as kr
import pytest

from transform.analysis import AnalysisSuccess, analyze
from transform.codegen import generate
from transform.planspec import PLAN_VERSION, Plan, PlanError, SlotRule

SOURCE = textwrap.dedent("""
    from transform import _checkpoint

    def train(steps):
        total = 0
        for i in range(steps):
            _iterations: 10
            total += i
            _checkpoint()
        return total

    print(train(10))
""")


def _generated(tmp_path: Path) -> tuple[str, dict[str, object]]:
    result = analyze(SOURCE, str(tmp_path / "train_src.py"))
    assert isinstance(result, AnalysisSuccess)
    gen = generate(result, all_hints=True)
    return gen.code, gen.plan


def _literal_in(code: str) -> dict[str, object]:
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and len(node.value.args) == 2:
            value = ast.literal_eval(node.value.args[1])
            assert isinstance(value, dict)
            return value
    raise AssertionError("no plan in the generated program")


def test_the_emitted_literal_is_the_typed_plan(tmp_path: Path) -> None:
    code, plan = _generated(tmp_path)
    literal = _literal_in(code)
    assert literal == plan
    typed = Plan.from_literal(literal)
    assert typed.version == PLAN_VERSION
    assert typed.original == "train_src.py"
    assert typed.to_literal() == literal
    assert [h.save for h in typed.hints.values()] == [("steps", "total")]


def test_slot_rules_fire_as_the_schedule_said() -> None:
    rule = SlotRule(kind="occurrences", total=10, count=2, occurrences=frozenset({3, 7}))
    assert [k for k in range(1, 11) if rule.fires(k)] == [3, 7]
    # Past the modelled count, the average spacing (10 / 2).
    assert [k for k in range(11, 31) if rule.fires(k)] == [15, 20, 25, 30]
    with pytest.raises(PlanError):
        SlotRule(kind="sometimes", total=1, count=1)


def test_a_plan_of_another_version_is_refused_in_one_line(tmp_path: Path) -> None:
    code, _ = _generated(tmp_path)
    program = tmp_path / "train.py"
    program.write_text(code.replace(f"{{'version': {PLAN_VERSION},", "{'version': 1,", 1))
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path,
                          env=kr.environment(tmp_path / "ckpt"), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"ecrl-transform: {program}: the program was written for runtime plan version 1, this "
        f"runtime reads version {PLAN_VERSION}; transform the original program again with the "
        "installed ecrl-transform"]
