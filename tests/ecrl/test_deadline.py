"""ecrl.runtime.checkpoint.deadline: parsing, SLURM_JOB_END_TIME, and the buffer rule
(torch-free)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint.deadline import (
    DeadlineClock,
    DeadlineRule,
    estimate_ckpt_s,
    parse_deadline,
    resolve_deadline,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("2h", 7200), ("1.5m", 90),
])
def test_durations_count_from_now(text: str, seconds: float) -> None:
    assert parse_deadline(text, now=NOW) == NOW + seconds


def test_absolute_times() -> None:
    assert parse_deadline("@1767225600", now=NOW) == 1767225600.0
    iso = datetime(2027, 1, 15, 18, 0, tzinfo=UTC)
    assert parse_deadline("2027-01-15T18:00:00Z", now=NOW) == iso.timestamp()
    # A time of day is the next such moment.
    later = parse_deadline("18:00", now=NOW)
    assert NOW < later <= NOW + 86400


@pytest.mark.parametrize("text", ["soon", "15x", "", "-5m"])
def test_bad_deadlines_are_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--deadline .*: give a duration"):
        parse_deadline(text, now=NOW)


def test_flag_wins_over_slurm_and_slurm_is_read() -> None:
    env = {"SLURM_JOB_END_TIME": "1800000500"}
    assert resolve_deadline("60s", env, now=NOW) == NOW + 60
    assert resolve_deadline(None, env, now=NOW) == 1800000500.0
    assert resolve_deadline(None, {}, now=NOW) is None
    with pytest.raises(ConfigError, match="SLURM_JOB_END_TIME='tomorrow'"):
        resolve_deadline(None, {"SLURM_JOB_END_TIME": "tomorrow"})


def test_reserve_is_the_seed_rule() -> None:
    rule = DeadlineRule(k1=10, k2=2)
    # remaining >= max_step + max_ckpt + (k1 * max_step + k2 * max_ckpt)
    assert rule.reserve(1.0, 5.0) == 1.0 + 5.0 + 10 * 1.0 + 2 * 5.0
    with pytest.raises(ConfigError):
        DeadlineRule(k1=-1)


def test_unmeasured_checkpoints_use_the_estimate() -> None:
    clock = DeadlineClock(deadline=NOW + 100, rule=DeadlineRule(k1=0, k2=0),
                          estimated_ckpt_s=estimate_ckpt_s(10**9))
    assert clock.ckpt_s == 10.0  # 1 GB at 100 MB/s
    clock.checkpoint_took(2.0)
    assert clock.ckpt_s == 2.0


@pytest.mark.parametrize("seed", range(25))
def test_the_final_checkpoint_lands_before_the_deadline(seed: int) -> None:
    """Simulated runs: steps and checkpoints whose times vary up to the longest already seen
    (the rule's premise); whenever the rule says stop, step + save still end before the
    deadline, and it never stops while more than the reserve plus one step remained."""
    rng = random.Random(seed)
    base_step, base_ckpt = rng.uniform(0.01, 2.0), rng.uniform(0.05, 20.0)
    start = NOW
    deadline = start + rng.uniform(50, 500) * base_step + 3 * base_ckpt
    rule = DeadlineRule(k1=rng.choice([0.0, 1.0, 10.0]), k2=rng.choice([0.0, 2.0]))
    clock = DeadlineClock(deadline=deadline, rule=rule, estimated_ckpt_s=base_ckpt)
    now = start
    clock.step_done(now)
    for _ in range(100000):
        now += base_step * rng.uniform(0.5, 1.0)
        clock.step_done(now)
        if clock.should_stop(now):
            save = base_ckpt * rng.uniform(0.5, 1.0)
            assert now + save < deadline
            # Not too early: one more step would have eaten into the reserve.
            assert deadline - now < rule.reserve(clock.max_step_s, clock.ckpt_s) + 1e-9
            return
    raise AssertionError("never stopped")


@pytest.mark.parametrize("end", ["inf", "nan", "1e400"])
def test_a_slurm_job_end_time_that_is_no_finite_time_is_refused(end: str) -> None:
    with pytest.raises(ConfigError, match="not a finite time"):
        resolve_deadline(None, {"SLURM_JOB_END_TIME": end})
