"""Rendering of an analysis: text for people, JSON for tools (``--explain [--format json]``).

Only this module turns analysis data into words. The JSON keys ``hints`` ([{id, line, cost}]),
``chosen``, ``budget``, ``expected_recovery`` and ``live`` are the contract of ARCHITECTURE.md; a
test pins them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from transform.analysis import AnalysisSuccess
from transform.errors import SourceIssue
from transform.plan import Firing, RegionSchedule
from transform.tasks import STATEMENT_SECONDS

__all__ = ["render_issue", "explain_json", "explain_text", "JSON_KEYS"]

JSON_KEYS = ("hints", "chosen", "budget", "expected_recovery", "live")


def render_issue(issue: SourceIssue, source: str | None) -> str:
    """``file:line:col: message``, then the line and a caret when the source is at hand."""
    head = issue.render()
    if source is None:
        return head
    lines = source.splitlines()
    if not 1 <= issue.line <= len(lines):
        return head
    text = lines[issue.line - 1].expandtabs(1)
    return f"{head}\n    {text}\n    {' ' * (issue.column - 1)}^"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _sum_log(values: list[float]) -> float:
    finite = [v for v in values if v != -math.inf]
    if not finite:
        return -math.inf
    top = max(finite)
    if math.isinf(top):
        return top
    return top + math.log(sum(math.exp(v - top) for v in finite))


def _firing_json(f: Firing) -> dict[str, Any]:
    out: dict[str, Any] = {"hints": list(f.hints), "kind": f.kind, "executions": f.total,
                           "checkpoints": f.count}
    if f.kind == "occurrences":
        out["occurrences"] = list(f.occurrences)
    if f.kind == "balanced":
        out.update(first=f.first, last=f.last, blocks=f.blocks)
    return out


def _estimate_error(static: float | None, measured: float) -> float | None:
    """(static − measured) / measured: +1.0 means the source's estimate was twice the truth."""
    if static is None or not measured > 0:
        return None
    return (static - measured) / measured


def _region_json(s: RegionSchedule, result: AnalysisSuccess) -> dict[str, Any]:
    static = result.static_times.get(s.region) if result.profile else None
    return {
        "name": s.region,
        "objective": s.params.objective,
        "budget": s.budget,
        "overhead": s.params.overhead,
        "ckpt_cost": s.params.ckpt_cost,
        "total_time": s.total_time,
        "times": "measured" if result.profile else "static",
        "static_total_time": static,
        "estimate_error": _estimate_error(static, s.total_time) if result.profile else None,
        "tasks": s.task_count,
        "checkpoints": s.checkpoints,
        "hazard_per_s": s.hazard,
        "method": s.method,
        "expected_recovery": _finite(s.expected_recovery),
        "expected_recovery_log": s.expected_recovery_log,
        "expected_recovery_without": _finite(s.without_recovery),
        "expected_recovery_without_log": s.without_recovery_log,
        "firings": [_firing_json(f) for f in s.firings],
    }


def explain_data(result: AnalysisSuccess) -> dict[str, Any]:
    with_log = _sum_log([s.expected_recovery_log for s in result.schedules])
    without_log = _sum_log([s.without_recovery_log for s in result.schedules])
    budgets = [s.budget for s in result.schedules if s.budget is not None]
    slot_of = {h: list(f.hints) for s in result.schedules for f in s.firings for h in f.hints}
    return {
        "path": result.path,
        "hints": [
            {"id": h.id, "line": h.position.line, "column": h.position.column,
             "cost": result.hint_cost(h.id), "region": h.region, "slot": slot_of.get(h.id, [h.id]),
             "save_bytes": result.profile.save_bytes.get(h.id) if result.profile else None}
            for h in result.hints
        ],
        "chosen": list(result.chosen),
        "budget": sum(budgets) if budgets else None,
        "expected_recovery": _finite(math.exp(with_log)) if with_log < 709 else None,
        "expected_recovery_log": with_log,
        "expected_recovery_without": _finite(math.exp(without_log)) if without_log < 709
        else None,
        "expected_recovery_without_log": without_log,
        "live": {str(h): list(f.save) for h, f in sorted(result.live.items())},
        "rebind": {str(h): list(f.rebind) for h, f in sorted(result.live.items())},
        "maybe_unbound": {str(h): list(f.maybe_unbound) for h, f in sorted(result.live.items())
                          if f.maybe_unbound},
        "detached": {str(h): list(f.detach) for h, f in sorted(result.live.items()) if f.detach},
        "call_stacks": {str(h.id): [{"function": name, "line": line, "save": list(f.save)}
                                    for name, line, f in stack]
                        for h in result.hints if (stack := result.call_stack(h.id))},
        "regions": [_region_json(s, result) for s in result.schedules],
        "warnings": [w.render() for w in result.warnings],
        "refusal": result.refusal.render() if result.refusal is not None else None,
    }


