"""The records' common base: typed fields checked when read from JSON, and a lossless round trip.

A record class declares ``_SPEC`` (field name -> check and its description, built with
:func:`spec`) and the fields that may be absent (``_OPTIONAL``); :meth:`Record.from_dict` rejects a
``schema_version`` it does not know, a missing field or a value of the wrong kind, naming
``file:line``, and keeps fields it does not know in ``extra``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from ecrl.contract.errors import RunFormatError

__all__ = ["SCHEMA_VERSION", "Check", "Record", "field_names", "spec", "is_int", "is_nonneg_int",
           "is_number", "is_hash", "optional", "list_of", "is_str", "is_bool", "is_dict"]

SCHEMA_VERSION = 1

Check = Callable[[Any], bool]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_nonneg_int(v: Any) -> bool:
    return is_int(v) and v >= 0


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_hash(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 16 and not v.strip("0123456789abcdef")


def optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_dict(v: Any) -> bool:
    return isinstance(v, dict)


_DESCRIBE: dict[Check, str] = {
    is_int: "an integer",
    is_nonneg_int: "a non-negative integer",
    is_number: "a number",
    is_hash: "16 lowercase hex digits",
    is_str: "a string",
    is_bool: "true or false",
    is_dict: "an object",
}

T = TypeVar("T", bound="Record")


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    """Base of every record: typed fields, validation from JSON, lossless round trip."""

    # name -> (check, description); fields absent here are not read from JSON (only ``extra``).
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = {}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields this version of the schema does not name; kept so a round trip loses nothing."""

    @classmethod
    def from_dict(cls: type[T], data: Any, *, where: tuple[str, int | None] = ("<memory>", None)
                  ) -> T:
        """Validate ``data`` (one parsed JSON value) into a record; errors name ``where``."""
        path, line = where
        if not isinstance(data, dict):
            raise RunFormatError(path, line, f"expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RunFormatError(
                path,
                line,
                f"unsupported schema_version {version!r} (this ECRL reads {SCHEMA_VERSION}); "
                "verify with the ECRL version that wrote the run",
            )
        kwargs: dict[str, Any] = {}
        for name, (check, what) in cls._SPEC.items():
            if name not in data:
                if name in cls._OPTIONAL:
                    continue
                raise RunFormatError(path, line, f"missing field {name!r}")
            value = data[name]
            if not check(value):
                raise RunFormatError(path, line, f"field {name!r} must be {what}, got {value!r}")
            kwargs[name] = value
        extra = {k: v for k, v in data.items() if k not in cls._SPEC and k != "schema_version"}
        if extra:
            kwargs["extra"] = extra
        return cls._build(kwargs, where)

    @classmethod
    def _build(cls: type[T], kwargs: dict[str, Any], where: tuple[str, int | None]) -> T:
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for name in field_names(type(self)):
            value = getattr(self, name)
            if value is None and name in self._OPTIONAL:
                continue
            out[name] = value
        out.update(self.extra)
        return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """A record's fields but ``extra``, in order (``to_dict`` runs once per logged step)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.name != "extra")
    return names


def spec(**items: Check | tuple[Check, str]) -> dict[str, tuple[Check, str]]:
    spec: dict[str, tuple[Check, str]] = {}
    for name, item in items.items():
        spec[name] = item if isinstance(item, tuple) else (item, _DESCRIBE[item])
    return spec
