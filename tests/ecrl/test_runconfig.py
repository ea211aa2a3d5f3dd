"""Run configuration: TOML and flags, precedence, and one-line errors naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecrl.contract.errors import ConfigError
from ecrl.runtime.runconfig import RunConfig, load_config


def test_flags_override_toml_override_defaults(tmp_path: Path) -> None:
    toml = tmp_path / "job.toml"
    toml.write_text('[run]\nglobal-batch = 64\nworld_sizes = [2, 1]\nstrategy = "blocking"\n'
                    'out = "runs/a"\nfail-at = "5,9"\n')
    config = load_config({"strategy": "overlapped", "seed": None}, config_file=str(toml),
                         default_out="ignored")
    assert config.global_batch == 64 and config.world_sizes == (2, 1)
    assert config.strategy == "overlapped"  # the flag wins
    assert config.fail_at == (5, 9) and config.seed == 0
    assert config.out == str(tmp_path / "runs/a")  # relative to the config file
    assert {"global_batch", "world_sizes", "strategy", "out", "fail_at"} <= config.explicit
    assert load_config({}, config_file=None, default_out="runs/x").out == "runs/x"


@pytest.mark.parametrize(("text", "message"), [
    ("globl_batch = 3\n", "unknown key 'globl_batch'"),
    ("global-batch = \n", "not valid TOML"),
    ('global-batch = "8"\n', "--global-batch must be an integer"),
    ("log-ids = 1\n", "--log-ids must be true or false"),
    ('seed = 1\n[other]\nx = 1\n', None),
])
def test_toml_errors(tmp_path: Path, text: str, message: str | None) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(text)
    if message is None:
        with pytest.raises(ConfigError, match="unknown key 'other'"):
            load_config({}, config_file=str(toml), default_out="o")
        return
    with pytest.raises(ConfigError, match=message):
        load_config({}, config_file=str(toml), default_out="o")


@pytest.mark.parametrize(("fields", "message"), [
    ({"global_batch": 10, "world_sizes": (2, 3)}, "not divisible by world size 3"),
    ({"model": "resnet34"}, "--model 'resnet34' is unknown"),
    ({"strategy": "async"}, "--strategy 'async' is unknown"),
    ({"dataset": "mnist"}, "--dataset 'mnist' is unknown"),
    ({"dataset": "cifar10", "dataset_size": 10}, "--dataset-size is only for the fake"),
    ({"keep_checkpoints": 1}, "--keep-checkpoints must be an integer >= 2"),
    ({"steps": 5, "epochs": 1}, "--steps or --epochs"),
    ({"fail_rank": 2, "world_sizes": (2, 1)}, "--fail-rank 2 does not exist"),
    ({"fail_rank": 1, "world_sizes": (2, 1), "fail_at": (3, 6)},
     "--fail-rank 1 does not exist in attempt 1, which injects failure 2 of --fail-at"),
    ({"nnodes": 2, "world_sizes": (4,)}, "--rdzv-endpoint"),
])
def test_validation(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        RunConfig(out="o", **fields)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_a_failure_rank_needs_to_exist_only_where_the_failure_is_planned() -> None:
    """--fail-rank 1 with --world-sizes 2,1: the one planned failure ends attempt 0, at world
    size 2; it was refused because attempt 1 has one rank (issue 25, item 8)."""
    config = RunConfig(out="o", fail_rank=1, world_sizes=(2, 1), fail_at=(5,))
    assert config.fail_rank == 1


def test_target_steps_and_failures_inside_the_run() -> None:
    config = RunConfig(out="o", global_batch=32, epochs=2, fail_at=(10,))
    assert config.target_steps(1000) == 2 * 31
    with pytest.raises(ConfigError, match="could never fire"):
        RunConfig(out="o", steps=10, fail_at=(3, 10)).target_steps(1000)
    with pytest.raises(ConfigError, match="larger than the dataset"):
        RunConfig(out="o", global_batch=64).target_steps(10)
    assert RunConfig(out="o", strategy="none", ckpt_every=5).effective_ckpt_every == 0
    assert RunConfig(out="o", fail_at=(1, 2)).effective_max_restarts == 5