def explain_json(result: AnalysisSuccess) -> str:
    return json.dumps(explain_data(result), indent=2)


def _seconds(value: float, log_value: float) -> str:
    if math.isfinite(value):
        return f"{value:.4g} s"
    return f"e^{log_value:.1f} s (beyond a float: this schedule will essentially never finish)"


def explain_text(result: AnalysisSuccess) -> str:
    out = [f"{result.path}: {len(result.hints)} hint(s), {len(result.chosen)} chosen"]
    for w in result.warnings:
        out.append(f"warning: {w.render()}")
    if result.refusal is not None:
        out.append(f"refused: no program will be written: {result.refusal.render()}")
    if result.profile is None:
        out.append(f"task times are static estimates ({STATEMENT_SECONDS * 1e3:g} ms per "
                   "statement, `_cost` where declared), often far from the truth: measure "
                   f"them with `ecrl-transform {result.path} --record-profile PROFILE` and "
                   "reuse it with --profile PROFILE")
    for s in result.schedules:
        out.append("")
        rate = f"MTBF {1 / s.hazard:,.0f} s" if s.hazard > 0 else "no failures"
        if s.budget is not None:
            limit = (f"budget {s.budget} checkpoint(s) (overhead {s.params.overhead:g}, "
                     f"{s.params.ckpt_cost:.3g} s per checkpoint)")
        else:
            limit = "no budget: each checkpoint costs its time"
        out.append(f"region {s.region}: {s.task_count} task(s), {s.total_time:.4g} s per run, "
                   f"{rate}, {limit}")
        if result.profile is not None:
            static = result.static_times.get(s.region)
            error = _estimate_error(static, s.total_time)
            if static is not None and error is not None:
                out.append(f"  measured {s.total_time:.4g} s per run; the static estimate was "
                           f"{static:.4g} s ({error:+.0%})")
        out.append(f"  expected recovery: {_seconds(s.expected_recovery, s.expected_recovery_log)}"
                   f" with {s.checkpoints} checkpoint(s); "
                   f"{_seconds(s.without_recovery, s.without_recovery_log)} without")
        for f in s.firings:
            for h in f.hints:
                hint = result.tree.hints[h - 1]
                when = {
                    "never": "not chosen",
                    "always": f"checkpoint at every execution ({f.total})",
                    "occurrences": f"checkpoint at {f.count} of {f.total} executions "
                                   f"(#{', #'.join(map(str, f.occurrences[:8]))}"
                                   f"{', …' if f.count > 8 else ''})",
                    "balanced": f"checkpoint at {f.count:,} of {f.total:,} executions (first "
                                f"#{f.first:,}, last #{f.last:,}, evenly spaced between)",
                }[f.kind]
                out.append(f"  hint {h} (line {hint.position.line}, task "
                           f"{result.hint_cost(h):.4g} s): {when}")
                if f.count:
                    facts = result.live[h]
                    out.append(f"    saves: {', '.join(facts.save) or '(nothing)'}")
                    if facts.detach:
                        out.append(f"    saved detached from their autograd graph (no later "
                                   f"read needs it): {', '.join(facts.detach)}")
                    if facts.rebind:
                        out.append(f"    re-binds: {', '.join(facts.rebind)}")
                    for name, line, outer in result.call_stack(h):
                        out.append(f"    and {name}() on the call stack (resumed by calling "
                                   f"again on line {line}): "
                                   f"{', '.join(outer.save) or '(nothing)'}")
    return "\n".join(out)
