"""The driver that times (and kills) programs: it ends a program as the interpreter would, in
a new interpreter or forked from the test's torch server (tests/transform/forkserver.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import forkserver
import pytest

from transform._testing.drive import DrivenRun

ENDINGS = {
    "normal": ("print('out')", 0, ""),
    "exit-status": ("import sys\nsys.exit(3)", 3, ""),
    "exit-message": ("import sys\nsys.exit('gave up')", 1, "gave up"),
    "exception": ("raise ValueError('bad input')", 1, "ValueError: bad input"),
}
HEAD = textwrap.dedent("""\
    import atexit, os, sys
    import torch
    atexit.register(lambda: print("atexit ran", flush=True))
    print(os.getcwd(), os.environ.get("ECRL_PROBE"), sys.argv[1:], "torch" in sys.modules)
""")


@pytest.mark.parametrize("forked", [False, True], ids=["new-interpreter", "forked"])
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_driver_ends_a_program_as_the_interpreter_does(
        ending: str, forked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(forkserver.FRESH_ENV, raising=False)
    body, status, stderr = ENDINGS[ending]
    program = tmp_path / "p.py"
    program.write_text(HEAD + body + "\n")
    # The environment the harness gives a program: the forked one shares the server's.
    env = {**os.environ, "ECRL_PROBE": ending}
    run = DrivenRun(program, tmp_path, env, ("an-arg",),
                    popen=forkserver.popen if forked else subprocess.Popen)
    assert isinstance(run.proc, forkserver.ForkedProcess) == forked
    run.wait_ready(120)
    out, killed, work = run.finish(60)
    assert not killed
    assert run.proc.returncode == status, run.stderr
    assert out.startswith(f"{tmp_path} {ending} ['an-arg'] True\n"), out
    assert out.endswith("atexit ran\n"), out
    assert stderr in run.stderr
    assert work > 0


def test_a_forked_program_is_killed_for_real(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(forkserver.FRESH_ENV, raising=False)
    program = tmp_path / "p.py"
    program.write_text("import time\nimport torch\nprint('started', flush=True)\n"
                       "time.sleep(600)\n")
    run = DrivenRun(program, tmp_path, dict(os.environ), popen=forkserver.popen)
    assert isinstance(run.proc, forkserver.ForkedProcess)
    run.wait_ready(120)
    out, killed, _ = run.finish(1.0)
    assert killed and out == "started\n"
    assert run.proc.returncode == -9
    with pytest.raises(ProcessLookupError):
        os.kill(run.proc.pid, 0)  # gone, and reaped by the server


def test_forkserver_run_is_python_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(forkserver.FRESH_ENV, raising=False)
    program = tmp_path / "p.py"
    program.write_text("import os, sys\nimport torch\nprint(os.getppid())\nprint('out')\n"
                       "print('err', file=sys.stderr)\nsys.exit(4)\n")
    env = dict(os.environ)
    forked = forkserver.run(program, cwd=tmp_path, env=env, timeout=120)
    plain = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    # The first ran as a child of a fork server (else the comparison would be with itself).
    forked_parent, forked_out = forked.stdout.split("\n", 1)
    plain_parent, plain_out = plain.stdout.split("\n", 1)
    assert int(forked_parent) in {s.proc.pid for s in forkserver._servers}
    assert int(plain_parent) == os.getpid()
    assert (forked.returncode, forked_out, forked.stderr) == \
        (plain.returncode, plain_out, plain.stderr) == (4, "out\n", "err\n")
