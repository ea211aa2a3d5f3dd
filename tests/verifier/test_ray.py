"""``--ray``: the scan as Ray tasks gives the report of one process; without Ray, one line."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import pytest

from verifier import render_json, render_junit, verify
from verifier._mutations import CATALOGUE, apply
from verifier._testing.generate import RunSpec, generate_run
from verifier.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"


def test_without_ray_the_flag_is_one_line_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "ray" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code = main([str(FIXTURES / "pass-hash-only"), "--ray"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.splitlines() == [
        "ecrl-verify: error: --ray needs Ray, which is not installed: pip install 'ecrl[ray]'"]


@pytest.mark.slow  # starting a local Ray costs about 8 s (docs/benchmarks.md)
def test_local_ray_with_two_workers_gives_the_same_reports(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from verifier._ray import LOCAL, ray_workers

    spec = RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 1, 4),
                   fail_at=(12, 27), ckpt_every=5, strategy="overlapped", log_ids=True, chaos=3)
    base = generate_run(spec, tmp_path / "run").root
    runs = [FIXTURES / name for name in sorted(p.name for p in FIXTURES.iterdir())]
    for i, mutation in enumerate(CATALOGUE):
        target = tmp_path / f"m{i}"
        if apply(mutation, base, target, random.Random(i)) is not None:
            runs.append(target)
    with ray_workers(LOCAL, jobs=2) as submit:
        import ray

        assert ray.cluster_resources().get("CPU") == 2
        for run in runs:
            alone, remote = verify(run), verify(run, submit=submit)
            assert render_json(remote) == render_json(alone), run
            assert render_junit(remote) == render_junit(alone), run
