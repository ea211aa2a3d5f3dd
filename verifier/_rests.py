"""The rest of each line of a block, read by its bytes (the scan's fast path, :mod:`._scan`).

Once the fast path has proven each line's prefix and ID list, what is left of a line is a small
object such as ``{"loss":2.43,"time":1795392000.55,"sample_ids":[],"step_s":0.05}``. Parsing a
million of them into dicts, only to take two numbers out of each, cost a quarter of the
verification of a run that logs every sample ID. :func:`numeric_rests` reads them as columns
instead, and only when the bytes prove that a JSON parser would read exactly those numbers:

- the first line is parsed; its keys are distinct and hold no ``:`` or ``,`` (it has exactly one
  colon per key and one comma between values), and each value is a number or ``[]``;
- every line has the first line's bytes except where the first line has a number (its colons
  and commas split it into the same keys in the same order, and what is left after cutting out
  the numbers is the first line's text);
- the cut-out values hold only the bytes of numbers (digits, ``.``, ``e``, ``E``, ``+``,
  ``-``), and read as one JSON array they are exactly as many numbers as were cut out: the same
  parser then proves each one a JSON number and reads it as it would in its line (``-0`` the
  integer 0, ``1e400`` refused), without building a dict per line.

Anything else (a ``null`` loss, a string value, a key in another order) returns None, and the
caller parses the lines as JSON.

Where ``verifier._native`` was built, the first line is checked here and the others are matched
against its skeleton in compiled code, one pass (``number_columns``): each line must be the
first one's bytes with only number bytes where it has numbers, which is the same condition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ecrl.contract.runformat import loads

try:  # the lines matched in compiled code (an optional build, setup.py); else with numpy
    import verifier._native as native
except ImportError:  # pragma: no cover - a build without a C compiler
    native = None  # type: ignore[assignment]

__all__ = ["numeric_rests"]

_NL, _COLON, _COMMA, _LBRACE, _RBRACE = (ord(c) for c in "\n:,{}")
_ZERO, _NINE = ord("0"), ord("9")
_DOT, _MINUS, _PLUS, _LOWER_E, _RBRACKET = (ord(c) for c in ".-+e]")
_EMPTY_LIST = b"[]"


def numeric_rests(rest: npt.NDArray[np.uint8], n: int
                  ) -> tuple[dict[str, Any], dict[str, npt.NDArray[np.float64]]] | None:
    """``rest``: a newline, then ``n`` lines each ending with a newline. Returns the first
    line's object and, for each key whose values are numbers, its column (float64), or None
    when the lines are not all provably of the first one's shape."""
    if native is not None:
        return _native_rests(rest, n)
    nls = np.flatnonzero(rest == _NL)
    if nls.size != n + 1 or nls[0] != 0 or nls[-1] != rest.size - 1:
        return None
    first = _first_object(rest[1 : nls[1]].tobytes())
    if first is None:
        return None
    m = len(first)
    colon_at = np.flatnonzero(rest == _COLON)
    comma_at = np.flatnonzero(rest == _COMMA)
    if colon_at.size != n * m or comma_at.size != n * (m - 1):
        return None
    colons = colon_at.reshape(n, m)
    commas = comma_at.reshape(n, m - 1)
    opens, closes = nls[:-1] + 1, nls[1:] - 1
    # m colons per line, and m - 1 commas each between two of the line's colons.
    if not (np.all(colons[:, 0] > opens) and np.all(colons[:, -1] < closes)
            and np.all(commas > colons[:, :-1]) and np.all(commas < colons[:, 1:])
            and np.all(rest[opens] == _LBRACE) and np.all(rest[closes] == _RBRACE)):
        return None
    # Value j of a line: after its colon, up to (and with) the comma or brace that ends it.
    ends = np.concatenate([commas, closes[:, None]], axis=1)
    line1 = rest[: nls[1] + 1].tobytes()
    cols = _number_values(first, line1, colons[0].tolist(), ends[0].tolist())
    if cols is None:
        return None
    starts = (colons[:, cols] + 1).ravel()
    stops = ends[:, cols].ravel()  # inclusive: each value's terminator
    # The values' bytes, each with its terminator, back to back; the rest is the skeleton.
    spans = np.empty(2 * starts.size + 1, dtype=np.int64)
    spans[0] = starts[0]
    spans[1:-1:2] = stops - starts + 1
    spans[2:-1:2] = starts[1:] - stops[:-1] - 1
    spans[-1] = rest.size - stops[-1] - 1
    if np.any(spans < 0):
        return None
    inside = np.zeros(spans.size, dtype=bool)
    inside[1::2] = True
    mask = np.repeat(inside, spans)
    skeleton = rest[~mask]
    width = (skeleton.size - 1) // n
    if skeleton.size != n * width + 1 or not np.array_equal(
            skeleton[1:].reshape(n, width), np.broadcast_to(skeleton[1 : width + 1], (n, width))):
        return None
    text = rest[mask]
    cut = np.cumsum(spans[1:-1:2]) - 1  # each value's terminator
    # Only number bytes inside the values; the parser then proves each a JSON number (and
    # reads it as it reads the whole line: -0 an integer 0, 1e400 refused).
    allowed = (((text >= _ZERO) & (text <= _NINE)) | (text == _DOT) | (text == _MINUS)
               | (text == _PLUS) | ((text | 0x20) == _LOWER_E))
    allowed[cut] = True
    if not np.all(allowed):
        return None
    text[cut] = _COMMA
    text[-1] = _RBRACKET
    return _columns(first, cols, b"[" + text.tobytes(), n)


