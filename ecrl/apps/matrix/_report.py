"""Rendering the matrix's tables: CSV, markdown, JSON, and the figures (:mod:`._figures`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ecrl.contract.atomicio import atomic_write_text

from ._config import REFERENCE, MatrixConfig
from ._stats import Estimate
from ._tables import BASELINE, SuiteRow, Tables, build_tables

__all__ = ["write_outputs", "render_markdown", "render_csv", "render_units_csv", "render_json"]

_SUITE_COLUMNS = (
    "suite", "dataset", "model", "schedule", "variant", "seeds", "verdict", "rank",
    "goodput", "goodput_ci95", "normalized_goodput", "drop_vs_reference_pct", "drop_ci95",
    "gain_vs_blocking_pct", "gain_ci95", "restarts", "expected_restarts", "replayed_steps",
    "wall_s", "stall_s", "write_s", "snapshot_s", "stall_reduction_vs_blocking_s",
    "loss_mean_abs_diff", "loss_max_abs_diff", "bit_identical_to_reference")
_UNIT_COLUMNS = (
    "uid", "suite", "dataset", "model", "schedule", "variant", "seed", "verdict", "exit_code",
    "committed_steps", "restarts", "expected_restarts", "replayed_steps", "goodput", "wall_s",
    "stall_s", "write_s", "snapshot_s", "checkpoints", "restart_s", "loss_mean_abs_diff",
    "loss_max_abs_diff", "params_digest", "world_sizes", "run_dir")


def _num(value: float | None, digits: int = 6) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _suite_values(row: SuiteRow) -> list[Any]:
    identical = "" if row.bit_identical is None else ("yes" if row.bit_identical else "no")
    return [row.suite, row.dataset, row.model, row.schedule, row.variant, row.seeds,
            row.verdict, row.rank, _num(row.goodput.mean), _num(row.goodput.ci95),
            _num(row.normalized.mean), _num(row.drop_pct.mean), _num(row.drop_pct.ci95),
            _num(row.gain_pct.mean), _num(row.gain_pct.ci95), _num(row.restarts),
            row.expected_restarts, _num(row.replayed_steps), _num(row.wall_s.mean),
            _num(row.stall_s.mean), _num(row.write_s.mean), _num(row.snapshot_s.mean),
            _num(row.stall_reduction_s.mean), _num(row.loss_mean_abs_diff),
            _num(row.loss_max_abs_diff), identical]


def render_csv(tables: Tables) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_SUITE_COLUMNS)
    for row in tables.suites:
        writer.writerow(_suite_values(row))
    return buffer.getvalue()


def render_units_csv(tables: Tables) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_UNIT_COLUMNS)
    for u in tables.units:
        m = u.get("metrics", {})
        writer.writerow([
            u["uid"], u["suite"], u["dataset"], u["model"], u.get("schedule") or "",
            u["variant"], u["seed"], u["verdict"], u["exit_code"], m.get("committed_steps", ""),
            m.get("restarts", ""), len(u.get("fail_at", [])), m.get("replayed_steps", ""),
            _num(m.get("goodput")), _num(m.get("wall_s")), _num(m.get("stall_s")),
            _num(m.get("write_s")), _num(m.get("snapshot_s")), m.get("checkpoints", ""),
            _num(m.get("restart_s")), _num(m.get("loss_mean_abs_diff")),
            _num(m.get("loss_max_abs_diff")), u.get("params_digest") or "",
            " ".join(map(str, u.get("world_sizes", []))), u["run_dir"]])
    return buffer.getvalue()


def render_json(config: MatrixConfig, tables: Tables) -> str:
    data = {
        "config": Path(config.path).name,
        "variants": list(tables.variants),
        "seeds": list(tables.seeds),
        "missing": list(tables.missing),
        "overall": [r.as_dict() for r in tables.overall],
        "suites": [r.as_dict() for r in tables.suites],
        "ranking": [{"suite": r.suite, "variant": r.variant, "gain_vs_blocking_pct":
                     r.gain_pct.mean, "stall_reduction_s": r.stall_reduction_s.mean}
                    for r in tables.ranking()],
        "slices": [r.as_dict() for r in tables.slices],
        "units": [{k: u[k] for k in sorted(u) if k not in ("start_time", "end_time",
                                                              "duration_s", "command")}
                  for u in tables.units],
    }
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def _est(e: Estimate, digits: int = 4, unit: str = "") -> str:
    if e.mean is None:
        return "—"
    text = f"{e.mean:.{digits}g}{unit}"
    return text + (f" ± {e.ci95:.2g}" if e.ci95 is not None else "")


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}%"


def _f(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def render_markdown(config: MatrixConfig, tables: Tables) -> str:
    n_seeds = len(tables.seeds)
    ci = ("± is the Student-t 95% confidence interval over the seeds"
          if n_seeds > 1 else "one seed: no confidence intervals (rerun with --seeds N)")
    out = [f"# Matrix `{Path(config.path).name}`", "",
           f"{len(config.suites())} suites (data sets × models × failure schedules), variants "
           f"{', '.join(tables.variants)}, {n_seeds} seed(s); {ci}. Goodput = committed steps / "
           "wall-clock second, as `ecrl-verify` measures it; every unit is one `ecrl run` judged "
           "by `ecrl-verify`.", ""]
    if tables.missing:
        out += [f"**Incomplete:** {len(tables.missing)} unit(s) have no record yet: "
                + ", ".join(tables.missing[:8]) + ("…" if len(tables.missing) > 8 else ""), ""]
    out += ["## Means over all suites", ""]
    out += _table(
        ["variant", "units", "pass rate", "goodput (steps/s)", "drop vs ref",
         f"gain vs {BASELINE}", "suites better", "restarts", "wall (s)", "stall (s)", "write (s)",
         "snapshot (s)"],
        [[r.variant, str(r.units), _f(r.pass_rate), _f(r.goodput), _pct(r.drop_pct),
          _pct(r.gain_pct), r.positive_gain or "—", _f(r.restarts), _f(r.wall_s),
          _f(r.stall_s), _f(r.write_s), _f(r.snapshot_s)] for r in tables.overall])
    out += ["## Every suite and variant", ""]
    out += _table(
        ["suite", "variant", "verdict", "goodput (steps/s)", "drop vs ref (%)",
         "restarts (expected)", "replayed", "wall (s)", "stall (s)", "write (s)",
         "snapshot (s)", "loss Δ vs ref (mean)", "bit-identical"],
        [[r.suite, r.variant, r.verdict, _est(r.goodput), _est(r.drop_pct, 3),
          f"{_f(r.restarts)} ({r.expected_restarts})", _f(r.replayed_steps),
          _est(r.wall_s), _est(r.stall_s, 3), _est(r.write_s, 3), _est(r.snapshot_s, 3),
          _f(r.loss_mean_abs_diff, 3),
          "—" if r.bit_identical is None else ("yes" if r.bit_identical else "**no**")]
         for r in tables.suites])
    ranking = tables.ranking()
    if ranking:
        out += [f"## Ranking: gain over {BASELINE}, per suite", ""]
        out += _table(
            ["suite", "variant", f"gain vs {BASELINE} (%)", "drop vs ref (%)",
             "stall reduction (s)", "rank in suite"],
            [[r.suite, r.variant, _est(r.gain_pct, 3), _est(r.drop_pct, 3),
              _est(r.stall_reduction_s, 3), str(r.rank)] for r in ranking])
    out += ["## Sliced means", ""]
    out += _table(
        ["axis", "group", "variant", "suites", "drop vs ref", f"gain vs {BASELINE}",
         "stall reduction (s)", "loss Δ vs ref"],
        [[s.axis, s.group, s.variant, str(s.suites), _pct(s.drop_pct), _pct(s.gain_pct),
          _f(s.stall_reduction_s, 3), _f(s.loss_mean_abs_diff, 3)] for s in tables.slices])
    out += ["## Figures", "",
            "![goodput by suite and strategy](figures/goodput.png)", "",
            f"![gain over {BASELINE}](figures/gain.png)", "",
            "![stall reduction against goodput gain](figures/stall_vs_gain.png)", ""]
    if REFERENCE in tables.variants:
        out += ["The reference of a data set and model has no failures, so the suites of its "
                "schedules share one reference run per seed.", ""]
    return "\n".join(out)


def write_outputs(config: MatrixConfig, out: Path, records: Mapping[str, Mapping[str, Any]]
                  ) -> Tables:
    """Write every table and figure of the matrix into ``out`` (from the records alone)."""
    from ._figures import write_figures

    tables = build_tables(config, records)
    atomic_write_text(out / "summary.csv", render_csv(tables))
    atomic_write_text(out / "units.csv", render_units_csv(tables))
    atomic_write_text(out / "summary.json", render_json(config, tables))
    atomic_write_text(out / "summary.md", render_markdown(config, tables))
    write_figures(tables, out / "figures")
    return tables
