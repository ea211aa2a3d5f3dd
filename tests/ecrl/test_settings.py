"""One home per checkpoint setting, and its precedence: a flag given > the script's argument >
the default (ecrl/runtime/settings.py; docs/library.md, "Settings")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from ecrl.contract import runformat, strategies
from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint.registry import strategy_names
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.runconfig import LAUNCH_KEYS, RunConfig, launch_flags, load_config, run_flags
from ecrl.runtime.settings import (
    DEFAULTS,
    SETTINGS_FILE,
    CheckpointSettings,
    ResolvedCheckpoint,
    checkpoint_fields,
    resolve_checkpoint,
    script_values,
)
from ecrl.runtime.supervision.launcher import LaunchSupervisor, launch_config

# Per setting: a value the user gives the supervisor, and another the script gives its
# Checkpointer; both differ from the default.
FLAG_AND_SCRIPT: dict[str, tuple[Any, Any]] = {
    "strategy": ("blocking", "jit"),
    "ckpt_every": (5, 8),
    "max_inflight": (3, 4),
    "keep_checkpoints": (5, 3),
    "deadline_k_step": (4.0, 6.0),
    "deadline_k_ckpt": (1.0, 3.0),
    "hang_timeout_s": (45.0, 90.0),
}
# The Checkpointer's shorthand keyword for each field, where it has one.
SHORTHAND = {"ckpt_every": "every", "keep_checkpoints": "keep", "hang_timeout_s": "hang_timeout",
             "strategy": "strategy", "max_inflight": "max_inflight"}


def test_every_checkpoint_setting_is_covered() -> None:
    assert set(FLAG_AND_SCRIPT) == set(checkpoint_fields())
    for name, (flag, script) in FLAG_AND_SCRIPT.items():
        default = getattr(DEFAULTS, name)
        assert flag != default and script != default and flag != script


def _ranks_see(**flags: Any) -> AttemptEnv:
    """The environment a rank gets when the user gave ``ecrl launch`` these flags."""
    config = launch_config({"out": "o", **flags}, default_out="o")
    env = AttemptEnv(run_dir="/r", attempt=0, checkpoint=config.checkpoint_given)
    back = AttemptEnv.from_environ(env.to_environ())
    assert back is not None
    return back


@pytest.mark.parametrize("name", sorted(FLAG_AND_SCRIPT))
def test_a_flag_given_wins_over_the_script(name: str) -> None:
    flag, script = FLAG_AND_SCRIPT[name]
    resolved = resolve_checkpoint(flags=_ranks_see(**{name: flag}).checkpoint,
                                  script={name: script})
    assert getattr(resolved.settings, name) == flag and resolved.source(name) == "flag"


@pytest.mark.parametrize("name", sorted(FLAG_AND_SCRIPT))
def test_the_script_wins_over_the_default_when_no_flag_is_given(name: str) -> None:
    _, script = FLAG_AND_SCRIPT[name]
    env = _ranks_see()  # the user gave no checkpoint flag
    assert env.checkpoint == {}
    resolved = resolve_checkpoint(flags=env.checkpoint, script={name: script})
    assert getattr(resolved.settings, name) == script and resolved.source(name) == "script"


@pytest.mark.parametrize("name", sorted(FLAG_AND_SCRIPT))
def test_the_default_when_neither_gives_it(name: str) -> None:
    other = next(n for n in FLAG_AND_SCRIPT if n != name)
    resolved = resolve_checkpoint(flags=_ranks_see(**{other: FLAG_AND_SCRIPT[other][0]}).checkpoint,
                                  script={other: FLAG_AND_SCRIPT[other][1]})
    assert getattr(resolved.settings, name) == getattr(DEFAULTS, name)
    assert resolved.source(name) == "default"


@pytest.mark.parametrize("name", sorted(SHORTHAND))
def test_the_checkpointers_shorthands_and_section_name_the_same_setting(name: str) -> None:
    _, script = FLAG_AND_SCRIPT[name]
    assert script_values(**{name: script}) == {name: script}
    section = CheckpointSettings(**{name: script})
    assert script_values(section) == {name: script}
    with pytest.raises(ConfigError, match="given twice"):
        script_values(section, **{name: FLAG_AND_SCRIPT[name][0]})


def test_defaults_live_in_one_place() -> None:
    # ecrl run's fields, the launch flags and the Checkpointer share CheckpointSettings' defaults.
    run = RunConfig(out="o")
    for name in checkpoint_fields():
        assert getattr(run, name) == getattr(DEFAULTS, name)
    assert run.checkpoint == DEFAULTS and run.checkpoint_given == {}
    assert [f.name for f in fields(CheckpointSettings)] == list(checkpoint_fields())


def test_config_file_values_count_as_given(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('ckpt-every = 7\nstrategy = "blocking"\n')
    config = load_config({"strategy": None, "keep_checkpoints": 4}, config_file=str(toml),
                         default_out="o")
    assert config.checkpoint_given == {"ckpt_every": 7, "strategy": "blocking",
                                       "keep_checkpoints": 4}


def test_bad_values_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--ckpt-every must be an integer >= 0"):
        CheckpointSettings(ckpt_every=-1)
    with pytest.raises(ConfigError, match="--strategy 'async' is unknown"):
        CheckpointSettings(strategy="async")
    with pytest.raises(ConfigError, match="--hang-timeout-s must be a number >= 0"):
        CheckpointSettings(hang_timeout_s=-1.0)
    with pytest.raises(ConfigError, match="--keep-checkpoints must be an integer >= 2"):
        resolve_checkpoint(flags={}, script={"keep_checkpoints": 1})


def _supervisor(out: Path, program: tuple[str, ...], **flags: object) -> LaunchSupervisor:
    config = launch_config({"out": str(out), **flags}, default_out=str(out))
    return LaunchSupervisor(config, name="launch", program=program)


@pytest.fixture
def opened() -> Iterator[list[LaunchSupervisor]]:
    sups: list[LaunchSupervisor] = []
    yield sups
    for sup in sups:
        if sup._lock is not None:
            sup._lock.close()


def _open(sups: list[LaunchSupervisor], sup: LaunchSupervisor) -> LaunchSupervisor:
    sups.append(sup)
    assert sup._open_run()
    sup._lock.close()  # type: ignore[union-attr]  # as if that supervisor had ended
    sup._lock = None
    return sup


def test_the_supervisor_passes_only_the_flags_given(tmp_path: Path,
                                                    opened: list[LaunchSupervisor]) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    sup = _open(opened, _supervisor(tmp_path / "a", (str(script),), ckpt_every=5))
    variables = sup._attempt_env(0, None, []).to_environ()
    assert variables["ECRL_CKPT_EVERY"] == "5"
    assert not {"ECRL_STRATEGY", "ECRL_KEEP_CHECKPOINTS", "ECRL_MAX_INFLIGHT",
                "ECRL_HANG_TIMEOUT_S"} & set(variables)
    # A continuation without flags passes on what the launch was given, and only that.
    again = _open(opened, _supervisor(tmp_path / "a", ()))
    assert again._attempt_env(1, None, []).checkpoint == {"ckpt_every": 5}
    # A run launched without --ckpt-every may be continued with one: the script's was in effect.
    _open(opened, _supervisor(tmp_path / "b", (str(script),)))
    later = _open(opened, _supervisor(tmp_path / "b", (), ckpt_every=3))
    assert later._attempt_env(1, None, []).checkpoint == {"ckpt_every": 3}


def test_the_record_of_the_settings_in_effect_round_trips() -> None:
    resolved = resolve_checkpoint(flags={"strategy": "blocking"}, script={"ckpt_every": 8})
    back = ResolvedCheckpoint.from_record(json.loads(json.dumps(resolved.record())))
    assert back == resolved
    assert back.describe() == "checkpoint every 8 steps (script), strategy blocking (flag)"
    assert ResolvedCheckpoint.from_record({"schema_version": 99}) is None


def test_a_checkpointer_under_the_supervisor_resolves_and_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import ecrl
    from ecrl.runtime import _attempt
    from ecrl.runtime.supervision.summary import checkpoint_settings

    env = AttemptEnv(run_dir=str(tmp_path), attempt=0,
                     checkpoint=launch_config({"out": "o", "ckpt_every": 5},
                                              default_out="o").checkpoint_given)
    for key, value in env.to_environ().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    _attempt._CACHE.clear()
    try:
        model = torch.nn.Linear(2, 2)
        ckpt = ecrl.Checkpointer({"model": model}, every=8, keep=3)
        assert (ckpt.every, ckpt.keep, ckpt.strategy_name) == (5, 3, DEFAULTS.strategy)
        assert ckpt.restore() == 0
        ckpt.close()
    finally:
        _attempt._CACHE.clear()
    recorded = json.loads((tmp_path / "logs" / "attempt-000" / SETTINGS_FILE).read_text())
    assert recorded["settings"]["ckpt_every"] == {"value": 5, "source": "flag"}
    assert recorded["settings"]["keep_checkpoints"] == {"value": 3, "source": "script"}
    assert recorded["settings"]["strategy"]["source"] == "default"
    found = checkpoint_settings(runformat.RunPaths.of(tmp_path), [0])
    assert found is not None and found.settings.ckpt_every == 5


def test_strategy_names_come_from_one_table() -> None:
    assert strategy_names() == strategies.STRATEGIES
    # runformat keeps its own copy until it imports the contract's table (see the report).
    assert runformat.STRATEGIES == strategies.STRATEGIES
    for flags in (run_flags(), launch_flags()):
        help_text = next(f.help for f in flags if f.name == "strategy")
        assert strategies.describe(strategy_names()) in help_text


def test_launch_flags_are_run_flags() -> None:
    run = {f.name: f for f in run_flags()}
    launch = launch_flags()
    assert [f.name for f in launch] == list(LAUNCH_KEYS)
    for f in launch:
        assert (f.flag, f.kind, f.metavar) == (run[f.name].flag, run[f.name].kind,
                                               run[f.name].metavar)


def test_launch_help_says_whose_default_applies() -> None:
    out = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "launch", "--help"],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "(default: the script's Checkpointer argument, else 50)" in text
    assert strategies.describe(strategy_names()) in text
