"""``run.json``'s one builder and one same-run check (ecrl.runtime.manifest)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ecrl import __version__
from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError
from ecrl.runtime.manifest import RUN_FIELDS, STREAM_FIELDS, build_manifest, check_same_run


def _manifest(**changes: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = dict(
        seed=1, dataset="fake", dataset_size=64, global_batch=8, steps_per_epoch=8,
        target_steps=20, log_ids=True, model="tiny-cnn", strategy="blocking", ckpt_every=4,
        fail_at=[9, 3, 9], world_sizes=[2, 1], extra={"config": {"lr": 0.1}})
    values.update(changes)
    return build_manifest(**values)  # type: ignore[arg-type]


def test_the_builder_stamps_permutation_version_and_sorted_failures() -> None:
    m = _manifest()
    assert m.permutation == {"algorithm": semantics.PERMUTATION_ALGORITHM,
                             "version": semantics.PERMUTATION_VERSION}
    assert m.fail_at == [3, 9] and m.dataset == {"name": "fake", "size": 64}
    assert m.extra["ecrl_version"] == __version__ and m.extra["config"] == {"lr": 0.1}


def test_the_same_run_passes_and_strategy_may_change() -> None:
    check_same_run(_manifest(), _manifest(strategy="jit"), where="run.json", fields=RUN_FIELDS,
                   planned_by="the settings given have", fresh="a new --out")


@pytest.mark.parametrize(("change", "field", "flags", "words"), [
    ({"global_batch": 16}, RUN_FIELDS, True, "global_batch 8, the settings given have 16 "
                                              "(--global-batch)"),
    ({"extra": {"config": {"lr": 0.2}}}, RUN_FIELDS, True, "lr 0.1, the settings given have 0.2"),
    ({"seed": 9}, STREAM_FIELDS, False, "seed 1, the settings given have 9: continue"),
    # a continued `ecrl run` with another mesh (run.json's meshes would no longer describe it)
    ({"meshes": [{"dp_size": 1, "tp_size": 2}]}, RUN_FIELDS, True,
     'meshes null, the settings given have [{"dp_size": 1, "tp_size": 2}] '
     "(--parallel/--replicate/--tp)"),
])
def test_a_difference_is_one_line_naming_field_values_and_way_out(
        change: dict[str, object], field: tuple[str, ...], flags: bool, words: str) -> None:
    with pytest.raises(ConfigError, match="a new --out") as info:
        check_same_run(_manifest(), _manifest(**change), where="R/run.json", fields=field,
                       planned_by="the settings given have", fresh="a new --out", flags=flags)
    assert str(info.value).startswith("R/run.json describes a run with ")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_setting_an_old_run_never_recorded_is_not_compared() -> None:
    old = _manifest()
    old = replace(old, extra={"ecrl_version": "0", "rng": old.extra["rng"]})
    check_same_run(old, _manifest(), where="run.json", fields=RUN_FIELDS, planned_by="x",
                   fresh="y")


def test_the_rng_policy_is_recorded_and_a_run_with_another_one_is_not_continued() -> None:
    assert _manifest().extra["rng"] == {"policy": "per-step", "version": 1}
    old = _manifest()
    old = replace(old, extra={k: v for k, v in old.extra.items() if k != "rng"})
    for fields in (RUN_FIELDS, STREAM_FIELDS):
        with pytest.raises(ConfigError, match=re.escape('rng null, x {"policy": "per-step"')):
            check_same_run(old, _manifest(), where="run.json", fields=fields, planned_by="x",
                           fresh="y")


def test_an_external_sampler_is_another_stream() -> None:
    with pytest.raises(ConfigError, match='sampler "ecrl", this script has "external"'):
        check_same_run(_manifest(), _manifest(sampler={"kind": "external", "name": "D"}),
                       where="run.json", fields=STREAM_FIELDS, planned_by="this script has",
                       fresh="a new run directory", flags=False)
