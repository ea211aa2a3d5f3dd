"""The analysis pipeline as one library call: source → task tree → schedule + liveness.

:func:`analyze` never raises for a problem in the user's program or parameters: it returns an
:class:`AnalysisFailure` carrying the :class:`~transform.errors.SourceIssue` (LibCST's
``TransformSuccess | TransformFailure`` style). :class:`AnalysisSuccess` is the data the code
generator consumes: the task tree (``ast`` statements with positions), the schedule of each
region with per-slot firing rules, and the live facts at every hint.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field

from transform._tasks_build import build_task_tree
from transform.calls import check_single_entry
from transform.cfg import build_cfg, module_call_reads
from transform.errors import ScheduleError, SourceError, SourceIssue
from transform.graphfree import graph_free_functions, no_grad_statements
from transform.liveness import LiveFacts, live_at_hints, live_before
from transform.plan import (
    Firing,
    RegionSchedule,
    ScheduleParams,
    schedule_region,
    static_total_time,
)
from transform.profile import Profile
from transform.tasks import Hint, Region, TaskTree

__all__ = ["AnalysisSuccess", "AnalysisFailure", "AnalysisResult", "analyze"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalysisSuccess:
    path: str
    tree: TaskTree
    schedules: tuple[RegionSchedule, ...]
    """One per region (``<module>`` first when it holds hints)."""
    live: Mapping[int, LiveFacts] = field(repr=False)
    """Hint id → what must be saved there (for every hint, chosen or not)."""
    warnings: tuple[SourceIssue, ...]
    profile: Profile | None = None
    segment_costs: Mapping[int, float] = field(default_factory=dict, repr=False)
    """Hint id → seconds of the code segment that ends at it."""
    refusal: SourceIssue | None = None
    """Why code generation will refuse the chosen checkpoints (a checkpointing function entered
    more than once per run), so ``--explain`` says it before ``-o`` does."""
    call_live: Mapping[int, LiveFacts] = field(default_factory=dict, repr=False)
    """id of a hosting call statement (:attr:`TaskTree.hosted`) → what its function must give
    back before the call runs again on resume."""
    static_times: Mapping[str, float | None] = field(default_factory=dict, repr=False)
    """With a profile: region → Σt from the source alone (``_cost`` and the static estimate),
    to report the estimate's error against the measured ``RegionSchedule.total_time``."""

    @property
    def hints(self) -> tuple[Hint, ...]:
        return self.tree.hints

    @property
    def chosen(self) -> tuple[int, ...]:
        return tuple(sorted(h for s in self.schedules for h in s.chosen))

    def firing(self, hint_id: int) -> Firing:
        for s in self.schedules:
            for f in s.firings:
                if hint_id in f.hints:
                    return f
        raise KeyError(hint_id)

    def call_stack(self, hint_id: int) -> list[tuple[str, int, LiveFacts]]:
        """For a hint of a hosted function: each function above it on the call stack,
        outermost first, with the line of its call and what a resume gives back there before
        calling again (empty for a hint of a region's own function)."""
        statement = self.tree.hints[hint_id - 1].statement
        by_callee = {id(h.callee): h for h in self.tree.hosted}
        owner = None  # the innermost hosted function holding the hint
        for hosting in self.tree.hosted:
            if _contains(hosting.callee, statement) and (
                    owner is None or _contains(owner.callee, hosting.callee)):
                owner = hosting
        out: list[tuple[str, int, LiveFacts]] = []
        while owner is not None:
            out.insert(0, (owner.caller_name, owner.call.lineno, self.call_live[id(owner.call)]))
            owner = by_callee.get(id(owner.caller))
        return out

    def hint_cost(self, hint_id: int) -> float:
        """Seconds of the code segment that ends at this hint (per execution, as modelled)."""
        return self.segment_costs.get(hint_id, 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalysisFailure:
    issue: SourceIssue
    warnings: tuple[SourceIssue, ...] = ()


AnalysisResult = AnalysisSuccess | AnalysisFailure


def _contains(outer: ast.AST, node: ast.AST) -> bool:
    return any(n is node for n in ast.walk(outer))


def _segment_costs(region: Region, out: dict[int, float]) -> None:
    from transform.tasks import Branch, Code, HintSite, Loop, Seq

    def walk(seq: Seq) -> None:
        acc = 0.0
        for item in seq.items:
            if isinstance(item, Code):
                acc += item.cost
            elif isinstance(item, HintSite):
                out[item.hint.id] = acc
                acc = 0.0
            elif isinstance(item, Loop):
                walk(item.body)
                acc = 0.0
            elif isinstance(item, Branch):
                for arm in item.arms:
                    walk(arm)
                acc = 0.0

    walk(region.body)


def _measured_segments(profile: Profile) -> dict[int, float]:
    """Hint id → mean measured seconds of the code that ends at it (over every predecessor)."""
    seconds: dict[int, float] = {}
    seen: dict[int, int] = {}
    for (before, after), mean in profile.transitions.items():
        if after is None:
            continue
        n = profile.counts.get((before, after), 1)
        seconds[after] = seconds.get(after, 0.0) + mean * n
        seen[after] = seen.get(after, 0) + n
    return {h: seconds[h] / seen[h] for h in seconds if seen[h]}


def analyze(source: str, path: str, params: ScheduleParams | None = None, *,
            profile: Profile | None = None) -> AnalysisResult:
    """Analyse a program: its hints, the chosen checkpoints and the live variables."""
    params = params or ScheduleParams()
    try:
        tree = build_task_tree(source, path)
    except SourceError as exc:
        return AnalysisFailure(issue=exc.issue)
    live: dict[int, LiveFacts] = {}
    call_live: dict[int, LiveFacts] = {}
    call_reads = module_call_reads(tree.module) if tree.regions else set()
    graph_free = graph_free_functions(tree.module) if tree.regions else {}
    hint_statements = {id(h.statement): h.id for h in tree.hints}
    calls_in: dict[int, dict[int, int]] = {}
    for hosting in tree.hosted:
        calls_in.setdefault(id(hosting.caller), {})[id(hosting.call)] = id(hosting.call)
    functions: list[ast.Module | ast.FunctionDef] = [r.node for r in tree.regions]
    functions += [h.callee for h in tree.hosted]
    for node in functions:
        # Each function's own graph: a hosted function's hints see its own names, and the
        # call that leads to them what its caller must give back to run it again.
        cfg = build_cfg(node, node.body, hint_statements, call_reads=call_reads)
        live.update(live_at_hints(cfg, graph_free, no_grad_statements(node)))
        calls = calls_in.get(id(node))
        if calls:
            call_live.update(live_before(cfg, calls))
    schedules = []
    for region in tree.regions:
        try:
            schedules.append(schedule_region(
                region, params,
                measured=profile.transitions if profile else None,
                per_hint_cost=profile.checkpoint_costs() if profile else None))
        except ScheduleError as exc:
            where = region.position
            return AnalysisFailure(issue=SourceIssue(path=path, line=where.line,
                                                     column=where.column, message=str(exc),
                                                     kind="schedule"),
                                   warnings=tree.warnings)
    costs: dict[int, float] = {}
    for region in tree.regions:
        _segment_costs(region, costs)
    if profile is not None:
        costs.update(_measured_segments(profile))
    static = {r.name: static_total_time(r) for r in tree.regions} if profile else {}
    chosen = {s.region for s in schedules if s.chosen}
    entry = check_single_entry(tree.module, {
        r.name: r.node for r in tree.regions
        if r.name in chosen and isinstance(r.node, ast.FunctionDef)})
    return AnalysisSuccess(path=path, tree=tree, schedules=tuple(schedules), live=live,
                           warnings=tree.warnings, profile=profile, segment_costs=costs,
                           static_times=static, call_live=call_live,
                           refusal=tree.hosting_issue or (entry.issue(path) if entry is not None
                                                          else None))
