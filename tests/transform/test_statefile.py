"""The resume state on disk: found wherever the program moves, owner-only, never trusted blindly.

Real processes and real files: programs are transformed, SIGKILLed by the runtime at a chosen save,
the state file is inspected or tampered with, and the program is run again.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import killresume as kr
import pytest
from test_runtime import COUNTER, prepare

from transform.cli import main as transform_main

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"


def _without_ckpt_env(tmp_path: Path) -> dict[str, str]:
    env = kr.environment(tmp_path / "unused")
    del env["ECRL_CKPT_DIR"]  # the default directory, relative to where the program starts
    return env


def test_a_program_that_changes_directory_resumes_from_its_state(tmp_path: Path) -> None:
    original = tmp_path / "original.py"
    original.write_text((CORPUS / "chdir-workdir" / "input.py").read_text())
    program = tmp_path / "train.py"
    assert transform_main([str(original), "-o", str(program), "--all-hints"]) == 0
    env = _without_ckpt_env(tmp_path)
    expected = subprocess.run([sys.executable, str(original)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=True).stdout
    (tmp_path / "workdir" / "result.txt").unlink()
    killed = kr.inject(program, "150", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    assert (tmp_path / ".ecrl-ckpt" / "train" / "resume.ckpt").exists()
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    # It resumed (a strict suffix of the original's output), in the directory it had changed to.
    assert expected.endswith(done.stdout) and done.stdout != expected, done.stdout
    assert done.stdout.splitlines()[-1].startswith("workdir ")
    assert (tmp_path / "workdir" / "result.txt").exists()
    assert not (tmp_path / ".ecrl-ckpt").exists()
    assert not (tmp_path / "workdir" / ".ecrl-ckpt").exists()


def test_state_is_owner_only_and_stale_temporary_files_go_at_start(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, COUNTER, "--all-hints")
    ckpt = tmp_path / "ckpt"
    killed = kr.inject(program, "4:before-rename", cwd=tmp_path, env=env)
    assert killed.returncode == -9
    assert stat.S_IMODE(ckpt.stat().st_mode) == 0o700
    assert stat.S_IMODE((ckpt / "resume.ckpt").stat().st_mode) == 0o600
    stale = list(ckpt.glob(".resume.ckpt.*.tmp"))
    assert len(stale) == 1, "the kill before the rename left its temporary file"
    killed = kr.inject(program, "2", cwd=tmp_path, env=env)  # runs on from save 3
    assert killed.returncode == -9
    assert not stale[0].exists(), "a temporary file of a killed write survived a restart"
    assert kr.finish(program, cwd=tmp_path, env=env).stdout.strip() == "190"


@pytest.mark.parametrize(("what", "mode"), [("file", 0o620), ("file", 0o602),
                                            ("directory", 0o777)])
def test_a_state_others_could_have_written_is_refused(tmp_path: Path, what: str,
                                                      mode: int) -> None:
    _, program, env = prepare(tmp_path, COUNTER, "--all-hints")
    ckpt = tmp_path / "ckpt"
    assert kr.inject(program, "5", cwd=tmp_path, env=env).returncode == -9
    target = ckpt / "resume.ckpt" if what == "file" else ckpt
    target.chmod(mode)
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"ecrl-transform: {target} is writable by group or others: anyone could have replaced "
        f"the resume state, so it is never loaded; remove the {what} to start over, or "
        f"`chmod go-w {target}` if you trust it"]
    target.chmod(0o700 if what == "directory" else 0o600)
    assert kr.finish(program, cwd=tmp_path, env=env).stdout.strip() == "190"


def _forge(state: Path, payload: bytes, names: list[list[str]]) -> None:
    """Rewrite the state with another payload and a checksum that matches it: what anyone who
    can read the format can do."""
    from transform.runtime._statefile import _MAGIC, _checksum

    raw = state.read_bytes()[len(_MAGIC):]
    header = json.loads(raw[:raw.index(b"\n")])
    header["globals"] = names
    header["sha256"] = _checksum(header, payload)
    state.write_bytes(_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload)


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, ...]:
        return os.system, (self.command,)


@pytest.mark.parametrize("declared", [False, True])
def test_a_forged_state_that_runs_a_command_is_refused(tmp_path: Path, declared: bool) -> None:
    import pickle

    _, program, env = prepare(tmp_path, COUNTER, "--all-hints")
    state = tmp_path / "ckpt" / "resume.ckpt"
    assert kr.inject(program, "5", cwd=tmp_path, env=env).returncode == -9
    marker = tmp_path / "owned"
    payload = pickle.dumps({"values": _System(f"touch {marker}")}, protocol=2)
    # Whether or not the forger also lists os.system among the globals the state may import.
    _forge(state, payload, [["posix", "system"], ["os", "system"]] if declared else [])
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert not marker.exists(), "the forged state ran its command"
    assert done.returncode == 1
    line = done.stderr.strip()
    assert line.splitlines() == [line] and "the resume state is refused" in line, done.stderr
    assert "system" in line


CLOSURE = """
from transform import _checkpoint

