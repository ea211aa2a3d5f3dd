"""JSON for the run directory: orjson when present (several times faster), plain json otherwise."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["JSON_ERRORS", "dumps", "loads"]

try:
    import orjson

    def loads(data: bytes) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is a declared dependency

    def loads(data: bytes) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    JSON_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)
