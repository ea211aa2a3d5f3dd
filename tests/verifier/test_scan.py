"""The step-log scanner: the fast path never reads a block differently from the slow path.

Every test here runs twice: with the compiled kernels (``verifier/_native.c``,
``ecrl/contract/_native.c``) and with their numpy versions, which a build without a C compiler
runs; each must agree with the slow path on its own.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import StepRecord
from verifier._scan import PREFIX_KEYS, RankLog
from verifier._testing.generate import RunSpec, generate_run

GEOMETRY = semantics.Geometry(dataset_size=40, global_batch=4)


@pytest.fixture(scope="module", autouse=True, params=["compiled", "numpy"])
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which fast path the module's tests read with (module-scoped: hypothesis's tests share
    it). ``numpy``: the compiled kernels are hidden, as in a build without a C compiler."""
    import verifier._rests as rests
    import verifier._scan as scan

    holders = (scan, rests, semantics)
    if request.param == "compiled":
        assert all(holder.native is not None for holder in holders), "kernels not built"
        yield request.param
        return
    saved = [holder.native for holder in holders]
    for holder in holders:
        holder.native = None  # type: ignore[attr-defined]
    try:
        yield request.param
    finally:
        for holder, module in zip(holders, saved, strict=True):
            holder.native = module  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, bytes]:
    """One rank log (attempt 1, rank 1 of 2, steps 5..) with and without sample IDs."""
    out = {}
    for ids in (True, False):
        spec = RunSpec(dataset_size=40, global_batch=4, target_steps=30, world_sizes=(1, 2),
                       fail_at=(6,), ckpt_every=5, log_ids=ids, chaos=1, seed=3)
        run = generate_run(spec, tmp_path_factory.mktemp("scan") / "run")
        out[ids] = run.paths.rank_log(1, 1).read_bytes()
    return out


def read(path: Path, *, log_ids: bool, fast: bool, block: int, torn_ok: bool = False
         ) -> tuple[list[tuple[Any, ...]], int]:
    """Every record as a tuple of all its fields, as either path reads it."""
    log = RankLog(path, attempt=1, rank=1, world_size=2, local_batch=2, geometry=GEOMETRY,
                  seed=3, torn_ok=torn_ok, start_step=5, log_ids=log_ids, want_loss=True,
                  block=block, fast=fast)
    rows: list[tuple[Any, ...]] = []
    for batch in log.batches():
        for i in range(len(batch)):
            step = int(batch.steps[i])
            if batch.fast:
                epoch, cursor = GEOMETRY.locate(step)
                ints = (1, step, epoch, cursor, 1, 2, 2, 2)
                digest = int(semantics.shard_hashes(GEOMETRY, 3, [step], 1, 2)[0])
            else:
                assert batch.ints is not None and batch.hashes is not None
                ints = tuple(int(x) for x in batch.ints[i])
                digest = int(batch.hashes[i])
            assert batch.loss is not None
            loss = float(batch.loss[i])
            if batch.id_block is not None:
                ids = batch.id_block[i]
            else:
                ids = batch.ids[i] if batch.ids is not None else None
            rows.append((batch.first_line + i, *ints, digest, None if math.isnan(loss) else loss,
                         float(batch.time[i]), None if ids is None else tuple(ids.tolist())))
    return rows, log.fast_records


def outcome(path: Path, **kwargs: Any) -> tuple[str, Any]:
    try:
        rows, _ = read(path, **kwargs)
    except RunFormatError as exc:
        return "error", str(exc)
    return "ok", rows


def test_prefix_keys_are_what_the_writer_writes_first() -> None:
    record = StepRecord(attempt=0, global_step=0, epoch=0, cursor_step=0, rank=0, world_size=1,
                        local_batch=1, sample_ids_count=1, sample_ids_hash="0" * 16, loss=1.0,
                        time=0.0, sample_ids=[3], extra={"step_s": 0.1})
    assert tuple(record.to_dict())[:10] == PREFIX_KEYS


@pytest.mark.parametrize("ids", [True, False])
@pytest.mark.parametrize("block", [64, 300, 1 << 20])
def test_runtime_output_takes_the_fast_path(logs: dict[bool, bytes], tmp_path: Path, ids: bool,
                                            block: int) -> None:
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[ids])
    fast_rows, fast = read(path, log_ids=ids, fast=True, block=block)
    slow_rows, none = read(path, log_ids=ids, fast=False, block=block)
    assert fast_rows == slow_rows and len(fast_rows) == logs[ids].count(b"\n")
    assert none == 0
    assert fast == len(fast_rows) or block == 64  # a 64-byte block never holds a whole line


