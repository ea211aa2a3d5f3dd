"""The mesh of each attempt from ``--parallel``/``--replicate``/``--tp`` (issue 31): the layouts,
the one-line refusals before launch, and how ``ecrl launch`` hands the settings to a script
(``ECRL_PARALLEL``/``ECRL_REPLICATE``/``ECRL_TP``, given > script > default)."""

from __future__ import annotations

import pytest

from ecrl.contract.errors import ConfigError
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.meshplan import plan_meshes
from ecrl.runtime.runconfig import RunConfig


def _shapes(**kw: object) -> list[tuple[int, int, int]]:
    return [(m.replicate, m.shard, m.tp) for m in plan_meshes(**kw)]  # type: ignore[arg-type]


def test_layouts_follow_the_world_size() -> None:
    # DP = W / T; hsdp keeps its shard group (fixed by the first world size) and changes the
    # number of replica groups: replicate 2 x shard 2, then 1 x 2
    assert _shapes(parallel="fsdp", replicate=1, tp=1, world_sizes=[4, 2]) == [(1, 4, 1),
                                                                              (1, 2, 1)]
    assert _shapes(parallel="hsdp", replicate=2, tp=1, world_sizes=[4, 2]) == [(2, 2, 1),
                                                                              (1, 2, 1)]
    assert _shapes(parallel="fsdp", replicate=1, tp=2, world_sizes=[4, 2]) == [(1, 2, 2),
                                                                              (1, 1, 2)]
    fsdp_tp = plan_meshes(parallel="fsdp", replicate=1, tp=2, world_sizes=[4])[0]
    assert fsdp_tp.dims() == (("dp", 2), ("tp", 2)) and fsdp_tp.dp_size == 2
    hsdp = plan_meshes(parallel="hsdp", replicate=2, tp=1, world_sizes=[4])[0]
    assert hsdp.dims() == (("dp_replicate", 2), ("dp_shard", 2))
    assert hsdp.record() == {"dp_size": 4, "tp_size": 1, "parallel": "hsdp", "replicate": 2,
                             "shard": 2}
    assert plan_meshes(parallel="ddp", replicate=1, tp=1, world_sizes=[2])[0].dims() == ()


@pytest.mark.parametrize(("settings", "message"), [
    ({"parallel": "fsdp", "tp": 2, "world_sizes": (4, 3), "global_batch": 12},
     "--tp 2 does not divide world size 3"),
    ({"parallel": "fsdp", "tp": 2, "world_sizes": (8,), "global_batch": 6},
     "global batch 6 is not divisible by the data-parallel size 4"),
    ({"parallel": "hsdp", "replicate": 2, "world_sizes": (4, 3), "global_batch": 12},
     "world size 3: its data-parallel degree 3 is not a whole number of shard groups of 2"),
    ({"parallel": "hsdp", "replicate": 3, "world_sizes": (4,)},
     "--replicate 3 does not divide"),
    ({"parallel": "fsdp", "replicate": 2, "world_sizes": (4,)}, "is for --parallel hsdp"),
    ({"parallel": "ddp", "tp": 2, "world_sizes": (4,)}, "--tp 2 needs --parallel fsdp or hsdp"),
    ({"parallel": "fsdp", "tp": 0, "world_sizes": (4,)}, "--tp must be an integer >= 1"),
    ({"parallel": "hsdp", "replicate": 2, "world_sizes": (4,), "strategy": "jit"},
     "--strategy jit with --parallel hsdp: no rank of a sharded model holds a full replica"),
])
def test_a_mesh_that_cannot_exist_is_refused_in_one_line(settings: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig(out="run", **settings)  # type: ignore[arg-type]
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_batch_is_split_over_the_data_parallel_ranks_only() -> None:
    # B = 4 at W = 8 is fine with TP 2 (DP 4), though 4 % 8 != 0
    config = RunConfig(out="run", parallel="fsdp", tp=2, world_sizes=(8, 4), global_batch=4)
    assert [m.dp_size for m in config.supervisor.meshes] == [4, 2]


def test_launch_passes_only_the_mesh_settings_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from ecrl.runtime.sampling.meshbuild import mesh_layout
    from ecrl.runtime.supervision.launcher import launch_config

    config = launch_config({"world_sizes": "4,2", "tp": 2, "parallel": "fsdp"},
                           default_out="run")
    from ecrl.contract.runformat import RunPaths
    from ecrl.runtime.supervision.command import attempt_env

    env = attempt_env(config, RunPaths.of("/tmp/run"), 0, None, [], (4, 2), None)
    variables = env.to_environ()
    assert (variables["ECRL_PARALLEL"], variables["ECRL_TP"]) == ("fsdp", "2")
    assert "ECRL_REPLICATE" not in variables  # not given: the script's own, else the default
    back = AttemptEnv.from_environ(variables)
    assert back is not None and back.mesh == {"parallel": "fsdp", "replicate": None, "tp": 2}
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    # the launch's --tp 2 wins over the script's tp=1; its --parallel over the script's hsdp
    layout = mesh_layout(parallel="hsdp", tp=1, world_size=2)
    assert (layout.parallel, layout.dp_size, layout.tp) == ("fsdp", 1, 2)
    monkeypatch.delenv("ECRL_TP")
    assert mesh_layout(tp=4, world_size=4).tp == 4  # not given: the script's argument


def test_launch_refuses_a_mesh_that_does_not_divide_a_world_size() -> None:
    from ecrl.runtime.supervision.launcher import launch_config

    with pytest.raises(ConfigError, match="--tp 2 does not divide world size 3"):
        launch_config({"world_sizes": "4,3", "tp": 2, "parallel": "fsdp"}, default_out="run")
    # --parallel not given: the script's own scheme (unknown here) is assumed to fit --tp
    with pytest.raises(ConfigError, match="--tp 2 does not divide world size 3"):
        launch_config({"world_sizes": "4,3", "tp": 2}, default_out="run")
    config = launch_config({"world_sizes": "4,2", "tp": 2}, default_out="run")
    assert "parallel" not in config.explicit and config.supervisor.meshes[1].dp_size == 1
