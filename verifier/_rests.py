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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ecrl.contract.runformat import loads

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
    nls = np.flatnonzero(rest == _NL)
    if nls.size != n + 1 or nls[0] != 0 or nls[-1] != rest.size - 1:
        return None
    try:
        first = loads(rest[1 : nls[1]].tobytes())
    except Exception:
        return None
    if not isinstance(first, dict) or not first:
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
    numeric = [line1[c + 1 : e] != _EMPTY_LIST for c, e in zip(colons[0].tolist(),
                                                               ends[0].tolist(), strict=True)]
    values = list(first.values())
    if any(not (type(v) in (int, float) if num else v == []) for v, num in zip(
            values, numeric, strict=True)):
        return None
    cols = [j for j in range(m) if numeric[j]]
    if not cols:
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
    try:
        numbers = loads(b"[" + text.tobytes())
    except Exception:
        return None
    if len(numbers) != n * len(cols):
        return None
    read = np.array(numbers, dtype=np.float64).reshape(n, len(cols))
    keys = list(first)
    return first, {keys[j]: np.ascontiguousarray(read[:, i]) for i, j in enumerate(cols)}