EDIT_BYTES = b'{}[]",:0123456789abcdefnlrstu -.\n\\'


@st.composite
def edits(draw: st.DrawFn) -> list[tuple[int, str, bytes]]:
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        ops.append((draw(st.integers(0, 10**6)),
                    draw(st.sampled_from(["replace", "insert", "delete"])),
                    draw(st.binary(min_size=1, max_size=3).map(
                        lambda b: bytes(EDIT_BYTES[x % len(EDIT_BYTES)] for x in b)))))
    return ops


def edited(data: bytes, ops: list[tuple[int, str, bytes]]) -> bytes:
    buf = bytearray(data)
    for position, op, payload in ops:
        at = position % (len(buf) + 1)
        if op == "replace":
            buf[at : at + len(payload)] = payload
        elif op == "insert":
            buf[at:at] = payload
        else:
            del buf[at : at + len(payload)]
    return bytes(buf)


TRICKY = [
    (b'"sample_ids_hash":"', b'"sample_ids_hash":"0'),     # one hash digit too many
    (b'"loss":', b'"global_step":99,"loss":'),             # a checked key repeated later
    (b'"step_s":0.05}', b'"step_s":0.05,}'),               # trailing comma
    (b',"loss":', b',}{"loss":'),                          # an object split in two
    (b'"step_s":0.05}', b'"step_s":"}{"}'),                # braces inside a string
    (b'"loss":', b'"loss":true,"x":'),                     # a bool where a number belongs
    (b'"loss":', b'"loss":null,"x":'),                     # null loss is allowed
    (b'"time":', b'"time":"1",'),                          # a string time
    (b'"step_s":0.05}', b'"step_s":0.05}\r'),              # a carriage return
    (b'"step_s":0.05}', b'"step_s":[0.05,'),               # an array left open
    # The rest of a line read as columns (verifier._rests): numbers JSON reads or refuses.
    (b'"loss":', b'"loss":+'),                             # a plus sign (not JSON)
    (b'"loss":', b'"loss":0'),                             # a leading zero
    (b'"loss":', b'"loss":-'),                             # a negative loss
    (b'"loss":', b'"loss":-0,"y":'),                       # -0: the integer 0
    (b'"loss":', b'"loss":-0.0,"y":'),                     # -0.0: a float
    (b'"loss":', b'"loss": '),                             # a blank before a number
    (b'"step_s":0.05}', b'"step_s":5e-2}'),                # an exponent
    (b'"step_s":0.05}', b'"step_s":5E+2}'),                # an exponent with a plus sign
    (b'"step_s":0.05}', b'"step_s":5e}'),                  # an exponent without digits
    (b'"step_s":0.05}', b'"step_s":.05}'),                 # no integer part
    (b'"step_s":0.05}', b'"step_s":1e400}'),               # beyond float64's range
    (b'"step_s":0.05}', b'"step_s":123456789012345678901234567890}'),  # beyond int64's
    (b'"step_s":0.05}', b'"step_s":1-2}'),                 # a sign inside a number
    (b'"step_s":0.05}', b'"step_s":[]}'),                  # an empty list
    (b'"step_s":0.05}', b'"step_s":[1]}'),                 # a list that is not empty
    (b'"step_s":0.05}', b'"step_s":0.05,"step_s":1}'),     # a key repeated
    (b'"step_s":', b'"step:s":'),                          # a colon inside a key
    (b'"step_s":', b'"step,s":'),                          # a comma inside a key
    (b'"step_s":0.05}', b'"step_s":0.05,"z":1,"z2":2}'),   # more numbers
    (b'"loss":', b'"lost":'),                              # another key
    (b'"time":', b'"time":1,"t":'),                        # a key more
]


def replaced(data: bytes, old: bytes, new: bytes, where: str) -> bytes:
    """``old`` replaced by ``new`` in the first line that has it, the last, or every line."""
    assert old in data
    if where == "first":
        return data.replace(old, new, 1)
    if where == "last":
        return new.join(data.rsplit(old, 1))
    return data.replace(old, new)


@pytest.mark.parametrize(("old", "new"), TRICKY)
@pytest.mark.parametrize("where", ["first", "last", "every"])
def test_tricky_edits_read_the_same_both_ways(logs: dict[bool, bytes], tmp_path: Path, old: bytes,
                                             new: bytes, where: str) -> None:
    data = replaced(logs[False], old, new, where)
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(data)
    for block in (200, 1 << 20):
        assert outcome(path, log_ids=False, fast=True, block=block) == \
            outcome(path, log_ids=False, fast=False, block=block)


