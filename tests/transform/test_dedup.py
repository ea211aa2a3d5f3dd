"""Values unchanged since the last checkpoint are written once; a changed value is written again;
the resume stays exact.

Real processes and files: the ``constant-data`` fixture (a 200 kB text and a 1 MB table held as
data, a 128 kB array updated in place every step, the table changed once at step 60) is killed by
the runtime at chosen saves; the blobs in its state directory are inspected between attempts.
"""

from __future__ import annotations

from pathlib import Path

import killresume as kr
import pytest

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"
TEXT, TABLE, WEIGHTS = 200_000, 1_048_576, 131_072
"""Sizes of the fixture's blobs: how the test tells them apart."""


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from transform.cli import main as transform_main

    root = tmp_path_factory.mktemp("constant-data")
    original = root / "original.py"
    original.write_text((CORPUS / "constant-data" / "input.py").read_text())
    program = root / "train.py"
    assert transform_main([str(original), "-o", str(program), "--all-hints"]) == 0
    expected = kr.finish(original, cwd=root, env=kr.environment(root / "unused")).stdout
    return program, expected


def blobs(ckpt: Path) -> dict[int, tuple[str, int, int]]:
    """Blob size → (name, inode, modification time)."""
    out = {}
    for path in ckpt.glob("blob-*"):
        st = path.stat()
        out[st.st_size] = (path.name, st.st_ino, st.st_mtime_ns)
    return out


def test_unchanged_values_are_written_once_changed_ones_again(fixture: tuple[Path, str],
                                                              tmp_path: Path) -> None:
    program, expected = fixture
    ckpt = tmp_path / "ckpt"
    env = kr.environment(ckpt)
    assert kr.inject(program, "1", cwd=program.parent, env=env).returncode == -9
    first = blobs(ckpt)
    assert set(first) == {TEXT, TABLE, WEIGHTS}
    state_bytes = (ckpt / "resume.ckpt").stat().st_size
    assert state_bytes < 64 * 1024, "the large values must not be inside resume.ckpt"
    # Resumed from save 1, then 30 saves more (steps 1-30): text and table unchanged.
    assert kr.inject(program, "30", cwd=program.parent, env=env).returncode == -9
    later = blobs(ckpt)
    assert later[TEXT] == first[TEXT] and later[TABLE] == first[TABLE], \
        "an unchanged value was written again"
    assert later[WEIGHTS][0] != first[WEIGHTS][0], "the array updated in place was not saved"
    assert len(list(ckpt.glob("blob-*"))) == 3, "blobs no state refers to must go"
    # Past step 60 the table changed once: written again, under its new content's name.
    assert kr.inject(program, "50", cwd=program.parent, env=env).returncode == -9
    changed = blobs(ckpt)
    assert changed[TABLE][0] != first[TABLE][0]
    assert changed[TEXT] == first[TEXT]
    done = kr.finish(program, cwd=program.parent, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected.splitlines(keepends=True)[-1] == expected
    assert not ckpt.exists()


def test_without_dedup_every_checkpoint_holds_everything(fixture: tuple[Path, str],
                                                         tmp_path: Path) -> None:
    program, expected = fixture
    ckpt = tmp_path / "ckpt"
    env = {**kr.environment(ckpt), "ECRL_TRANSFORM_DEDUP": "0"}
    assert kr.inject(program, "3", cwd=program.parent, env=env).returncode == -9
    assert not list(ckpt.glob("blob-*"))
    assert (ckpt / "resume.ckpt").stat().st_size > TEXT + TABLE + WEIGHTS
    done = kr.finish(program, cwd=program.parent, env=env)
    assert done.returncode == 0 and done.stdout == expected, done.stderr


def test_a_damaged_blob_is_never_loaded(fixture: tuple[Path, str], tmp_path: Path) -> None:
    program, _ = fixture
    ckpt = tmp_path / "ckpt"
    env = kr.environment(ckpt)
    assert kr.inject(program, "5", cwd=program.parent, env=env).returncode == -9
    name = blobs(ckpt)[TABLE][0]
    data = bytearray((ckpt / name).read_bytes())
    data[100] ^= 0xFF
    (ckpt / name).write_bytes(bytes(data))
    done = kr.finish(program, cwd=program.parent, env=env)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"ecrl-transform: {ckpt / name} is damaged (checksum "
                                   "mismatch): it is never loaded; remove the directory to start "
                                   "over")


def test_the_memo_reuses_only_what_is_unchanged() -> None:
    """Unchanged blobs cost no hash and no copy (the same bytes object comes back); a buffer
    written through an alias that bumps no version counter is saved again."""
    import numpy as np

    from transform.runtime._pickling import BlobMemo, dumps

    memo = BlobMemo()
    text = "abc" * 50_000
    array = np.zeros(32_768)
    alias = array.reshape(-1)[:]  # a view: writes through it never touch `array` as an object

    def save() -> dict[str, bytes]:
        return dumps({"text": text, "array": array}, {}, memo=memo).blobs

    first = save()
    assert len(first) == 2
    second = save()
    assert second.keys() == first.keys()
    assert all(second[d] is first[d] for d in first), "an unchanged blob was copied again"
    alias[7] = 1.0
    third = save()
    changed = set(third) - set(first)
    assert len(changed) == 1 and third[changed.pop()] == array.tobytes()
    assert set(save()) == set(third) == set(save())
    memo_free = dumps({"text": text, "array": array}, {}).blobs
    assert set(memo_free) == set(third), "the memo's digests differ from hashing afresh"
