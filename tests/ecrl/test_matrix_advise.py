"""`ecrl advise --from-run / --from-matrix`: measured inputs into the existing models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecrl.apps.advise import AdviceInput, advise
from ecrl.apps.cli import main
from ecrl.apps.matrix import measure_run
from ecrl.apps.matrix._advice import Overrides, from_matrix, from_run
from ecrl.contract.errors import ConfigError
from verifier import verify_run
from verifier._testing.generate import RunSpec, generate_run

RATE = 1.0 / 7200.0


def _flags(**changes: object) -> Overrides:
    values: dict[str, object] = dict(ckpt_cost=None, restore_cost=None, step_time=None,
                                     gpu_failure_rate=RATE, gpus=None, overhead=0.05,
                                     job_seconds=86_400.0)
    values.update(changes)
    return Overrides(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("advise") / "run"
    generate_run(RunSpec(fail_at=(10,), target_steps=30, world_sizes=(2,), step_s=0.05,
                         restart_s=3.0), root)
    return root


def test_from_run_measures_step_stall_and_restore(failed_once: Path) -> None:
    measured = measure_run(failed_once)
    assert measured.step_s == pytest.approx(0.05)
    assert measured.steps > 30  # replayed steps are real steps too
    events = [json.loads(line) for log in sorted(failed_once.glob("logs/*/checkpoint_rank0.jsonl"))
              for line in log.read_text().splitlines()]
    assert measured.checkpoints == len(events) > 0
    stalls = sorted(e["stall_s"] for e in events)
    low, high = stalls[(len(stalls) - 1) // 2], stalls[len(stalls) // 2]
    assert measured.ckpt_stall_s == pytest.approx((low + high) / 2)
    metrics = verify_run(failed_once).metrics
    assert metrics.restarts == 1 and metrics.restart_s is not None
    assert measured.restore_s == pytest.approx(metrics.restart_s - 0.05)
    assert measured.restore_from == "1 restart" and measured.world_size == 2


def test_from_run_feeds_the_existing_models(failed_once: Path) -> None:
    result = from_run(failed_once, _flags())
    m = result.measured
    expected = advise(AdviceInput(ckpt_cost=m.ckpt_stall_s or 0.0, restore_cost=m.restore_s,
                                  step_time=m.step_s, gpu_failure_rate=RATE, gpus=2,
                                  overhead=0.05, job_seconds=86_400.0))
    assert result.advice == expected
    # flags given on the command line win over the measurement
    forced = from_run(failed_once, _flags(step_time=2.0, gpus=16))
    assert forced.given.step_time == 2.0 and forced.given.gpus == 16
    assert forced.advice.ckpt_every_steps != result.advice.ckpt_every_steps


def test_a_run_without_restarts_uses_its_first_launch(tmp_path: Path) -> None:
    generate_run(RunSpec(target_steps=20, world_sizes=(1,), step_s=0.1), tmp_path / "r")
    measured = measure_run(tmp_path / "r")
    assert measured.restore_from == "first launch" and measured.restore_s >= 0.0


def test_cli_prints_the_interval_and_both_wasted_fractions(
        failed_once: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--from-run", str(failed_once), "--mtbf", "7200"]) == 0
    text = capsys.readouterr().out
    advice = from_run(failed_once, _flags()).advice
    assert f"--ckpt-every {advice.ckpt_every_steps}" in text
    assert "measured in" in text and "50.0 ms (median of" in text
    assert "periodic at the optimum" in text and "just-in-time checkpointing" in text
    assert main(["advise", "--from-run", str(failed_once), "--mtbf", "7200",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ckpt_every_steps"] == advice.ckpt_every_steps
    assert {"periodic", "jit", "measured", "inputs"} <= set(data)


@pytest.mark.parametrize(("args", "words"), [
    (["--mtbf", "100"], ["--ckpt-cost and --step-time", "--from-run"]),
    (["--from-run", "/nonexistent/run", "--mtbf", "100"], ["not a run directory"]),
    (["--from-matrix", "/nonexistent", "--mtbf", "100"], ["no manifest.json"]),
])
def test_cli_errors_are_one_line(args: list[str], words: list[str],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for word in words:
        assert word in err


def test_a_run_without_checkpoints_needs_ckpt_cost(tmp_path: Path) -> None:
    generate_run(RunSpec(target_steps=10, world_sizes=(1,), ckpt_every=0, strategy="none"),
                 tmp_path / "r")
    with pytest.raises(ConfigError, match=r"took no checkpoint.*--ckpt-cost"):
        from_run(tmp_path / "r", _flags())
    assert from_run(tmp_path / "r", _flags(ckpt_cost=0.5)).given.ckpt_cost == 0.5


def test_from_matrix_groups_units_by_workload_and_strategy(failed_once: Path,
                                                           tmp_path: Path) -> None:
    measured = measure_run(failed_once).as_dict()
    (tmp_path / "manifest.json").write_text("{}")
    for uid, strategy, step in (("d-m-a/blocking-seed0", "blocking", 0.04),
                                ("d-m-b/blocking-seed0", "blocking", 0.06),
                                ("d-m-a/overlapped-seed0", "overlapped", 0.05),
                                ("d-m/reference-seed0", "blocking", 0.01)):
        path = tmp_path / "units" / f"{uid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "dataset": "d", "model": "m", "strategy": strategy, "complete": True,
            "schedule": None if "reference" in uid else "a",
            "measured": {**measured, "strategy": strategy, "step_s": step}}))
    results = {r.label: r for r in from_matrix(tmp_path, _flags())}
    assert set(results) == {"d-m blocking", "d-m overlapped"}  # references have no failures
    assert results["d-m blocking"].units == 2
    assert results["d-m blocking"].given.step_time == pytest.approx(0.05)  # median of 2


def test_the_heartbeat_reads_the_newest_attempts_last_step(failed_once: Path,
                                                           tmp_path: Path) -> None:
    from ecrl.apps.matrix._runner import _last_step

    assert _last_step(failed_once) == "step 30/30 (attempt 1)"
    assert _last_step(tmp_path) is None  # nothing launched yet


def test_typed_in_advice_still_refuses_zero_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    # --gpus lost its default to tell "not given" (measured: the run's world size) from a value;
    # a given 0 must still be refused, not replaced by the default.
    assert main(["advise", "--ckpt-cost", "5", "--step-time", "1", "--mtbf", "100",
                 "--gpus", "0"]) == 2
    assert "--gpus must be a positive integer" in capsys.readouterr().err
    assert main(["advise", "--ckpt-cost", "5", "--step-time", "1", "--mtbf", "100"]) == 0
    assert "job: 1 GPUs" in capsys.readouterr().out