TRICKY_IDS = [
    (b'"sample_ids":[', b'"sample_ids":[ '),                   # a blank
    (b'"sample_ids":[', b'"sample_ids":[0'),                   # a leading zero
    (b'"sample_ids":[', b'"sample_ids":[-'),                   # a sign
    (b'"sample_ids":[', b'"sample_ids":[+'),                   # a plus sign (not JSON)
    (b'"sample_ids":[', b'"sample_ids":[,'),                   # an empty first field
    (b'],"step_s"', b',],"step_s"'),                           # a trailing comma
    (b'"sample_ids":[', b'"sample_ids":[['),                   # a nested list
    (b'"sample_ids":[', b'"sample_ids":[1,'),                  # one ID too many
    (b'],"step_s"', b'.0],"step_s"'),                          # a float
    (b'],"step_s"', b'e0],"step_s"'),                          # an exponent
    (b'"sample_ids":[', b'"sample_ids":[],"sample_ids":['),    # the key repeated
    (b'"loss":', b'"x":{"sample_ids":[1,2]},"loss":'),         # a nested key as well
    (b'"loss":', b'"x\\"sample_ids":[1,2],"loss":'),        # a key that ends in the name
    (b'"sample_ids":', b'"sample_idz":'),                      # the key missing
]


@pytest.mark.parametrize(("old", "new"), TRICKY_IDS)
@pytest.mark.parametrize("where", ["first", "last", "every"])
def test_tricky_id_lists_read_the_same_both_ways(logs: dict[bool, bytes], tmp_path: Path,
                                                 old: bytes, new: bytes, where: str) -> None:
    data = replaced(logs[True], old, new, where)
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(data)
    for block in (200, 1 << 20):
        # Quietly: numpy's number reader warns about what it cannot read; the fast path must
        # refuse such text before handing it over.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert outcome(path, log_ids=True, fast=True, block=block) == \
                outcome(path, log_ids=True, fast=False, block=block)


WRONG_VALUE_KEYS = ["attempt", "global_step", "epoch", "cursor_step", "rank", "world_size",
                    "local_batch", "sample_ids_count", "sample_ids_hash", "sample_ids",
                    "sample_ids,"]
"""Fields whose value a test changes in place (``sample_ids``: the list's first ID, ``sample_ids,``
its second), keeping the text's width: only a comparison of values can tell."""


def wrong_value(data: bytes, key: str, where: str) -> bytes:
    """``data`` with the last digit of ``key``'s value (a hex digit for the hash) changed in the
    first, the last or every line."""
    name, second = key.rstrip(","), key.endswith(",")
    opening = {"sample_ids_hash": b'":"', "sample_ids": b'":['}.get(name, b'":')
    lines = data.split(b"\n")
    chosen = {"first": [0], "last": [len(lines) - 2], "every": range(len(lines) - 1)}[where]
    for i in chosen:
        line = bytearray(lines[i])
        at = line.index(b'"' + name.encode() + opening) + len(name) + 1 + len(opening)
        if second:
            at = line.index(b",", at) + 1
        while chr(line[at + 1]) in "0123456789abcdef":
            at += 1
        line[at] = ord("1") if line[at] == ord("0") else ord("0")
        lines[i] = bytes(line)
    return b"\n".join(lines)


@pytest.mark.parametrize("key", WRONG_VALUE_KEYS)
@pytest.mark.parametrize("where", ["first", "last", "every"])
def test_a_wrong_value_of_the_right_width_is_never_proven(
        logs: dict[bool, bytes], tmp_path: Path, key: str, where: str) -> None:
    """Each field the fast path proves, changed to another value written as wide: the fast
    path reads what the slow path reads (the record as written, which the checker rejects)."""
    for ids in (True, False) if key.rstrip(",") != "sample_ids" else (True,):
        original, path = tmp_path / f"original-{ids}.jsonl", tmp_path / f"rank-{ids}.jsonl"
        original.write_bytes(logs[ids])
        path.write_bytes(wrong_value(logs[ids], key, where))
        fast = outcome(path, log_ids=ids, fast=True, block=1 << 20)
        assert fast == outcome(path, log_ids=ids, fast=False, block=1 << 20)
        assert fast != outcome(original, log_ids=ids, fast=True, block=1 << 20)