def make(k):
    def f(x):
        return x * k
    return f

scale = make(3)
total = 0
for i in range(20):
    total += scale(i)
    _checkpoint()
print(total)
"""


def test_a_forged_state_cannot_bring_code_of_its_own(tmp_path: Path) -> None:
    import cloudpickle

    _, program, env = prepare(tmp_path, CLOSURE, "--all-hints")
    state = tmp_path / "ckpt" / "resume.ckpt"
    assert kr.inject(program, "5", cwd=tmp_path, env=env).returncode == -9
    marker = tmp_path / "owned"
    namespace: dict[str, object] = {}
    exec(textwrap.dedent(f"""
        def evil(x):
            open({str(marker)!r}, "w").close()
            return x
    """), namespace)
    payload = cloudpickle.dumps({"values": {"scale": namespace["evil"]}})
    from transform.runtime._pickling import globals_of

    _forge(state, payload, [list(g) for g in sorted(globals_of(payload))])
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert not marker.exists(), "the forged state ran code of its own"
    assert done.returncode == 1
    assert "holds code (evil) that is not part of the program" in done.stderr, done.stderr


def test_the_globals_recorded_at_save_are_all_that_the_payload_imports() -> None:
    """Loading refuses any global the save did not record: the record must be complete."""
    import collections
    import datetime
    import enum
    import fractions
    import functools

    import numpy as np
    import torch

    from transform.runtime._pickling import dumps, globals_of, loads, set_program

    class Colour(enum.Enum):
        RED = 1

    def make(k: float):
        return lambda x: x * k

    # The program's top-level definitions, as its namespace holds them (found by qualified name).
    namespace = {"__name__": __name__, make.__qualname__: make, Colour.__qualname__: Colour}
    set_program(namespace, __file__)
    model = torch.nn.Linear(3, 2)
    payload = {
        "ordered": collections.OrderedDict(a=1), "array": np.arange(10), "dtype": torch.float32,
        "scalars": [np.float64(3), np.float32(1)], "ellipsis": Ellipsis, "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=0.1), "partial": functools.partial(max, 1),
        "when": datetime.datetime(2020, 1, 1), "ratio": fractions.Fraction(1, 3),
        "none_type": type(None), "np_dtype": np.dtype("f4"), "range": range(3),
        "deque": collections.deque([1]), "rng": np.random.default_rng(0),
        "device": torch.device("cpu"), "ufunc": np.add, "colour": Colour.RED, "factory": make,
        "bf16": torch.zeros(3, dtype=torch.bfloat16),
    }
    dumped = dumps(payload, {})
    recorded = {tuple(g) for g in dumped.globals}
    assert recorded == globals_of(dumped.data)
    back = loads(dumped.data, {}, dumped.globals, dumped.blobs.__getitem__)
    assert back["colour"] is Colour.RED and back["factory"] is make
    assert torch.equal(back["model"].weight, model.weight)


def test_a_state_directory_removed_while_the_program_runs_is_made_again_whole(
        tmp_path: Path) -> None:
    from transform.runtime._statefile import StateDir

    state = StateDir(tmp_path / "state")
    state.prepare()
    blobs = {"ab" * 32: b"constant data"}
    state.write({"position": 1}, b"payload-1", blobs)
    for path in list(state.directory.iterdir()):
        path.unlink()
    state.directory.rmdir()
    state.write({"position": 2}, b"payload-2", blobs)
    assert stat.S_IMODE(state.directory.stat().st_mode) == 0o700
    # The blob went with the directory: written again, so the state refers to nothing missing.
    assert (state.directory / f"blob-{'ab' * 32}").read_bytes() == b"constant data"
