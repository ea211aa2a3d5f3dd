"""JSON for the run directory: orjson when present (several times faster), plain json otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["JSON_ERRORS", "dumps", "dumps_line", "loads"]

loads: Callable[[bytes], Any]
dumps: Callable[[Any], bytes]
dumps_line: Callable[[Any], bytes]
"""``dumps`` and a newline: one JSON-lines record (a step log writes one after each model step,
where every extra Python frame is paid with cold caches)."""

try:
    import orjson

    loads = orjson.loads
    dumps = orjson.dumps
    dumps_line = partial(orjson.dumps, option=orjson.OPT_APPEND_NEWLINE)
    JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is a declared dependency

    def loads(data: bytes) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    def dumps_line(obj: Any) -> bytes:
        return dumps(obj) + b"\n"

    JSON_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)