def test_logged_ids_are_proven_without_parsing_them(logs: dict[bool, bytes], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's ID lists are proven from their bytes: no block falls back to comparing
    parsed lists (which would be as correct, but slower)."""
    proven = []
    parse_rests = RankLog._parse_rests

    def spy(self: RankLog, *args: Any, ids_proven: bool) -> Any:
        proven.append(ids_proven)
        return parse_rests(self, *args, ids_proven=ids_proven)

    monkeypatch.setattr(RankLog, "_parse_rests", spy)
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[True])
    rows, fast = read(path, log_ids=True, fast=True, block=1 << 20)
    assert fast == len(rows) > 0 and proven == [True]


def test_runtime_rests_are_read_as_columns(logs: dict[bool, bytes], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What is left of the runtime's lines (loss, time, extra numbers) is read from its bytes,
    not parsed into a dict per line."""
    import verifier._scan as scan

    read_as_columns = []

    def spy(*args: Any) -> Any:
        got = numeric_rests(*args)
        read_as_columns.append(got is not None)
        return got

    numeric_rests = scan.numeric_rests
    monkeypatch.setattr(scan, "numeric_rests", spy)
    for ids in (True, False):
        path = tmp_path / f"rank-{ids}.jsonl"
        path.write_bytes(logs[ids])
        rows, fast = read(path, log_ids=ids, fast=True, block=1 << 20)
        assert fast == len(rows) > 0
    assert read_as_columns == [True, True]


NUMBER_BYTES = b"0123456789.eE+-"


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=8).map(
    lambda b: bytes(NUMBER_BYTES[x % len(NUMBER_BYTES)] for x in b)),
    st.sampled_from([b"1", b"0.5", b"-2e-3", b"[]"])), min_size=1, max_size=6))
@example([(b"-0.0", b"1"), (b"-0", b"[]")])
@example([(b"1.5E-3", b"1"), (b"-12e+2", b"1"), (b"0", b"1")])
@example([(b"1e400", b"1")])
@example([(b"01", b"1")])
@example([(b"+1", b"1")])
@example([(b"1.", b"1")])
@example([(b"123456789012345678901234567890", b"1")])
def test_rest_columns_are_what_json_reads(lines: list[tuple[bytes, bytes]]) -> None:
    """Number-like bytes in the rests: read as columns only if JSON reads them, and then as
    JSON reads them (-0 the integer 0, bools never, 1e400 refused)."""
    import orjson

    from verifier._rests import numeric_rests

    second = lines[0][1]
    text = b"\n" + b"".join(b'{"loss":' + a + b',"t":' + second + b'}\n' for a, _ in lines)
    got = numeric_rests(np.frombuffer(text, dtype=np.uint8).copy(), len(lines))
    try:
        parsed = [orjson.loads(line) for line in text.split(b"\n")[1:-1]]
    except orjson.JSONDecodeError:
        assert got is None
        return
    if got is None:
        return  # refusing is always allowed: the caller then parses the lines
    first, columns = got
    assert first == parsed[0]
    expected = np.array([p["loss"] for p in parsed], dtype=np.float64)
    assert columns["loss"].tobytes() == expected.tobytes()  # bit for bit: -0.0 stays -0.0


@given(st.booleans(), edits(), st.sampled_from([97, 1000, 1 << 20]), st.booleans())
@example(False, [(5, "replace", b"}")], 1 << 20, False)
def test_fast_path_never_reads_differently(logs: dict[bool, bytes], tmp_path_factory: Any,
                                           ids: bool, ops: list[tuple[int, str, bytes]],
                                           block: int, torn_ok: bool) -> None:
    path = tmp_path_factory.mktemp("edit") / "rank-001.jsonl"
    path.write_bytes(edited(logs[ids], ops))
    kwargs = {"log_ids": ids, "block": block, "torn_ok": torn_ok}
    assert outcome(path, fast=True, **kwargs) == outcome(path, fast=False, **kwargs)


def test_torn_tail_is_tolerated_only_after_a_crash(logs: dict[bool, bytes], tmp_path: Path
                                                   ) -> None:
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[False] + b'{"schema_version":1,"att')
    lines = logs[False].count(b"\n")
    log = RankLog(path, attempt=1, rank=1, world_size=2, local_batch=2, geometry=GEOMETRY,
                  seed=3, torn_ok=True, start_step=5, log_ids=False, want_loss=False)
    assert sum(len(b) for b in log.batches()) == lines
    assert log.torn == (lines + 1, '{"schema_version":1,"att')
    with pytest.raises(RunFormatError, match=rf"rank-001.jsonl:{lines + 1}: last line is "
                                             "incomplete"):
        read(path, log_ids=False, fast=True, block=1 << 20)


