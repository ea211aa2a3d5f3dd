"""The trainer and supervisor sections of a run (ecrl.runtime.settings), like the checkpoint's."""

from __future__ import annotations

from dataclasses import fields

import pytest

from ecrl.contract.errors import ConfigError
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.settings import (
    SUPERVISOR_DEFAULTS,
    TRAINER_DEFAULTS,
    CheckpointSettings,
    SupervisorSettings,
    TrainerSettings,
    field_docs,
)

SECTIONS = (TrainerSettings, SupervisorSettings, CheckpointSettings)


def test_every_run_setting_has_one_section_and_one_default() -> None:
    run = {f.name: f.default for f in fields(RunConfig)}
    homes = [f.name for section in SECTIONS for f in fields(section)]
    assert len(homes) == len(set(homes))
    assert set(homes) == set(run) - {"out", "explicit"}
    for section in (TrainerSettings, SupervisorSettings):
        defaults = section()
        assert set(field_docs(section)) == {f.name for f in fields(section)}
        for f in fields(section):
            assert run[f.name] == getattr(defaults, f.name), f.name


def test_a_run_hands_out_its_sections() -> None:
    config = RunConfig(out="r", world_sizes=(2, 1), fail_at=(3,), model="resnet18", lr=0.1,
                       nnodes=1, threads=2)
    assert config.supervisor == SupervisorSettings(world_sizes=(2, 1), fail_at=(3,))
    assert config.trainer == TrainerSettings(model="resnet18", lr=0.1, threads=2)
    assert config.supervisor.effective_max_restarts == config.effective_max_restarts == 4
    assert config.trainer.threads_per_rank(8) == 2
    assert TRAINER_DEFAULTS.fake_size() == 4096 and SUPERVISOR_DEFAULTS.world_sizes == (1,)


@pytest.mark.parametrize(("section", "values", "message"), [
    (TrainerSettings, {"model": "vgg"}, "--model 'vgg' is unknown"),
    (TrainerSettings, {"steps": 5, "epochs": 1}, "give --steps or --epochs, not both"),
    (TrainerSettings, {"global_batch": 0}, "--global-batch must be an integer >= 1, got 0"),
    (SupervisorSettings, {"world_sizes": (2,), "fail_rank": 2}, "--fail-rank 2 does not exist"),
    (SupervisorSettings, {"nnodes": 2, "world_sizes": (2,)}, "--nnodes > 1 needs --rdzv-endpoint"),
])
def test_each_section_checks_its_settings(section: type, values: dict[str, object],
                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        section(**values)


def test_what_ties_sections_together_is_checked_by_the_run() -> None:
    with pytest.raises(ConfigError, match="--global-batch/--world-sizes"):
        RunConfig(out="r", global_batch=32, world_sizes=(3,))
