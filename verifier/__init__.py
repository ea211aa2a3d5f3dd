"""``ecrl-verify``: prove exactly-once data consumption from ECRL run logs (never imports torch).

>>> from verifier import verify, render_text
>>> result = verify("runs/demo")             # doctest: +SKIP
>>> result.verdict, result.exit_code         # doctest: +SKIP
('PASS', 0)
>>> print(render_text(result))               # doctest: +SKIP

:func:`verify` never raises for a bad run: the verdict says PASS, FAIL (with minimal witnesses)
or UNKNOWN (with the reason). It raises :class:`VerifierError` only when PATH is not something
to verify at all. Results are data (:mod:`verifier.result`, :mod:`verifier.anomalies`);
:mod:`verifier.report` renders them.
"""

from __future__ import annotations

from verifier.anomalies import KINDS, OBLIGATIONS, Anomaly, Location, Note
from verifier.check import verify, verify_run
from verifier.errors import VerifierError
from verifier.report import render_json, render_junit, render_markdown, render_text, write_report
from verifier.result import (
    AttemptSummary,
    Metrics,
    RunResult,
    Unfinished,
    Verdict,
    VerifyResult,
)

__all__ = [
    "verify",
    "verify_run",
    "render_text",
    "render_json",
    "render_junit",
    "render_markdown",
    "write_report",
    "VerifyResult",
    "RunResult",
    "AttemptSummary",
    "Unfinished",
    "Metrics",
    "Anomaly",
    "Location",
    "Note",
    "Verdict",
    "KINDS",
    "OBLIGATIONS",
    "VerifierError",
]
