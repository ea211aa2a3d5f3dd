"""transform.runtime in real processes: what it saves, restores in place, refuses, and removes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import killresume as kr
import pytest

from transform.cli import main as transform_main


def prepare(tmp_path: Path, source: str, *args: str) -> tuple[Path, Path, dict[str, str]]:
    original = tmp_path / "original.py"
    original.write_text(textwrap.dedent(source))
    program = tmp_path / "train.py"
    assert transform_main([str(original), "-o", str(program), *args]) == 0
    return original, program, kr.environment(tmp_path / "ckpt")


def original_output(original: Path, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, str(original)], cwd=original.parent, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def resume_after(program: Path, env: dict[str, str], kill_at: str) -> str:
    killed = kr.inject(program, kill_at, cwd=program.parent, env=env)
    assert killed.returncode == -9, killed.stderr
    done = kr.finish(program, cwd=program.parent, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_runtime_imports_nothing_heavy() -> None:
    code = ("import sys, transform.runtime; print(sorted(m for m in ('torch', 'numpy', 'libcst',"
            " 'networkx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


ANCHORS = """
from transform import _checkpoint

class Box:
    def __init__(self):
        self.value = 0
        self.seen = []

stats = {"calls": 0}
history = []

def train(box, history, steps):
    alias = history
    for step in range(steps):
        _iterations: 40
        box.value += step
        box.seen.append(step % 3)
        alias.append(box.value % 7)
        stats["calls"] += 1
        _checkpoint()
    return alias is history

box = Box()
same = train(box, history, 40)
print(box.value, box.seen[-5:], history[-5:], stats, same)
"""


@pytest.mark.parametrize("kill_at", ["3", "20:before-rename"])
def test_objects_the_caller_rebuilds_are_restored_in_place(tmp_path: Path,
                                                           kill_at: str) -> None:
    original, program, env = prepare(tmp_path, ANCHORS, "--all-hints")
    expected = original_output(original, env)
    assert expected.strip().endswith("True")
    assert resume_after(program, env, kill_at) == expected


SHUFFLED = """
import random
from transform import _checkpoint

class Shuffled:
    # Draws its order when iterated, like a shuffling data loader.
    def __init__(self, n):
        self.n = n
    def __iter__(self):
        order = list(range(self.n))
        random.shuffle(order)
        return iter(order)

random.seed(5)
data = Shuffled(30)
total = []
for epoch in range(3):
    for item in data:
        _iterations: 30
        total.append((epoch, item, random.randint(0, 9)))
        _checkpoint()
print(total[-6:], len(total), random.random())
"""


@pytest.mark.parametrize("kill_at", ["4", "45", "77"])
def test_other_iterables_are_fast_forwarded_from_their_random_state(tmp_path: Path,
                                                                     kill_at: str) -> None:
    original, program, env = prepare(tmp_path, SHUFFLED, "--all-hints")
    assert resume_after(program, env, kill_at) == original_output(original, env)


# A loop over an iterator the program holds (``it = iter(...)``, a first item taken, then
# ``for x in it``): the iterator is saved with the program's values, so it comes back past the
# saved iteration's item. The fast-forward skipped that many items again (a wrong result with
# exit 0, or a refusal that the loop ended early); now the item is saved and given back.
@pytest.mark.parametrize(("loop", "kill_at"), [("for x in it:", "3"),
                                               ("for x in it:", "1"),
                                               ("for k, x in enumerate(it, 7):", "12")])
def test_a_loop_over_a_saved_iterator_resumes_where_it_stood(tmp_path: Path, loop: str,
                                                             kill_at: str) -> None:
    source = f"""
from transform import _checkpoint

data = list(range(20))
it = iter(data)
head = next(it)
total = k = 0
{loop}
    _iterations: 19
    total = (total * 3 + x + k) % 1000003
    _checkpoint()
print(head, total)
"""
    original, program, env = prepare(tmp_path, source, "--all-hints")
    assert resume_after(program, env, kill_at) == original_output(original, env)


def test_a_file_the_resume_opens_again_is_read_on_from_where_the_loop_began(
        tmp_path: Path) -> None:
    # The ``with`` opens the file again on resume; the header line read before the loop is not
    # read again (the walk skips it), so the loop's fast-forward counted lines one early.
    (tmp_path / "data.txt").write_text("header\n" + "".join(f"{i * 7 % 13}\n" for i in range(30)))
    source = """
from transform import _checkpoint

total = 0
with open("data.txt") as fh:
    header = fh.readline()
    for line in fh:
        _iterations: 30
        total = (total * 5 + int(line)) % 100003
        _checkpoint()
print(header.strip(), total)
"""
    original, program, env = prepare(tmp_path, source, "--all-hints")
    killed = kr.inject(program, "4", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    assert resume_after(program, env, "3") == original_output(original, env)


def test_a_saved_iterator_iterated_through_zip_is_refused_at_the_first_save(
        tmp_path: Path) -> None:
    source = """
from transform import _checkpoint

it = iter(range(20))
total = 0
for x, y in zip(it, range(20)):
    _iterations: 20
    total += x * y
    _checkpoint()
