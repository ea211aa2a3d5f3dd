"""Means and Student-t 95% confidence intervals over seeds (pure Python, no SciPy).

The interval of a mean of ``n`` seeds is ``mean ± t(0.975, n−1)·s/√n`` with ``s`` the sample
standard deviation. The t quantile is found by bisection on the t distribution's CDF, computed
from the regularized incomplete beta function ``I_x(ν/2, ½)`` (continued fraction, Lentz's
method): exact to far more digits than a table needs, and for any ``ν``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "estimate", "t_quantile"]


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of freedom."""
    if not (0.5 < p < 1.0) or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df > 0, got {p}, {df}")
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if _t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """A mean over seeds and its 95% interval half-width (None with fewer than 2 values)."""

    mean: float | None
    ci95: float | None
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        return {"mean": self.mean, "ci95": self.ci95, "n": self.n}


def estimate(values: Sequence[float | None]) -> Estimate:
    """Mean and Student-t 95% half-width of the known values."""
    known = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not known:
        return Estimate(mean=None, ci95=None, n=0)
    mean = statistics.fmean(known)
    if len(known) < 2:
        return Estimate(mean=mean, ci95=None, n=1)
    half = t_quantile(0.975, len(known) - 1) * statistics.stdev(known) / math.sqrt(len(known))
    return Estimate(mean=mean, ci95=half, n=len(known))
