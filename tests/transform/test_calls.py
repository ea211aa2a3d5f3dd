"""Functions that checkpoint, called from other code (issue 10 items 2 and 4).

A checkpointing function entered more than once per run (train() once per epoch) would, on
restart, run its earlier calls again and their checkpoints would overwrite the saved later state;
one called while another checkpointing function runs cannot be resumed at all. Both are refused
at transform time with one positioned line naming the call site. The shape the message asks for
(the hint in the caller's loop) survives repeated SIGKILL without its saved position ever moving
backwards.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import killresume as kr
import pytest

from transform.analysis import AnalysisSuccess, analyze
from transform.codegen import generate
from transform.errors import SourceError
from transform.testing.drive import DrivenRun

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
REFUSED = sorted(p.name for p in (FIXTURES / "refused").iterdir() if (p / "input.py").exists())
HEAD = "from transform import _checkpoint\n"
TRAIN = "def train(n):\n    for i in range(3):\n        _checkpoint()\n"


@pytest.mark.parametrize("name", REFUSED)
@pytest.mark.parametrize("args", [["--all-hints"], []])
def test_refused_fixtures_say_where_and_what_to_do(name: str, args: list[str],
                                                   tmp_path: Path) -> None:
    case = FIXTURES / "refused" / name
    out = subprocess.run([sys.executable, "-m", "transform.cli", "input.py", "-o",
                          str(tmp_path / "out.py"), *args], cwd=case, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.splitlines()[0] == (case / "expected-error.txt").read_text().strip()
    assert "Traceback" not in out.stderr and not (tmp_path / "out.py").exists()


def refusal(source: str) -> tuple[int, int, str, str] | None:
    result = analyze(source, "t.py")
    assert isinstance(result, AnalysisSuccess), result
    try:
        generate(result, all_hints=True)
    except SourceError as exc:
        issue = exc.issue
        return issue.line, issue.column, issue.kind, issue.message
    return None


SHAPES = {
    "called-twice": (f"{HEAD}{TRAIN}train(3)\ntrain(4)\n", (6, 1),
                     "checkpoints-called-repeatedly", "called on lines 5, 6"),
    "in-while": (f"{HEAD}{TRAIN}k = 0\nwhile k < 2:\n    train(3)\n    k += 1\n", (7, 5),
                 "checkpoints-called-in-loop", "inside a loop (line 6)"),
    "in-comprehension": (f"{HEAD}{TRAIN}out = [train(n) for n in (1, 2)]\n", (5, 8),
                         "checkpoints-called-in-loop", "comprehension"),
    "by-reference": (f"{HEAD}{TRAIN}run = train\nrun(3)\n", (5, 7), "checkpoints-by-reference",
                     "used here as a value"),
    "recursive": (f"{HEAD}def train(n):\n    for i in range(3):\n        _checkpoint()\n"
                  "    if n:\n        train(n - 1)\ntrain(3)\n", (7, 1),
                  "checkpoints-called-repeatedly", "called on lines 6, 7"),
    "caller-in-loop": (f"{HEAD}{TRAIN}def epoch():\n    train(3)\nfor e in range(2):\n"
                       "    epoch()\n", (6, 5), "checkpoints-called-in-loop",
                       "called here by epoch(), which may run more than once (line 8)"),
    "method-in-loop": (f"{HEAD}class T:\n    def fit(self):\n        for i in range(3):\n"
                       "            _checkpoint()\n    def run(self):\n"
                       "        for e in range(2):\n            self.fit()\n"
                       "T().run()\n", (8, 13), "checkpoints-called-in-loop", "T.fit()"),
    "caller-by-reference": (f"{HEAD}{TRAIN}def main():\n    train(3)\n"
                            "import atexit\natexit.register(main)\n", (8, 17),
                            "checkpoints-by-reference",
                            "main(), which leads to train() that holds checkpoints, is used "
                            "here as a value"),
    "nested": (f"{HEAD}{TRAIN}def main():\n    for e in range(2):\n        train(3)\n"
               "        _checkpoint()\nmain()\n", (7, 9), "nested-checkpoints",
               "keep only main()'s hints"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_functions_entered_more_than_once_are_refused(shape: str) -> None:
    source, (line, column), kind, words = SHAPES[shape]
    got = refusal(source)
    assert got is not None, "accepted a shape whose restart loses progress"
    assert got[:3] == (line, column, kind) and words in got[3], got


ACCEPTED = {
    "once-from-main": f"{HEAD}{TRAIN}def main():\n    train(3)\nif __name__ == '__main__':\n"
                      "    main()\n",
    "once-at-top": f"{HEAD}{TRAIN}train(3)\n",
    "never-called": f"{HEAD}{TRAIN}",
    "torch-style-train-method": f"{HEAD}class M:\n    def train(self):\n        pass\n"
                                f"{TRAIN}m = M()\nm.train()\nfor k in range(2):\n"
                                "    m.train()\ntrain(3)\n",
    "caller-hints-not-nested": f"{HEAD}def train(n):\n    for i in range(n):\n        pass\n"
                               "def main():\n    for e in range(2):\n        train(3)\n"
                               "        _checkpoint()\nmain()\n",
}


@pytest.mark.parametrize("shape", sorted(ACCEPTED))
def test_functions_entered_once_are_accepted(shape: str) -> None:
    assert refusal(ACCEPTED[shape]) is None


def _first_epoch(stdout: str) -> int | None:
    for line in stdout.splitlines():
        if line.startswith("epoch "):
            return int(line.split()[1].rstrip(":"))
    return None


def _last_epoch(stdout: str) -> int:
    epochs = [int(line.split()[1].rstrip(":")) for line in stdout.splitlines()
              if line.startswith("epoch ")]
    return max(epochs, default=0)


def test_hint_in_the_callers_epoch_loop_never_moves_backwards(tmp_path: Path) -> None:
    """The advised shape (mnist: train() once per epoch, the hint after the call in main()'s
    loop), killed at random moments: each attempt starts at or after the last epoch the
    previous one printed (every epoch is a checkpoint, the print comes before it), and the run
    finishes within a bounded number of restarts with the original's digest."""
    source = FIXTURES / "programs" / "mnist-epoch-caller" / "input.py"
    original = tmp_path / "original.py"
    original.write_text(source.read_text())
    program = tmp_path / "train.py"
    from transform.cli import main

    assert main([str(original), "-o", str(program), "--all-hints"]) == 0
    env = kr.environment(tmp_path / "c")
    reference = kr.run_original(original, cwd=tmp_path, env=env)
    rng = random.Random(7)
    reached, kills = 0, 0
    for _attempt in range(20):
        run = DrivenRun(program, tmp_path, env)
        run.wait_ready(120)
        out, killed, _ = run.finish(rng.uniform(0.3, 0.8) * reference.work)
        first = _first_epoch(out)
        if first is not None:
            # Resumed after the last saved epoch: never before what an earlier attempt reached.
            assert first >= reached, f"restarted at epoch {first} after reaching {reached}"
            reached = max(reached, _last_epoch(out))
        if not killed:
            assert run.proc.returncode == 0, run.stderr
            assert out.splitlines()[-1] == reference.stdout.splitlines()[-1]
            assert reference.stdout.endswith(out)
            break
        kills += 1
    else:
        raise AssertionError(f"not finished after 20 attempts (reached epoch {reached})")
    assert kills >= 1, "no attempt was killed: the test proved nothing"


def test_explain_says_the_program_will_be_refused(tmp_path: Path) -> None:
    case = FIXTURES / "refused" / "mnist-hints-in-both"
    expected = (case / "expected-error.txt").read_text().strip()
    text = subprocess.run([sys.executable, "-m", "transform.cli", "input.py", "--explain"],
                          cwd=case, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert f"refused: no program will be written: {expected}" in text.stdout.splitlines()
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "transform.cli", "input.py", "--explain", "--format", "json"],
        cwd=case, capture_output=True, text=True, timeout=120).stdout)
    assert data["refusal"] == expected
    fine = FIXTURES / "programs" / "mnist-epoch-caller" / "input.py"
    ok = analyze(fine.read_text(), str(fine))
    assert isinstance(ok, AnalysisSuccess) and ok.refusal is None