def _first_object(line: bytes) -> dict[str, Any] | None:
    """The first line's object: a non-empty JSON object, else None."""
    try:
        first = loads(line)
    except Exception:
        return None
    return first if isinstance(first, dict) and first else None


def _number_values(first: Any, line: bytes, colons: list[int], ends: list[int]
                   ) -> list[int] | None:
    """Which values of the first line (value j: ``line[colons[j] + 1 : ends[j]]``) are
    numbers; None unless each is a number or ``[]`` and at least one is a number."""
    numeric = [line[c + 1 : e] != _EMPTY_LIST for c, e in zip(colons, ends, strict=True)]
    if any(not (type(v) in (int, float) if num else v == []) for v, num in zip(
            first.values(), numeric, strict=True)):
        return None
    cols = [j for j in range(len(numeric)) if numeric[j]]
    return cols or None


def _columns(first: dict[str, Any], cols: list[int], numbers_json: bytes, n: int
             ) -> tuple[dict[str, Any], dict[str, npt.NDArray[np.float64]]] | None:
    """The columns from the numbers of every line, back to back in one JSON array: the parser
    proves each a JSON number and reads it as it would in its line (``-0`` the integer 0,
    ``1e400`` refused)."""
    try:
        numbers = loads(numbers_json)
    except Exception:
        return None
    if len(numbers) != n * len(cols):
        return None
    read = np.array(numbers, dtype=np.float64).reshape(n, len(cols))
    keys = list(first)
    return first, {keys[j]: np.ascontiguousarray(read[:, i]) for i, j in enumerate(cols)}


_FIRST_LOOK = 4096
"""Bytes searched for the first line's end before the whole block is (a rest is short)."""


def _native_rests(rest: npt.NDArray[np.uint8], n: int
                  ) -> tuple[dict[str, Any], dict[str, npt.NDArray[np.float64]]] | None:
    """:func:`numeric_rests` with the lines after the first matched in compiled code
    (``verifier/_native.c``): each line must be the first one's skeleton (its bytes between
    its number values) with only number bytes in between."""
    assert native is not None
    if rest.size < 2 or rest[0] != _NL:
        return None
    head = rest[1 : 1 + _FIRST_LOOK]
    found = np.flatnonzero(head == _NL)
    if not found.size:
        found = np.flatnonzero(rest[1:] == _NL)
        if not found.size:
            return None
    line = rest[1 : 1 + int(found[0])]
    line1 = line.tobytes()
    first = _first_object(line1)
    if first is None:
        return None
    m = len(first)
    colons = np.flatnonzero(line == _COLON)
    commas = np.flatnonzero(line == _COMMA)
    # The same shape as the numpy version demands of every line: m colons, a comma between each
    # two, inside the line's braces (keys and values free of both bytes).
    if (colons.size != m or commas.size != m - 1 or line1[:1] != b"{" or line1[-1:] != b"}"
            or not (np.all(commas > colons[:-1]) and np.all(commas < colons[1:]))):
        return None
    ends = [*commas.tolist(), len(line1) - 1]
    cols = _number_values(first, line1, colons.tolist(), ends)
    if cols is None:
        return None
    cuts = [0]
    for j in cols:
        cuts += [int(colons[j]) + 1, ends[j]]
    segments = tuple(line1[a:b] for a, b in zip(cuts[::2], [*cuts[1::2], len(line1)],
                                                strict=True))
    numbers_json = native.number_columns(rest, n, segments)
    if numbers_json is None:
        return None
    return _columns(first, cols, numbers_json, n)
