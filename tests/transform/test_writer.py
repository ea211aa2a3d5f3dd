"""Resume states written off the training thread: a kill while a write is in flight resumes from
the previous durable state with the uninterrupted result; a write that fails is reported in one
line at the next save or at exit, never lost.

Real processes, files and SIGKILL: the runtime's own failure injection (``N:in-flight``) holds the
N-th save's write before its rename until the training thread has handed over a later save, then
kills the process.
"""

from __future__ import annotations

import random
from pathlib import Path

import killresume as kr
import pytest
from test_runtime import original_output, prepare

STEPS = """
from transform import _checkpoint

total = 0
for i in range(30):
    total += i * i
    print(i, total, flush=True)
    _checkpoint()
print("done", total)
"""


def test_a_kill_while_a_write_is_in_flight_resumes_from_the_last_durable_state(
        tmp_path: Path) -> None:
    original, program, env = prepare(tmp_path, STEPS, "--all-hints")
    expected = original_output(original, env).splitlines(keepends=True)
    ckpt = tmp_path / "ckpt"
    # Saves 1-9 are written (each waited for); save 10 (after step 9) is held in flight.
    killed = kr.inject(program, "10:in-flight", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    ran = killed.stdout.splitlines()
    assert len(ran) >= 11 and ran[10].startswith("10 "), \
        "the training thread did not run ahead of the write"
    assert len(list(ckpt.glob(".resume.ckpt.*.tmp"))) == 1, "no write was in flight"
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    # Resumed from save 9 (after step 8), the newest durable state: step 9 runs again.
    assert done.stdout.splitlines()[0].startswith("9 "), done.stdout
    assert "".join(expected[9:]) == done.stdout
    assert not ckpt.exists()


def test_a_fixture_survives_random_kills_while_writes_are_in_flight(tmp_path: Path) -> None:
    """min-char-rnn saves every 8 ms, faster than its writes: kills land on writes in flight
    and on waiting states superseded by newer ones."""
    corpus = Path(__file__).resolve().parents[2] / "fixtures" / "programs" / "min-char-rnn"
    original = tmp_path / "original.py"
    original.write_text((corpus / "input.py").read_text())
    program = tmp_path / "train.py"
    from transform.cli import main as transform_main

    assert transform_main([str(original), "-o", str(program), "--all-hints"]) == 0
    env = kr.environment(tmp_path / "ckpt")
    reference = kr.run_original(original, cwd=tmp_path, env=env)
    outcome = kr.kill_and_resume(program, reference, cwd=tmp_path, env=env,
                                 rng=random.Random(7), fractions=(0.3, 0.8))
    kr.assert_same_result(reference, outcome)
    assert outcome.kills >= 1


BREAKS = """
import os, time
from transform import _checkpoint

total = 0
for i in range(LAST + 1):
    total += i
    if i == BREAK:
        # The state directory becomes a file: every later write fails for real (once the
        # write in flight is done: it would make the directory again).
        time.sleep(0.3)
        os.rename(os.environ["ECRL_CKPT_DIR"], os.environ["ECRL_CKPT_DIR"] + ".gone")
        open(os.environ["ECRL_CKPT_DIR"], "w").close()
    time.sleep(0.05)
    _checkpoint()
time.sleep(0.5)
print(total)
"""


@pytest.mark.parametrize("sync", ["0", "1"])
@pytest.mark.parametrize(("last", "where"), [(12, "a later save"), (3, "the exit")])
def test_a_failed_write_is_reported_in_one_line(tmp_path: Path, sync: str, last: int,
                                                where: str) -> None:
    source = BREAKS.replace("LAST", str(last)).replace("BREAK", "3")
    _, program, env = prepare(tmp_path, source, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env={**env, "ECRL_TRANSFORM_SYNC": sync})
    assert done.returncode == 1, (where, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"ecrl-transform: cannot write the resume state in "
                               f"{tmp_path / 'ckpt'}: "), lines[0]
    # Reported at the exit, the program had finished its work; at a save, it had not.
    assert (done.stdout.strip() == str(sum(range(last + 1)))) == (where == "the exit"
                                                                  and sync == "0")


FORKS = """
import os, time
from transform import _checkpoint

total = 0
for i in range(20):
    total += i
    time.sleep(0.02)
    _checkpoint()
    if i == 10:
        pid = os.fork()
        if pid == 0:
            raise SystemExit(0)  # the child ends normally: its exit must not wait or clean up
        os.waitpid(pid, 0)
        print(os.path.exists(os.path.join(os.environ["ECRL_CKPT_DIR"], "resume.ckpt")))
print(total)
"""


@pytest.mark.parametrize("sync", ["0", "1"])
def test_a_forked_child_neither_waits_for_nor_removes_the_parents_state(tmp_path: Path,
                                                                        sync: str) -> None:
    """Synchronous, no write of the parent's could bring the file back after a child removed it;
    in the background, the child's exit must not wait for the parent's writer."""
    _, program, env = prepare(tmp_path, FORKS, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env={**env, "ECRL_TRANSFORM_SYNC": sync},
                     timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "190"], "the child's exit removed the resume state"
    assert not (tmp_path / "ckpt").exists()