def test_empty_line_is_an_error_at_its_line(logs: dict[bool, bytes], tmp_path: Path) -> None:
    path = tmp_path / "rank-001.jsonl"
    first, rest = logs[False].split(b"\n", 1)
    path.write_bytes(first + b"\n\n" + rest)
    with pytest.raises(RunFormatError, match=r"rank-001.jsonl:2: empty line"):
        read(path, log_ids=False, fast=True, block=1 << 20)


def test_huge_integers_are_a_schema_error(logs: dict[bool, bytes], tmp_path: Path) -> None:
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[False].replace(b'"epoch":', b'"epoch":18446744073709551615,"e":', 1))
    assert outcome(path, log_ids=False, fast=True, block=1 << 20) == \
        outcome(path, log_ids=False, fast=False, block=1 << 20)
    data = logs[False].replace(b'"epoch":1,', b'"epoch":18446744073709551615,', 1)
    path.write_bytes(data)
    kind, message = outcome(path, log_ids=False, fast=True, block=1 << 20)
    assert kind == "error" and "too large" in message


@pytest.mark.parametrize("where", ["first", "last"])
def test_an_empty_number_of_the_right_length_is_not_proven(logs: dict[bool, bytes],
                                                           tmp_path: Path, where: str) -> None:
    """A digit of the first list turned into a comma (its length unchanged): an empty number
    at the list's start or end is refused before numpy's reader sees it (which would warn)."""
    data = bytearray(logs[True])
    start = data.index(b'"sample_ids":[') + len(b'"sample_ids":[')
    data[start if where == "first" else data.index(b"]", start) - 1] = ord(",")
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kind, _ = outcome(path, log_ids=True, fast=True, block=1 << 20)
        assert (kind, _) == outcome(path, log_ids=True, fast=False, block=1 << 20)
    assert kind == "error"


@pytest.mark.parametrize("zeros", [0, 1])
def test_an_id_moved_to_the_next_line_is_not_proven(logs: dict[bool, bytes], tmp_path: Path,
                                                    zeros: int) -> None:
    """The IDs of the whole block in their order, but one line's last ID written into the next
    line's list (with a leading zero making up the first list's lost length, when ``zeros``):
    the fast path must not take the block for the runtime's."""
    first, second, rest = logs[True].split(b"\n", 2)
    key = b'"sample_ids":['
    head1, ids1 = first.split(key, 1)
    head2, ids2 = second.split(key, 1)
    numbers, tail1 = ids1.split(b"]", 1)
    *kept, moved = numbers.split(b",")
    pad = b"0" * (zeros * (len(moved) + 1))
    first = head1 + key + pad + b",".join(kept) + b"]" + tail1
    second = head2 + key + moved + b"," + ids2
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(b"\n".join([first, second, rest]))
    kind, rows = outcome(path, log_ids=True, fast=True, block=1 << 20)
    assert (kind, rows) == outcome(path, log_ids=True, fast=False, block=1 << 20)
    assert kind == "error" or len(rows[0][-1]) == 1


def test_an_id_that_wraps_to_the_expected_one_is_not_proven(logs: dict[bool, bytes],
                                                               tmp_path: Path) -> None:
    """2^64 + x is not x: the fast path's number reader must not accept a value that only
    equals the expected ID modulo 2^64 (the slow path refuses it: JSON reads it as a float)."""
    first = logs[True].split(b"\n", 1)[0]
    head, ids = first.split(b'"sample_ids":[', 1)
    x, rest = ids.split(b",", 1)
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[True].replace(first, head + b'"sample_ids":[' + str(2**64 + int(x))
                                        .encode() + b"," + rest, 1))
    kind, message = outcome(path, log_ids=True, fast=True, block=1 << 20)
    assert (kind, message) == outcome(path, log_ids=True, fast=False, block=1 << 20)
    assert kind == "error" and "rank-001.jsonl:1: field 'sample_ids'" in message


def test_ids_beyond_int64_are_out_of_range(logs: dict[bool, bytes], tmp_path: Path) -> None:
    path = tmp_path / "rank-001.jsonl"
    path.write_bytes(logs[True].replace(b'"sample_ids":[', b'"sample_ids":[18446744073709551615,',
                                        1))
    rows, _ = read(path, log_ids=True, fast=True, block=1 << 20)
    assert rows[0][-1][0] == -1 and np.all(np.array(rows[1][-1]) >= 0)
