"""When a deadline falls: ``--deadline`` text or ``SLURM_JOB_END_TIME`` as Unix seconds.

Shared by the settings check (refused before launch) and the checkpointer (which stops before
it); torch-free. A deadline must be a finite time: ``@inf`` or ``SLURM_JOB_END_TIME=inf`` would be
written into the run's records and could then never be compared with a clock.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from ecrl.contract.errors import ConfigError

__all__ = ["SLURM_END_ENV", "parse_deadline", "resolve_deadline"]

_FORMS = ("give a duration (90s, 15m, 1h30m), a time (18:00, 2026-11-23T18:00:00Z) or Unix "
          "seconds (@1767225600)")

SLURM_END_ENV = "SLURM_JOB_END_TIME"
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_deadline(text: str, *, now: float | None = None) -> float:
    """Unix time of ``text``: a duration (``90``, ``90s``, ``15m``, ``1h30m``), Unix seconds
    (``@1767225600``), or an ISO time (``2026-11-23T18:00:00Z``; no zone: local time; a time of
    day alone, ``18:00``, is today's, or tomorrow's once past)."""
    now = time.time() if now is None else now
    raw = text.strip()
    if raw.startswith("@"):
        try:
            seconds = float(raw[1:])
        except ValueError:
            pass
        else:
            return _finite(seconds, f"--deadline {text!r}")
    match = _DURATION.match(raw)
    if raw and match and any(match.groups()):
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        return now + h * 3600 + m * 60 + s
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", raw):
        today = datetime.fromtimestamp(now).strftime("%Y-%m-%d")
        stamp = datetime.fromisoformat(f"{today}T{raw}").timestamp()
        return stamp if stamp > now else stamp + 86400
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--deadline {text!r}: {_FORMS}") from None
    return moment.timestamp() if moment.tzinfo else moment.replace(
        tzinfo=datetime.now(UTC).astimezone().tzinfo).timestamp()


def resolve_deadline(given: str | None, environ: Mapping[str, str] | None = None, *,
                     now: float | None = None) -> float | None:
    """``--deadline`` when given, else ``SLURM_JOB_END_TIME``, else None."""
    if given:
        return parse_deadline(given, now=now)
    env = os.environ if environ is None else environ
    raw = env.get(SLURM_END_ENV)
    if raw:
        try:
            seconds = float(raw)
        except ValueError:
            raise ConfigError(f"{SLURM_END_ENV}={raw!r} is not Unix seconds: unset it or pass "
                              "--deadline") from None
        return _finite(seconds, f"{SLURM_END_ENV}={raw!r}")
    return None


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ConfigError(f"{what} is not a finite time: {_FORMS}")
    return value
