"""The driver that times (and kills) programs: it ends a program as the interpreter would."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from transform._testing.drive import DrivenRun

ENDINGS = {
    "normal": ("print('out')", 0, ""),
    "exit-status": ("import sys\nsys.exit(3)", 3, ""),
    "exit-message": ("import sys\nsys.exit('gave up')", 1, "gave up"),
    "exception": ("raise ValueError('bad input')", 1, "ValueError: bad input"),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_the_driver_ends_a_program_as_the_interpreter_does(ending: str, tmp_path: Path) -> None:
    body, status, stderr = ENDINGS[ending]
    program = tmp_path / "p.py"
    program.write_text(textwrap.dedent("""\
        import atexit
        atexit.register(lambda: print("atexit ran", flush=True))
    """) + body + "\n")
    run = DrivenRun(program, tmp_path, {})
    run.wait_ready(60)
    out, killed, work = run.finish(60)
    assert not killed
    assert run.proc.returncode == status, run.stderr
    assert out.endswith("atexit ran\n"), out
    assert stderr in run.stderr
    assert work > 0
