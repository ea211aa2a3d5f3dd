"""`ecrl advise` against the figures the seed papers print and the models' own identities."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecrl.apps.advise import SECONDS_PER_DAY, AdviceInput, advise
from ecrl.contract.errors import ConfigError


def bert(gpus: int) -> AdviceInput:
    # Seed 004 §6.5: BERT-L-PT, o = 5 s, r = 9.9 s, f = 2e-3 failures per GPU per day.
    return AdviceInput(ckpt_cost=5.0, restore_cost=9.9, step_time=1.0,
                       gpu_failure_rate=2e-3 / SECONDS_PER_DAY, gpus=gpus, overhead=0.05,
                       job_seconds=86_400.0)


def test_matches_the_jit_papers_table() -> None:
    # "for N = 1024, the optimal checkpointing frequency is 5.54 times every hour"
    big = advise(bert(1024))
    assert big.c_star_per_hour == pytest.approx(5.54, abs=0.01)
    # w_f* = 1.53% at N = 1024 and 0.1% at N = 4 (the paper rounds its constants)
    assert big.periodic_wasted_fraction == pytest.approx(0.0153, abs=0.0002)
    assert advise(bert(4)).periodic_wasted_fraction == pytest.approx(0.001, abs=0.0002)
    # just-in-time checkpointing wastes far less at scale
    assert big.jit_wasted_fraction < big.periodic_wasted_fraction / 10


rates = st.floats(1e-9, 1e-3)
costs = st.floats(1e-3, 1e3)


@given(costs, rates, st.integers(1, 100_000))
def test_young_is_the_inverse_of_the_optimal_frequency(o: float, f: float, n: int) -> None:
    advice = advise(AdviceInput(ckpt_cost=o, restore_cost=0.0, step_time=1.0,
                                gpu_failure_rate=f, gpus=n, overhead=0.1, job_seconds=3600.0))
    assert advice.young_interval_s == pytest.approx(3600.0 / advice.c_star_per_hour, rel=1e-9)
    # Daly's correction is small while the checkpoint is cheap relative to the MTBF
    if o < 0.01 * advice.job_mtbf_s:
        assert advice.daly_interval_s == pytest.approx(advice.young_interval_s, rel=0.1)
    assert 0 <= advice.jit_wasted_fraction < 1 and 0 <= advice.periodic_wasted_fraction < 1


def test_daly_falls_back_to_the_mtbf_for_huge_checkpoints() -> None:
    advice = advise(AdviceInput(ckpt_cost=10_000.0, restore_cost=0.0, step_time=1.0,
                                gpu_failure_rate=1 / 1000.0, gpus=1, overhead=0.1,
                                job_seconds=3600.0))
    assert advice.daly_interval_s == pytest.approx(1000.0)


def test_checkhint_budget() -> None:
    advice = advise(bert(8))
    assert advice.checkhint_budget == math.ceil(0.05 * 86_400 / 5)


@pytest.mark.parametrize("field,value", [("ckpt_cost", 0.0), ("step_time", -1.0),
                                         ("gpus", 0), ("overhead", 1.5),
                                         ("restore_cost", float("nan"))])
def test_bad_input(field: str, value: float) -> None:
    kwargs = dict(ckpt_cost=5.0, restore_cost=1.0, step_time=1.0, gpu_failure_rate=1e-6,
                  gpus=8, overhead=0.05, job_seconds=3600.0) | {field: value}
    with pytest.raises(ConfigError):
        AdviceInput(**kwargs)  # type: ignore[arg-type]


def test_cli_json_keys_and_errors() -> None:
    out = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "advise", "--ckpt-cost", "5",
                          "--step-time", "0.5", "--failures-per-gpu-day", "0.002", "--gpus", "64",
                          "--format", "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    keys = {"young_interval_s", "daly_interval_s", "periodic", "jit", "checkhint_budget"}
    assert keys <= set(data)
    assert {"c_star_per_hour", "wasted_fraction"} <= set(data["periodic"])
    assert "wasted_fraction" in data["jit"]
    bad = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "advise", "--ckpt-cost", "-5",
                          "--step-time", "1", "--mtbf", "100"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.count("\n") == 1 and "--ckpt-cost" in bad.stderr
