"""How the three command lines end (ecrl.contract.cli.run_main): a user's error is one line and
exit 2, Ctrl-C exit 130, a closed stdout pipe a quiet exit 141, a bug keeps its traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from ecrl.contract.cli import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PIPE, run_main
from ecrl.contract.errors import ConfigError


def _raise(exc: BaseException) -> int:
    raise exc


def test_the_body_s_exit_code_is_returned() -> None:
    assert run_main("prog", lambda: 1) == 1


def test_a_user_s_error_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main("ecrl run", lambda: _raise(ConfigError("--steps: must be positive"))) == 2
    assert capsys.readouterr().err == "ecrl run: error: --steps: must be positive\n"


def test_ctrl_c_is_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main("prog", lambda: _raise(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "prog: interrupted\n"


def test_an_os_error_is_a_user_s_error_only_where_the_program_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = FileNotFoundError(2, "No such file or directory", "runs/x")
    with pytest.raises(FileNotFoundError):
        run_main("prog", lambda: _raise(missing))
    assert run_main("prog", lambda: _raise(missing),
                    os_error=lambda e: f"{e.filename}: {e.strerror}") == EXIT_ERROR
    assert capsys.readouterr().err == "prog: error: runs/x: No such file or directory\n"


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        run_main("prog", lambda: 1 // 0)


def _child(body: str) -> subprocess.Popen[bytes]:
    # Python turns SIGINT into KeyboardInterrupt only if SIGINT was not ignored when it started,
    # and a test runner's worker may ignore it: the child sets the handler a terminal gives.
    code = ("import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from ecrl.contract.cli import run_main\n" + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_a_real_sigint_is_exit_130() -> None:
    proc = _child("""
        def busy():
            print("ready", flush=True)
            time.sleep(60)
            return 0
        sys.exit(run_main("prog", busy))
    """)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert proc.stderr.read().decode() == "prog: interrupted\n"


def test_a_closed_pipe_is_a_quiet_exit() -> None:
    proc = _child("""
        def chatty():
            for i in range(100_000):
                print(f"line {i}")
            return 0
        sys.exit(run_main("prog", chatty))
    """)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)  # `| head -c 10`
    proc.stdout.close()
    assert proc.wait(timeout=60) == EXIT_PIPE == 141
    assert proc.stderr.read() == b""
