"""The matrix's PNG figures (matplotlib, Agg): goodput, gain over blocking, stall vs gain.

Drawn from :class:`._tables.Tables` only. Error bars are the Student-t 95% intervals over seeds
(none with one seed). PNG metadata carries no date, so equal tables give equal files.
"""

from __future__ import annotations

from pathlib import Path

from ._config import REFERENCE
from ._tables import BASELINE, SuiteRow, Tables

__all__ = ["write_figures", "FIGURES"]

FIGURES = ("goodput.png", "gain.png", "stall_vs_gain.png")
_META = {"Software": None}


def _err(rows: list[SuiteRow], attr: str) -> list[float] | None:
    """Error bars: the 95% half-widths, or none at all with one seed (no zero-length caps)."""
    errs = [getattr(r, attr).ci95 or 0.0 for r in rows]
    return errs if any(errs) else None


def write_figures(tables: Tables, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    suites = list(dict.fromkeys(r.suite for r in tables.suites))
    variants = list(tables.variants)
    by = {(r.suite, r.variant): r for r in tables.suites}
    width = 0.8 / max(1, len(variants))
    written: list[Path] = []
    xs = range(len(suites))

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(suites) + 2), 4.2))
    for i, variant in enumerate(variants):
        rows = [by[(s, variant)] for s in suites]
        ax.bar([x + (i - (len(variants) - 1) / 2) * width for x in xs],
               [r.normalized.mean or 0.0 for r in rows], width, yerr=_err(rows, "normalized"),
               capsize=3, label=variant)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(xs), suites, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("goodput / reference goodput")
    ax.set_ylim(0, max(1.0, *(r.normalized.mean or 0.0 for r in tables.suites)) * 1.18)
    ax.set_title("Goodput by suite and strategy (reference = 1)")
    ax.legend(fontsize=8, loc="upper center", ncol=len(variants))
    fig.tight_layout()
    written.append(folder / "goodput.png")
    fig.savefig(written[-1], dpi=110, metadata=_META)
    plt.close(fig)

    others = [v for v in variants if v not in (REFERENCE, BASELINE)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(suites) + 2), 4.0))
    if BASELINE in variants and others:
        w = 0.8 / len(others)
        for i, variant in enumerate(others):
            rows = [by[(s, variant)] for s in suites]
            ax.bar([x + (i - (len(others) - 1) / 2) * w for x in xs],
                   [r.gain_pct.mean or 0.0 for r in rows], w, yerr=_err(rows, "gain_pct"),
                   capsize=3, label=variant)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(list(xs), suites, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"goodput gain over {BASELINE} (%)")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, f"no {BASELINE} variant, or nothing to compare with it",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"Goodput gain over {BASELINE} by suite")
    fig.tight_layout()
    written.append(folder / "gain.png")
    fig.savefig(written[-1], dpi=110, metadata=_META)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for variant in others:
        rows = [by[(s, variant)] for s in suites]
        points = [(r.stall_reduction_s.mean, r.gain_pct.mean, r.suite) for r in rows
                  if r.stall_reduction_s.mean is not None and r.gain_pct.mean is not None]
        if not points:
            continue
        ax.errorbar([p[0] for p in points], [p[1] for p in points],
                    xerr=_err([r for r in rows if r.stall_reduction_s.mean is not None
                               and r.gain_pct.mean is not None], "stall_reduction_s"),
                    yerr=_err([r for r in rows if r.stall_reduction_s.mean is not None
                               and r.gain_pct.mean is not None], "gain_pct"),
                    fmt="o", capsize=3, label=variant)
        for x, y, name in points:
            ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel(f"stall reduction against {BASELINE} (s, whole run)")
    ax.set_ylabel(f"goodput gain over {BASELINE} (%)")
    ax.set_title("Stall reduction against goodput gain, per suite")
    if others:
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(folder / "stall_vs_gain.png")
    fig.savefig(written[-1], dpi=110, metadata=_META)
    plt.close(fig)
    return written
