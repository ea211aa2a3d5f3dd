"""One source of truth for the run flags and for ``B % W`` (issue 15, Build 6)."""

from __future__ import annotations

import ast
import inspect

import pytest

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.runtime import runconfig, settings
from ecrl.runtime.runconfig import RunConfig, load_config, run_flags


def _docs(module: object, name: str) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {a.target.id: b.value.value for a, b in zip(cls.body, cls.body[1:], strict=False)
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def test_every_flag_help_is_its_fields_docstring() -> None:
    # The settings are documented once, in their sections (settings.py).
    docs = {**_docs(runconfig, "RunConfig"), **_docs(settings, "CheckpointSettings"),
            **_docs(settings, "TrainerSettings"), **_docs(settings, "SupervisorSettings")}
    by_name = {f.name: f for f in run_flags()}
    assert set(by_name) == set(docs) - {"explicit"}
    assert by_name["global_batch"].metavar == "B"
    assert by_name["global_batch"].help == \
        "samples per step over all ranks; constant for the whole run (default 32)"
    assert by_name["rdzv_endpoint"].metavar == "HOST:PORT"
    assert by_name["steps"].help == "committed steps to reach (default 200 unless --epochs is " \
                                    "given)"
    assert by_name["log_ids"].kind == "bool" and by_name["fail_at"].kind == "ints"
    assert by_name["lr"].kind == "float" and by_name["threads"].kind == "int"


def test_every_flag_reaches_its_field() -> None:
    values = {"int": 3, "float": 0.5, "str": "x", "ints": "1", "bool": True}
    for flag in run_flags():
        given = {flag.name: values[flag.kind]}
        try:
            config = load_config(given, config_file=None, default_out="out")
        except ConfigError:
            continue  # some values are invalid for some fields; the wiring is what matters
        assert flag.name in config.explicit


@pytest.mark.parametrize(("batch", "world"), [(10, 3), (8, 3), (6, 4)])
def test_b_mod_w_has_one_check_and_one_message(batch: int, world: int) -> None:
    with pytest.raises(SemanticsError) as standard:
        semantics.local_batch(batch, world)
    with pytest.raises(SemanticsError) as geometry:
        semantics.Geometry(dataset_size=100, global_batch=batch).local_batch(world)
    with pytest.raises(ConfigError) as config:
        RunConfig(out="x", global_batch=batch, world_sizes=(1, world))
    assert str(geometry.value) == str(standard.value)
    assert str(config.value) == f"--global-batch/--world-sizes: {standard.value}"
