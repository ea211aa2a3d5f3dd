"""Inputs that would poison a run directory are refused in one line before anything is written
(issue 24.7): infinite and NaN numbers from flags, the TOML config and the ranks' environment;
sizes no rank can hold in memory; a ``--config`` that is not a TOML file; ``--jobs 0``. run.json
itself refuses a non-finite number as the last line of defence.

Everything here is refused before torchrun is launched: the real ``ecrl`` entry point runs
in-process, and a guard fails a test that would launch anything (as code without these checks
would) instead of letting it train.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ecrl.apps.cli import main
from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import write_json_record
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.manifest import build_manifest
from ecrl.runtime.runconfig import load_config
from ecrl.runtime.settings import CheckpointSettings, resolve_checkpoint


@pytest.fixture(autouse=True)
def _never_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    import ecrl.apps.faults
    from ecrl.runtime.supervision.supervisor import Supervisor

    def launched(*args: object, **kwargs: object) -> int:
        raise AssertionError("accepted: it went on to launch")

    monkeypatch.setattr(Supervisor, "_start_torchrun", launched)
    monkeypatch.setattr(ecrl.apps.faults, "main", launched)


FLOAT_FLAGS = ("--lr", "--collective-timeout-s", "--hang-timeout-s", "--deadline-k-step",
               "--deadline-k-ckpt")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-inf"])
def test_a_non_finite_number_flag_is_refused_before_the_run_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    out = tmp_path / "run"
    _refused(capsys, ["run", "--out", str(out), f"{flag}={value}"], flag, "finite")
    assert not out.exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_a_non_finite_number_in_the_config_file_is_refused(tmp_path: Path, value: str) -> None:
    toml = tmp_path / "job.toml"
    toml.write_text(f"lr = 0.1\nhang-timeout-s = {value}\n")
    with pytest.raises(ConfigError, match="--hang-timeout-s must be a finite number"):
        load_config({}, config_file=str(toml), default_out=str(tmp_path / "run"))


def test_a_non_finite_number_from_the_ranks_environment_is_refused() -> None:
    env = AttemptEnv.from_environ({"ECRL_RUN_DIR": "/r", "ECRL_ATTEMPT": "0",
                                   "ECRL_HANG_TIMEOUT_S": "inf"})
    assert env is not None
    with pytest.raises(ConfigError, match="--hang-timeout-s must be a finite number"):
        resolve_checkpoint(flags=env.checkpoint, script={})
    with pytest.raises(ConfigError, match="finite"):
        AttemptEnv.from_environ({"ECRL_RUN_DIR": "/r", "ECRL_ATTEMPT": "0",
                                 "ECRL_DEADLINE": "nan"})
    with pytest.raises(ConfigError, match="--deadline-k-ckpt must be a finite number"):
        CheckpointSettings(deadline_k_ckpt=float("inf"))  # a script's own argument


def test_a_deadline_at_infinity_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    _refused(capsys, ["run", "--out", str(out), "--deadline", "@1e400"], "--deadline",
             "finite")
    assert not out.exists()


def test_run_json_refuses_a_non_finite_number(tmp_path: Path) -> None:
    manifest = build_manifest(seed=0, dataset="fake", dataset_size=64, global_batch=8,
                              steps_per_epoch=8, target_steps=8, log_ids=False, model="tiny-cnn",
                              strategy="blocking", ckpt_every=2, fail_at=(), world_sizes=(1,),
                              extra={"config": {"lr": float("inf")}})
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json_record(tmp_path / "run.json", manifest)
    assert not (tmp_path / "run.json").exists()


def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)
    return link


@pytest.mark.parametrize(("make", "words"), [
    (lambda d: (d / "bin.toml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00") and d / "bin.toml",
     ("is not text",)),
    (lambda d: d, ("is a directory",)),
    (lambda d: d / "missing.toml", ("no such file",)),
    (_fifo, ("not a regular file",)),
])
def test_a_config_that_is_not_a_toml_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object,
        words: tuple[str, ...]) -> None:
    config = make(tmp_path)  # type: ignore[operator]
    out = tmp_path / "run"
    result: list[str] = []
    # A FIFO nobody writes would block an open() forever: run it where a hang fails the test.
    worker = threading.Thread(target=lambda: result.append(
        _refused(capsys, ["run", "--out", str(out), "--config", str(config)],
                 f"--config {config}", *words)), daemon=True)
    worker.start()
    worker.join(30)
    assert result, "ecrl run --config blocked on its file"
    assert not out.exists()


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_faults_jobs_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      jobs: str) -> None:
    out = tmp_path / "campaign"
    _refused(capsys, ["faults", "--jobs", jobs, "--out", str(out)], "--jobs", "at least 1")
    assert not out.exists()


@pytest.mark.parametrize("command", [[], ["--", "python", "train.py"]])
@pytest.mark.parametrize("nproc", ["0", "-2"])
def test_nproc_below_one_is_refused_under_its_own_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        nproc: str) -> None:
    # It was refused as "--world-sizes must be positive integers", a flag the user never gave.
    out = tmp_path / "run"
    err = _refused(capsys, ["launch" if command else "run", "--out", str(out), "--nproc", nproc,
                            *command], "--nproc must be a positive number", f"got {nproc}")
    assert "--world-sizes" not in err
    assert not out.exists()


def test_an_image_size_no_rank_can_hold_is_refused_before_the_run_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    _refused(capsys, ["run", "--out", str(out), "--image-size", "1000000"],
             "one rank needs at least", "32 x 3 x 1000000 x 1000000 float32", "bytes of",
             "--image-size")
    assert not out.exists()


@pytest.mark.parametrize(("fields", "words"), [
    ({"image_size": 4096, "global_batch": 64},
     ("64 x 3 x 4096 x 4096 float32 is 12,884,901,888 bytes",)),
    ({"model": "resnet50", "global_batch": 2},
     ("resnet50 with 23,528,522 parameters", "282,342,264 bytes")),
    ({"image_size": 64, "global_batch": 64, "world_sizes": (4, 2)},  # the largest local batch
     ("32 x 3 x 64 x 64",)),
])
def test_memory_a_rank_can_never_have_is_refused_with_size_and_limit(
        fields: dict[str, object], words: tuple[str, ...]) -> None:
    from ecrl.runtime.runconfig import RunConfig
    from ecrl.runtime.supervision.rundir import check_fits

    limit = (100_000_000, "memory of this test")
    config = RunConfig(out="o", **fields)  # type: ignore[arg-type]
    if fields.get("world_sizes"):
        check_fits(config, 10, limit=(10**9, "memory of this test"))
        limit = (1_000_000, "memory of this test")
    with pytest.raises(ConfigError, match="more than the 1") as info:
        check_fits(config, 10, limit=limit)
    message = str(info.value)
    assert "\n" not in message and "bytes of memory of this test" in message
    for word in words:
        assert word in message, message
    check_fits(RunConfig(out="o"), 10, limit=(10**9, "memory"))  # the default run fits
