"""The supervisor-to-rank environment contract round-trips, and its absence means standalone."""

from __future__ import annotations

import pytest

from ecrl.contract.errors import ConfigError
from ecrl.runtime.launchenv import AttemptEnv


def test_round_trip_through_the_environment() -> None:
    env = AttemptEnv(run_dir="/r", attempt=3, resume_step=49, resume_path="step-00000049.ckpt",
                     resume_checksum="sha256:ab", fail_at=(60, 90), fail_rank=1,
                     checkpoint={"strategy": "overlapped", "ckpt_every": 10},
                     world_sizes=(2, 1), deadline=1.5)
    variables = env.to_environ()
    assert variables["ECRL_FAIL_AT"] == "60,90" and "ECRL_RESUME_STEP" in variables
    # The checkpoint settings travel under their own names, and only those given.
    assert variables["ECRL_CKPT_EVERY"] == "10" and "ECRL_KEEP_CHECKPOINTS" not in variables
    assert AttemptEnv.from_environ(variables) == env


def test_fresh_start_has_no_resume_variables() -> None:
    variables = AttemptEnv(run_dir="/r", attempt=0).to_environ()
    assert not any(k.startswith("ECRL_RESUME") for k in variables)
    back = AttemptEnv.from_environ(variables)
    assert back is not None and not back.resuming and back.fail_at == ()


def test_no_supervisor_means_standalone() -> None:
    assert AttemptEnv.from_environ({"PATH": "/bin"}) is None


def test_malformed_value_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="ECRL_ATTEMPT='x'"):
        AttemptEnv.from_environ({"ECRL_RUN_DIR": "/r", "ECRL_ATTEMPT": "x"})
