"""NumPy arrays in a resume state (``transform/runtime/_arrays.py``): views come back as views of
one restored owner, many arrays are written as one table, identity and memory sharing are kept,
and memory that would stop being shared is refused.

In-process round trips through the runtime's ``dumps``/``loads``; the programs at the end are
transformed, killed at a save and resumed.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import killresume as kr
import numpy as np
import pytest
from test_runtime import original_output, prepare, resume_after

from transform.runtime._arrays import ArrayContent, TableReader
from transform.runtime._exit import CheckpointError
from transform.runtime._pickling import BlobMemo, Dumped, dumps, loads


def _dump(payload: Any, anchors: dict[int, tuple[str, ...]] | None = None,
          memo: BlobMemo | None = None) -> Dumped:
    return dumps(payload, anchors or {}, memo=memo)


def _load(dumped: Dumped, anchors: dict[tuple[str, ...], Any] | None = None) -> Any:
    return loads(dumped.data, anchors or {}, dumped.globals, dumped.blobs.__getitem__)


def _round_trip(payload: Any) -> Any:
    return _load(_dump(payload))


def _same_array(restored: Any, original: Any) -> None:
    assert type(restored) is type(original)
    assert restored.dtype == original.dtype
    assert restored.shape == original.shape
    assert restored.strides == original.strides
    assert restored.flags.c_contiguous == original.flags.c_contiguous
    assert restored.flags.f_contiguous == original.flags.f_contiguous
    assert np.array_equal(restored, original)


def test_views_of_one_owner_come_back_as_views_of_one_restored_owner() -> None:
    owner = np.arange(3_000 * 8, dtype=np.float32).reshape(3_000, 8).copy()
    rows = [owner[i].reshape(8, 1) for i in range(len(owner))]
    singles = {"head": owner[:2], "even": owner[::2], "odd": owner[1::2], "column": owner[:, 3],
               "reversed": owner[::-1, ::-1], "of a row": rows[7][2:], "bytes": owner.view("u1"),
               "transposed": owner.T}
    payload = {"rows": rows, "owner": owner, **singles}
    out = _round_trip(payload)
    restored = out["owner"]
    assert restored.base is None and restored.flags.owndata
    for name, view in singles.items():
        _same_array(out[name], view)
        assert out[name].base is restored, name
    for before, after in zip(rows, out["rows"], strict=True):
        _same_array(after, before)
        assert after.base is restored
    # an update in place after the resume reaches every view, as it would have before
    restored[7] = -1.0
    assert (out["rows"][7] == -1.0).all() and (out["of a row"] == -1.0).all()
    assert out["odd"][3, 0] == -1.0 and out["reversed"][-8, -1] == -1.0
    out["odd"][0] = 5.0
    assert (restored[1] == 5.0).all() and (out["rows"][1] == 5.0).all()


def test_a_save_of_many_views_writes_their_owner_once_and_their_offsets() -> None:
    # Linear in the data, not in the number of views: the owner's bytes once, 8 bytes of offset
    # per view, and a pickle whose size does not grow with the views (one table record).
    owner = np.random.default_rng(0).standard_normal((100_000, 16))
    sizes = {}
    for n in (10_000, 100_000):
        dumped = _dump({"rows": [owner[i].reshape(16, 1) for i in range(n)]})
        assert sorted(len(blob) for blob in dumped.blobs.values()) == [8 * n, owner.nbytes]
        sizes[n] = len(dumped.data)
    assert sizes[100_000] < 1_000 and sizes[100_000] - sizes[10_000] < 8  # wider integers
    out = _load(dumped)
    assert len(out["rows"]) == 100_000 and out["rows"][-1].base.shape == owner.shape


def _data_set(n: int = 600) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Nielsen's network2.py shape: (row view, one-hot target) pairs."""
    images = np.random.default_rng(1).random((n, 12)).astype(np.float32)
    targets = [np.eye(10)[[i % 10]].T.copy() for i in range(n)]
    return images, list(zip([images[i].reshape(12, 1) for i in range(n)], targets, strict=True))


