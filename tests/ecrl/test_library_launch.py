"""``ecrl launch`` without torchrun: the command it runs, the settings it keeps, what it refuses.
(Real launches: tests/integration/test_launch*.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ecrl.apps.cli import main as cli_main
from ecrl.contract.errors import ConfigError
from ecrl.runtime.supervision.launcher import LaunchSupervisor, launch_config, normalize_program


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_the_program_torchrun_runs(script: Path) -> None:
    assert normalize_program(["--", "python", str(script), "--lr", "1"]) == (
        str(script.resolve()), "--lr", "1")
    assert normalize_program([sys.executable, str(script)]) == (str(script.resolve()),)
    assert normalize_program([str(script), "x"]) == (str(script.resolve()), "x")
    assert normalize_program(["python3", "-m", "pkg.train", "x"]) == ("-m", "pkg.train", "x")
    assert normalize_program(["./run.sh", "x"]) == ("--no-python", "./run.sh", "x")
    assert normalize_program([]) == ()


@pytest.mark.parametrize(("argv", "message"), [
    (["python"], "needs a script"),
    (["python", "-m"], "needs a module"),
    (["python", "-u", "t.py"], "not supported"),
    (["python", "missing.py"], "no such script"),
])
def test_bad_programs_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        normalize_program(argv)


@pytest.mark.parametrize(("argv", "launcher", "instead"), [
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "t.py", "--exact"],
     "accelerate launch", "ecrl launch --nproc 2 -- python t.py --exact"),
    (["/venv/bin/torchrun", "--nproc-per-node=2", "t.py"], "torchrun",
     "ecrl launch --nproc 2 -- python t.py"),
    (["python", "-m", "torch.distributed.run", "--standalone", "t.py", "x"], "torchrun",
     "ecrl launch --nproc N -- python t.py x"),
    (["lightning", "run", "model", "t.py"], "lightning run",
     "ecrl launch --nproc N -- python t.py"),
    (["fabric", "run", "--devices", "2", "t.py"], "fabric run",
     "ecrl launch --nproc 2 -- python t.py"),
])
def test_a_launcher_inside_ecrl_launch_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], launcher: str,
        instead: str) -> None:
    # Under ecrl launch each torchrun rank would start a whole job of its own: a run that ends
    # "completed", then fails verification. One line, exit 2, the command to write instead.
    out = tmp_path / "r"
    assert cli_main(["launch", "--out", str(out), "--world-sizes", "2", "--", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"`{launcher}` starts processes itself" in err and f"`{instead}`" in err, err
    assert not out.exists()


def _supervisor(out: Path, program: tuple[str, ...], node_rank: int = 0,
                **flags: object) -> LaunchSupervisor:
    config = launch_config({"out": str(out), **flags}, default_out=str(out))
    return LaunchSupervisor(config, name="launch", program=program, node_rank=node_rank)


def _open(sup: LaunchSupervisor) -> bool:
    opened = sup._open_run()
    if sup._lock is not None:
        sup._lock.close()  # as if that supervisor had ended
    return opened


def test_settings_are_kept_and_a_continue_needs_none(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "run"
    program = (str(script), "--steps", "5")
    assert _open(_supervisor(out, program, world_sizes="2,1", fail_at="3", ckpt_every=2))
    stored = json.loads((out / "supervisor.json").read_text())["launch"]
    assert stored["program"] == list(program)
    assert stored["config"]["world_sizes"] == [2, 1] and stored["config"]["fail_at"] == [3]
    again = _supervisor(out, ())
    assert _open(again)
    assert again.program == program
    assert again.config.world_sizes == (2, 1) and again.config.ckpt_every == 2


def test_a_continue_with_other_settings_or_script_is_refused(tmp_path: Path,
                                                             script: Path) -> None:
    out = tmp_path / "run"
    _open(_supervisor(out, (str(script),), world_sizes="2"))
    with pytest.raises(ConfigError, match="was launched with --world-sizes"):
        _open(_supervisor(out, (), world_sizes="1"))
    with pytest.raises(ConfigError, match="was launched with"):
        _open(_supervisor(out, (str(script), "--other")))


def test_a_new_run_needs_a_script_and_an_empty_directory(tmp_path: Path, script: Path) -> None:
    with pytest.raises(ConfigError, match="name the script to run"):
        _open(_supervisor(tmp_path / "new", ()))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds notes\.txt"):
        _open(_supervisor(tmp_path / "full", (str(script),)))


def test_nodes_share_one_directory(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "run"
    multi = {"nnodes": 2, "world_sizes": "2", "rdzv_endpoint": "localhost:1234"}
    assert _open(_supervisor(out, (str(script),), node_rank=1, **multi))
    assert _open(_supervisor(out, (str(script),), node_rank=0, **multi))
    assert (out / "supervisor.json").exists() and (out / "supervisor-node-1.json").exists()


def test_cli_rejects_a_node_rank_outside_the_nodes(tmp_path: Path, script: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["launch", "--out", str(tmp_path / "r"), "--node-rank", "1", "--",
                     "python", str(script)])
    assert code == 2
    assert "--node-rank 1 must be in 0..0" in capsys.readouterr().err


def test_a_full_disk_keeps_the_launch_state_file_whole(tmp_path: Path, script: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The launch supervisor writes its per-node state through the same writer as `ecrl run`:
    # ENOSPC leaves the previous version whole and says so, instead of a traceback.
    from ecrl.runtime.supervision.rundir import DiskFull

    out = tmp_path / "run"
    assert _open(_supervisor(out, (str(script),)))
    before = (out / "supervisor.json").read_text()
    monkeypatch.setenv("ECRL_CRASH_AT", "supervisor:enospc:1")
    with pytest.raises(DiskFull, match="no space left on device"):
        _open(_supervisor(out, ()))
    assert (out / "supervisor.json").read_text() == before