print(total)
"""
    _, program, env = prepare(tmp_path, source, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ecrl-transform: original.py:9: cannot save this checkpoint: its loop iterates a saved "
        "iterator through zip(), which the resume cannot put back where it stood; iterate the "
        "iterator itself, or the loader or sequence it comes from"), done.stderr


UNSAVEABLE = """
from transform import _checkpoint

def numbers():
    yield from range(100)

def run():
    it = iter(numbers())  # a generator the analysis does not see (numbers() is refused)
    total = 0
    for i in range(5):
        total += next(it)
        _checkpoint()
    return total

print(run())
"""


def test_an_unsaveable_value_is_named_at_the_first_save(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, UNSAVEABLE, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert "original.py:12: cannot save `it` (a generator)" in line, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ckpt" / "resume.ckpt").exists()


COUNTER = """
import sys
from transform import _checkpoint

total = 0
for i in range(20):
    total += i
    _checkpoint()
print(total)
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
"""


def test_resume_state_is_removed_only_on_normal_completion(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, COUNTER, "--all-hints")
    state = tmp_path / "ckpt" / "resume.ckpt"
    for status, kept in (("3", True), ("0", False)):
        done = subprocess.run([sys.executable, str(program), status], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=False)
        assert done.returncode == int(status)
        assert state.exists() == kept
    assert not (tmp_path / "ckpt").exists()


def test_damaged_or_foreign_state_is_never_loaded(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, COUNTER, "--all-hints")
    killed = kr.inject(program, "5", cwd=tmp_path, env=env)
    assert killed.returncode == -9
    state = tmp_path / "ckpt" / "resume.ckpt"
    good = state.read_bytes()
    state.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1 and "damaged (checksum mismatch)" in done.stderr
    assert "Traceback" not in done.stderr and state.exists()
    state.write_bytes(good)
    edited = tmp_path / "edited.py"
    edited.write_text(textwrap.dedent(COUNTER).replace("total += i", "total += 2 * i"))
    other = tmp_path / "other.py"
    assert transform_main([str(edited), "-o", str(other), "--all-hints"]) == 0
    done = kr.finish(other, cwd=tmp_path, env=env)
    assert done.returncode == 1 and "different version of this program" in done.stderr
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "190"


RAISES = """
from transform import _checkpoint


def risky(i):
    if i == 7:
        raise ValueError(f"bad item {i}")
    return i


def train(n):
    total = 0
    for i in range(n):
        _iterations: 10
        total += risky(i)
        _checkpoint()
    return total


print(train(10))
"""


IMPORTS = """
import atexit
import sys
from transform import _checkpoint


def loaded():  # after the traceback was shown in the original's lines
    print(sorted(m for m in sys.modules
                 if m.split(".")[0] in ("transform", "libcst", "networkx", "numpy", "torch")))


atexit.register(loaded)
total = 0
for i in range(3):
    total += i
    _checkpoint()
raise ValueError(total)
"""

# What a generated program may load of ours: the hint, the plan it carries and the runtime.
LIGHT = {"transform", "transform._firing", "transform.planspec"}


def test_a_generated_program_imports_no_code_generator(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, IMPORTS, "--all-hints")
    done = subprocess.run([sys.executable, str(program)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-3:] == ['  File "original.py", line 17, in <module>',
                                             "    raise ValueError(total)", "ValueError: 3"]
    loaded = set(eval(done.stdout.strip().splitlines()[-1]))
    assert "transform.runtime" in loaded  # the check sees the program's own process
    heavy = {m for m in loaded if m not in LIGHT and not m.startswith("transform.runtime")}
    assert heavy == set(), f"a generated program loaded {sorted(heavy)}"


STEERED = """
from transform import _checkpoint


def items(n):
    for i in range(n):
        if i == 5:
            raise KeyError(i)
        yield i


total = 0
for i in items(8):
    _iterations: 8
    total += i
    _checkpoint()
print(total)
"""


def test_an_error_in_a_steered_header_shows_the_original_line(tmp_path: Path) -> None:
    # The header is rewritten (``_ecrl.loop(K)(items(8))``): the program carries its text.
    _, program, env = prepare(tmp_path, STEERED, "--all-hints")
    assert "for i in _ecrl.loop(1)(items(8)):" in program.read_text()
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    at = lines.index('  File "original.py", line 13, in <module>')
    assert lines[at + 1] == "    for i in items(8):"
    assert lines[-3:] == ['  File "original.py", line 8, in items', "    raise KeyError(i)",
                          "KeyError: 5"]

def test_an_error_in_the_program_is_shown_in_the_original_source(tmp_path: Path) -> None:
    _, program, env = prepare(tmp_path, RAISES, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert "train.py" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "Traceback (most recent call last):",
        '  File "original.py", line 20, in <module>',
        "    print(train(10))",
        '  File "original.py", line 15, in train',
        "    total += risky(i)",
        '  File "original.py", line 7, in risky',
        '    raise ValueError(f"bad item {i}")',
        "ValueError: bad item 7"]