def test_a_table_keeps_the_identity_of_what_it_holds() -> None:
    images, training = _data_set()
    random.Random(3).shuffle(training)
    batches = [training[k:k + 10] for k in range(0, len(training), 10)]
    labels = list(map(np.int64, range(200)))
    payload = {
        "x": training[3][0],  # pickled before the table: the table writes it in its record
        "batches": batches,  # numbers the pairs and their arrays
        "training": training,  # the same pairs: their positions in the table above
        "batch": batches[4],  # a list the table holds
        "y": training[5][1],  # after the table: its position
        "validation": list(zip([images[i].reshape(12, 1) for i in range(100)], labels[:100],
                               strict=True)),
        "ints": list(range(-50, 50)), "floats": [i / 7 for i in range(50)],
        "flags": [i % 3 == 0 for i in range(40)], "big": [2 ** 70 + i for i in range(40)],
        "labels": labels,
    }
    out = _round_trip(payload)
    assert out["batches"][0][0] is out["training"][0]
    assert out["batch"] is out["batches"][4]
    assert out["x"] is out["training"][3][0] and out["y"] is out["training"][5][1]
    owner = out["training"][0][0].base
    for (x, y), (x0, y0) in zip(out["training"], training, strict=True):
        _same_array(x, x0)
        _same_array(y, y0)
        assert x.base is owner and y.flags.owndata
    assert out["validation"][0][0].base is owner
    for name in ("ints", "floats", "flags", "big", "labels"):
        assert out[name] == payload[name]
        assert [type(v) for v in out[name]] == [type(v) for v in payload[name]], name
    # a target updated in place is the one every list holds
    out["y"][0] = 9.0
    assert out["training"][5][1][0] == 9.0


def test_an_unchanged_table_is_written_again_only_as_it_still_is() -> None:
    # The second save reuses the first's plan of each table while the table holds the same
    # objects; anything the program changed in between must be seen.
    images, training = _data_set(300)
    batches = [training[k:k + 10] for k in range(0, len(training), 10)]
    memo = BlobMemo()

    def save_and_load() -> Any:
        dumped = _dump({"training": training, "batches": batches}, memo=memo)
        out = _load(dumped)
        assert [[len(b) for b in out["batches"]]] == [[len(b) for b in batches]]
        for (x, y), (x0, y0) in zip(out["training"], training, strict=True):
            _same_array(x, x0)
            _same_array(y, y0)
        for batch, batch0 in zip(out["batches"], batches, strict=True):
            for pair, pair0 in zip(batch, batch0, strict=True):
                _same_array(pair[0], pair0[0])
        return out

    save_and_load()
    save_and_load()  # nothing changed
    training[0][0].shape = (3, 4)  # a view reshaped in place
    save_and_load()
    training[1][1][...] = 7.0  # a target written in place
    images[2] += 1.0  # the owner written in place
    assert save_and_load()["training"][1][1][0, 0] == 7.0
    batches[3].append(training[0])  # a list inside a table changed
    batches[4].pop()
    save_and_load()
    random.Random(0).shuffle(training)  # the table's own list changed
    save_and_load()
    training[7] = (training[7][0], np.zeros((10, 1)))
    save_and_load()


def test_lists_that_are_not_a_table_round_trip_exactly() -> None:
    a = np.arange(64.0).reshape(8, 8).copy()
    b = np.arange(64.0).reshape(8, 8).copy()
    twice = a[1]
    cases = {
        "mixed": [a[i % 8] if i % 2 else float(i) for i in range(40)],
        "shapes": [a[i % 8, : 1 + i % 7] for i in range(40)],
        "twice": [twice] * 40,
        "two owners": [(a if i % 2 else b)[i % 8] for i in range(40)],
        "columns": [a[:, i % 8] for i in range(40)],  # not contiguous: addresses one by one
        "objects": [np.array([i, None], dtype=object) for i in range(40)],
        "owner and its rows": [a, *[a[i % 8] for i in range(40)]],
    }
    out = _round_trip({**cases, "a": a, "b": b})
    for name, values in cases.items():
        for restored, original in zip(out[name], values, strict=True):
            if isinstance(original, np.ndarray):
                assert restored.shape == original.shape and restored.dtype == original.dtype
                assert (restored == original).all(), name
            else:
                assert restored == original
    assert all(v is out["twice"][0] for v in out["twice"])
    assert out["columns"][0].base is out["a"] and out["two owners"][0].base is out["b"]
    mixed = out["owner and its rows"]
    assert mixed[0] is out["a"] and mixed[1].base is out["a"]


class _Sub(np.ndarray):
    pass


def _targets_and_a_buffer_over_one(owner: np.ndarray) -> list[Any]:
    targets = [np.full(3, float(i)) for i in range(40)]  # a table of owners
    return [targets, np.frombuffer(targets[17].data, dtype=targets[17].dtype)]


@pytest.mark.parametrize("make", [
    lambda owner: [owner, np.frombuffer(owner.data, dtype=owner.dtype)],  # one buffer, two owners
    lambda owner: [owner[2:5], owner[:4].view(_Sub)],  # a subclass: pickled as a copy
    lambda owner: [owner[3], np.frombuffer(owner.data, dtype=owner.dtype)[20:30]],
    _targets_and_a_buffer_over_one,
], ids=["frombuffer", "subclass", "a view of another owner's buffer", "an owner in a table"])
def test_memory_that_would_stop_being_shared_is_refused(make: Any) -> None:
    owner = np.arange(40.0).reshape(4, 10).copy()
    with pytest.raises(pickle.PicklingError, match="share memory"):
        _dump({"values": make(owner)})


