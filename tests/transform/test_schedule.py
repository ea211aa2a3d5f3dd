"""The fast schedulers equal CheckHint's recurrence (the naive oracle) on random instances."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from transform import schedule as s
from transform._testing.naive import naive_budget, naive_penalized
from transform.errors import ScheduleError

REL = 1e-9

# Small integer-ish times make ties common (equal blocks, zero-length tasks).
tie_times = st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0]), min_size=1, max_size=24)
real_times = st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=24)
hazards = st.sampled_from([1e-4, 0.01, 0.1, 1.0, 20.0])


def close(x: float, y: float) -> bool:
    if math.isinf(x) or math.isinf(y):
        return x == y
    return math.isclose(x, y, rel_tol=REL, abs_tol=1e-12)


def same_objective(fast: s.FlatSolution, oracle: s.FlatSolution) -> bool:
    if math.isfinite(oracle.value) and math.isfinite(fast.value):
        return close(fast.value, oracle.value)
    return math.isclose(fast.log_value, oracle.log_value, rel_tol=REL, abs_tol=1e-9)


def all_optima(times: list[float], budget: int, a: float) -> list[tuple[int, ...]]:
    n = len(times)
    k = min(budget, n - 1)
    scored = [(s.evaluate(times, cuts, a)[1], cuts)
              for cuts in itertools.combinations(range(1, n), k)]
    best = min(v for v, _ in scored)
    return [c for v, c in scored if math.isclose(v, best, rel_tol=1e-12, abs_tol=1e-12)]


@given(st.one_of(tie_times, real_times), st.integers(0, 30), hazards)
def test_budget_equals_naive_recurrence(times: list[float], budget: int, a: float) -> None:
    fast = s.solve_budget(times, budget, a)
    oracle = naive_budget(times, budget, a)
    assert len(fast.cuts) == min(budget, len(times) - 1)  # budgets ≥ n: every hint
    assert list(fast.cuts) == sorted(set(fast.cuts))
    assert all(1 <= c < len(times) for c in fast.cuts)
    assert same_objective(fast, oracle), (fast, oracle)


@given(st.lists(st.floats(0.1, 9.0), min_size=2, max_size=10), st.integers(1, 9),
       st.sampled_from([0.01, 0.3]))
def test_budget_chooses_the_unique_optimum(times: list[float], budget: int, a: float) -> None:
    optima = all_optima(times, budget, a)
    assume(len(optima) == 1)
    assert s.solve_budget(times, budget, a).cuts == optima[0]


@given(st.one_of(tie_times, real_times), st.data(), hazards)
def test_penalized_equals_naive(times: list[float], data: st.DataObject, a: float) -> None:
    costs = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 7.0, 100.0]),
                               min_size=len(times) - 1, max_size=len(times) - 1))
    fast = s.solve_penalized(times, costs, a)
    oracle = naive_penalized(times, costs, a)

    def total(sol: s.FlatSolution) -> float:
        return sol.value + sum(costs[c - 1] for c in sol.cuts)

    assert close(total(fast), total(oracle)), (fast, oracle)


@given(st.integers(1, 60), st.sampled_from([0.0, 0.5, 4.0, 30.0]),
       st.sampled_from([0.0, 1.0, 2.5]), st.sampled_from([0.0, 2.0, 45.0]),
       st.integers(0, 70), st.sampled_from([0.001, 0.05, 0.5]))
def test_loop_solution_equals_dp_on_unrolled_loop(count: int, pre: float, period: float,
                                                  post: float, budget: int, a: float) -> None:
    run = s.solve_run(pre=pre, period=period, count=count, post=post, budget=budget, a=a)
    unrolled = [pre, *([period] * (count - 1)), post]
    oracle = naive_budget(unrolled, budget, a)
    cuts = run.occurrences()
    assert len(cuts) == run.cuts == min(budget, count)
    assert all(run.fires_at(i) == (i in cuts) for i in range(count + 2))
    value, log_value = s.evaluate(unrolled, cuts, a)
    assert close(value, oracle.value) and close(run.value, oracle.value)
    assert math.isclose(run.log_value, log_value, rel_tol=1e-9, abs_tol=1e-9)


@given(st.integers(1, 40), st.sampled_from([0.0, 3.0]), st.sampled_from([0.5, 2.0]),
       st.sampled_from([0.0, 9.0]), st.sampled_from([0.0, 0.2, 3.0, 50.0]))
def test_loop_with_checkpoint_cost_equals_unrolled(count: int, pre: float, period: float,
                                                   post: float, cost: float) -> None:
    a = 0.05
    run = s.solve_run_penalized(pre=pre, period=period, count=count, post=post, ckpt_cost=cost,
                                a=a)
    unrolled = [pre, *([period] * (count - 1)), post]
    oracle = naive_penalized(unrolled, [cost] * count, a)
    assert close(run.value + cost * run.cuts, oracle.value + cost * len(oracle.cuts))


def test_huge_blocks_stay_finite_in_log_space() -> None:
    times = [5000.0, 7000.0, 100.0, 9000.0, 3000.0]
    a = 1.0  # blocks thousands of MTBFs long: expm1 overflows
    fast = s.solve_budget(times, 2, a)
    oracle = naive_budget(times, 2, a)
    assert math.isinf(fast.value) and math.isfinite(fast.log_value)
    assert fast.method == "layered-log"
    # The longest block swamps every other one: the best schedule makes it as short as can be.
    assert math.isclose(fast.log_value, oracle.log_value, rel_tol=1e-12)
    assert fast.cuts == (2, 4)


def test_billion_iterations_without_unrolling() -> None:
    run = s.solve_run(pre=5.0, period=0.3, count=10**9, post=3.0, budget=1000, a=1 / 86400)
    assert run.cuts == 1000
    sizes = np.diff(run.occurrences())
    assert sizes.max() - sizes.min() <= 1  # balanced between the first and the last
    assert run.fires_at(run.first) and run.fires_at(run.last) and not run.fires_at(run.last + 1)


def test_larger_instance_uses_divide_and_conquer_and_matches_layered() -> None:
    rng = np.random.default_rng(7)
    times = rng.random(3000) * 4 + 0.1
    fast = s.solve_budget(times, 17, 1e-3)
    arr, prefix = s._prefix(times)
    layered = s._layered(arr, prefix, 17, 1e-3, log_space=False)
    assert close(fast.value, layered.value)


def test_budget_formula_and_parameter_errors() -> None:
    assert s.checkpoint_budget(total_time=1000.0, overhead=0.05, ckpt_cost=10.0) == 5
    assert s.checkpoint_budget(total_time=1001.0, overhead=0.05, ckpt_cost=10.0) == 6
    assert math.isclose(s.hazard(mtbf=100.0), 0.01)
    assert math.isclose(s.hazard(failure_rate=0.01), -math.log(0.99))
    with pytest.raises(ScheduleError):
        s.hazard(failure_rate=1.5)
    with pytest.raises(ScheduleError):
        s.solve_budget([1.0, -2.0], 1, 0.1)


@pytest.mark.slow
@given(st.lists(st.floats(0.0, 100.0), min_size=30, max_size=120), st.integers(0, 130), hazards)
def test_budget_equals_naive_on_longer_timelines(times: list[float], budget: int,
                                                 a: float) -> None:
    assert same_objective(s.solve_budget(times, budget, a), naive_budget(times, budget, a))
