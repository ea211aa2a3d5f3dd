"""The verifier's exception root (a subclass of ECRL's, so ``except EcrlError`` catches it)."""

from __future__ import annotations

from ecrl.contract.errors import EcrlError

__all__ = ["VerifierError", "Unusable"]


class VerifierError(EcrlError):
    """A problem with what the user asked the verifier to do (a bad PATH, a bad flag)."""


class Unusable(VerifierError):
    """One run's logs cannot support a verdict; ``str(error)`` is the reason (UNKNOWN)."""