def test_disjoint_copies_are_saved() -> None:
    owner = np.arange(40.0).reshape(4, 10).copy()
    raw = np.frombuffer(bytearray(owner.tobytes()), dtype=owner.dtype)
    out = _round_trip({"values": [owner[1], raw[:5], raw[10:15], owner]})
    assert out["values"][0].base is out["values"][3]
    assert np.array_equal(out["values"][1], raw[:5])


def test_views_of_an_anchor_come_back_as_views_of_the_rebuilt_array() -> None:
    anchor = np.arange(30.0).reshape(10, 3).copy()
    rows = [anchor[i] for i in range(10)]
    token = ("l", "data")
    dumped = _dump({"rows": rows, "state": ArrayContent(anchor),
                    "first": anchor[0]}, {id(anchor): token})
    rebuilt = np.zeros((10, 3))
    out = _load(dumped, {token: rebuilt})
    assert all(row.base is rebuilt for row in out["rows"]) and out["first"].base is rebuilt
    assert np.array_equal(out["state"], anchor) and out["state"].base is None
    rebuilt[...] = out["state"]  # what restoring the anchor in place does
    assert np.array_equal(out["rows"][4], anchor[4])


def test_a_saved_view_inside_an_anchor_that_is_itself_a_view_is_refused() -> None:
    # The anchor is the caller's `owner[:5]`: rebuilt, it lies in the caller's new array, not in
    # the restored copy of `owner` that the saved view would belong to.
    owner = np.arange(40.0)
    part = owner[:5]
    with pytest.raises(pickle.PicklingError, match="share memory"):
        _dump({"view": owner[2:8], "state": ArrayContent(part)}, {id(part): ("l", "part")})


@pytest.mark.parametrize("spec", [
    ("views", None, "<f8", (2,), (8,), b"\0" * 8, None, 0),
    ("owners", "|O", (2,), b"\0" * 16, None, 0),
    ("numbers", "python", "<f8", b"\0" * 7),
    ("items", 3, b"\0" * 8),
    ("tuples", 2, [("empty",)], None, 0),
])
def test_a_damaged_table_is_refused(spec: tuple[Any, ...]) -> None:
    with pytest.raises(pickle.UnpicklingError):
        TableReader().table("list", spec, 1)


def test_a_forged_table_of_object_arrays_cannot_be_loaded() -> None:
    dumped = _dump({"rows": [np.zeros(3) for _ in range(40)]})
    forged = dumped.data.replace(b"<f8", b"|O8")
    with pytest.raises(CheckpointError, match="refused"):
        loads(forged, {}, dumped.globals, dumped.blobs.__getitem__)


# --------------------------------------------------------------------------- programs

VIEWS_OF_A_PARAMETER = """
import numpy as np
from transform import _checkpoint

def train(data, steps):
    rows = [data[i].reshape(4, 1) for i in range(len(data))]
    w = np.zeros((4, 1))
    for step in range(steps):
        _iterations: 6
        w += rows[step * 7] * 0.5
        data[step] *= 2.0  # through the parameter: every view sees it
        rows[step + 20][0, 0] = -step  # through a view: the parameter sees it
        _checkpoint()
    return w, rows

data = np.arange(400.0).reshape(100, 4).copy()
w, rows = train(data, 6)
print(w.ravel().tolist(), [r.ravel().tolist() for r in rows[:8]], data[20:26, 0].tolist())
"""


def test_views_of_a_parameter_resume_as_views_of_the_rebuilt_parameter(tmp_path) -> None:
    original, program, env = prepare(tmp_path, VIEWS_OF_A_PARAMETER, "--all-hints")
    assert resume_after(program, env, "3") == original_output(original, env)


SHARED_VIEW = """
import numpy as np
from transform import _checkpoint

params = np.zeros(8)
head = params[:4]
for step in range(10):
    params += 1.0
    head *= 0.5
    _checkpoint()
print(params, head)
"""


def test_a_view_and_its_owner_resume_sharing_memory(tmp_path) -> None:
    # Pickled apart they would stop sharing (before, such a state was refused).
    original, program, env = prepare(tmp_path, SHARED_VIEW, "--all-hints")
    assert resume_after(program, env, "4") == original_output(original, env)


SHARED_BUFFER = """
import numpy as np
from transform import _checkpoint

raw = bytearray(64)
a = np.frombuffer(raw, dtype=np.float64)
b = a[2:]
for step in range(10):
    a += 1.0
    b *= 0.5
    _checkpoint()
print(a, b)
"""


def test_arrays_over_a_buffer_no_array_owns_are_refused_at_the_first_save(tmp_path) -> None:
    _, program, env = prepare(tmp_path, SHARED_BUFFER, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert line.splitlines() == [line], done.stderr
    assert line.startswith("ecrl-transform: original.py:11: cannot save the live values at this "
                           "checkpoint") and "share memory" in line, line
