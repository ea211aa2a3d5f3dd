"""From a region's task tree to its schedule: flatten, pick a solver, map cuts back to hints.

Flattening follows CheckHint: the code between two hint executions is one task; loops repeat
their body ``iterations`` times; branch arms are joined position by position (the ``k``-th hint
of every arm forms one *slot*, the dearest arm's time counts), so arms need not hold the same
number of hints. A slot's occurrences are counted in execution order over the flattened run;
generated code keeps one counter per slot.

Solvers: a timeline of at most :data:`EXPAND_LIMIT` tasks is solved exactly on the flat list
(:func:`transform.schedule.solve_budget` / ``solve_penalized``). A larger one is solved without
unrolling when its only hints are one slot repeated by one loop (the common ``for step in
range(10**9): …; _checkpoint()``): :func:`transform.schedule.solve_run`. Anything larger and
more tangled is refused with a message rather than approximated silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from transform import schedule as sched
from transform._tasks_build import param_problem
from transform.errors import ScheduleError
from transform.tasks import Branch, Code, HintSite, Loop, Region, Seq

__all__ = [
    "EXPAND_LIMIT",
    "ScheduleParams",
    "Firing",
    "RegionSchedule",
    "schedule_region",
    "region_cut_count",
    "slot_positions",
    "static_total_time",
]

EXPAND_LIMIT = 2_000_000
DEFAULT_OVERHEAD = 0.05
DEFAULT_CKPT_COST = 10.0
DEFAULT_MTBF = 86_400.0

Slot = tuple[int, ...]
_FLAGS = {"overhead": "--overhead", "ckpt_cost": "--ckpt-cost",
          "failure_rate": "--failure-rate", "mtbf": "--mtbf"}
"""The command-line flag of each parameter: a bad value is named by where it came from (the
source's values are checked, with their position, when the task tree is built)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleParams:
    """What the schedule optimises; unset fields fall back to the source, then the defaults."""

    overhead: float | None = None
    """Allowance ``o``: the fraction of run time checkpoints may take (budget objective)."""
    ckpt_cost: float | None = None
    """Seconds per checkpoint ``t_c`` (per-hint estimates from a profile take precedence)."""
    failure_rate: float | None = None
    """CheckHint's ``p``: probability of a failure in any one second."""
    mtbf: float | None = None
    """Mean time between failures, seconds (Poisson failures); exclusive with failure_rate."""
    objective: str = "budget"
    """``budget`` (CheckHint: at most ``⌈o·Σt/t_c⌉`` checkpoints, least expected recovery) or
    ``cost`` (least expected recovery plus checkpoint time, no budget)."""

    def __post_init__(self) -> None:
        if self.objective not in ("budget", "cost"):
            raise ScheduleError(f"objective must be budget or cost, got {self.objective!r}")
        if self.failure_rate is not None and self.mtbf is not None:
            raise ScheduleError("give --failure-rate or --mtbf, not both")
        for key, flag in _FLAGS.items():
            value = getattr(self, key)
            problem = param_problem(key, value) if value is not None else None
            if problem is not None:
                raise ScheduleError(f"{flag} {value:g}: {problem}")

    def merged(self, declared: object) -> ScheduleParams:
        """These parameters, with unset ones taken from ``declared`` (a RegionParams)."""
        def pick(name: str) -> float | None:
            mine = getattr(self, name)
            return mine if mine is not None else getattr(declared, name, None)

        rate, mtbf = pick("failure_rate"), pick("mtbf")
        if self.failure_rate is not None or self.mtbf is not None:
            rate, mtbf = self.failure_rate, self.mtbf  # the command line wins as a pair
        return ScheduleParams(overhead=pick("overhead"), ckpt_cost=pick("ckpt_cost"),
                              failure_rate=rate, mtbf=mtbf, objective=self.objective)

    def resolved(self, declared: object = None, *,
                 profile_cost: float | None = None) -> ScheduleParams:
        """Every parameter decided, in one place: the command line, then the source
        (``declared``, a RegionParams), then for ``t_c`` the profile's mean checkpoint cost,
        then the defaults. Schedules and reports read only resolved parameters."""
        mine = self.merged(declared) if declared is not None else self
        ckpt_cost = mine.ckpt_cost
        if ckpt_cost is None:
            ckpt_cost = profile_cost if profile_cost is not None else DEFAULT_CKPT_COST
        rate, mtbf = mine.failure_rate, mine.mtbf
        if rate is None and mtbf is None:
            mtbf = DEFAULT_MTBF
        return ScheduleParams(
            overhead=mine.overhead if mine.overhead is not None else DEFAULT_OVERHEAD,
            ckpt_cost=ckpt_cost, failure_rate=rate, mtbf=mtbf, objective=mine.objective)

    def hazard(self) -> float:
        if self.failure_rate is None and self.mtbf is None:
            return sched.hazard(mtbf=DEFAULT_MTBF)
        return sched.hazard(failure_rate=self.failure_rate, mtbf=self.mtbf)


@dataclass(frozen=True, kw_only=True, slots=True)
class Firing:
    """When the hints of one slot become checkpoints (occurrences are 1-based, per slot)."""

    hints: Slot
    """Hint ids of the slot (several when branch arms were joined)."""
    total: int
    """Executions of the slot in the flattened run."""
    kind: str
    """``never``, ``always``, ``occurrences`` (listed) or ``balanced`` (rule, for big loops)."""
    occurrences: tuple[int, ...] = ()
    first: int = 0
    last: int = 0
    blocks: int = 0
    count: int = 0
    """How many times it fires."""

    def fires_at(self, occurrence: int) -> bool:
        if self.kind == "always":
            return 1 <= occurrence <= self.total
        if self.kind == "balanced":
            return sched.balanced_fires(occurrence, first=self.first, last=self.last,
                                        blocks=self.blocks, cuts=self.count)
        return occurrence in self.occurrences


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionSchedule:
    """The schedule of one region, and the facts it was computed from."""

    region: str
    params: ScheduleParams
    """Resolved parameters (command line, then source, then defaults)."""
    hazard: float
    total_time: float
    """Σt: seconds of one uninterrupted run of the region (as modelled)."""
    task_count: int
    budget: int | None
    """ℓ for the budget objective; None for the cost objective."""
    firings: tuple[Firing, ...]
    expected_recovery: float
    expected_recovery_log: float
    without_recovery: float
    """Expected recovery with no checkpoint at all."""
    without_recovery_log: float
    checkpoints: int
    """Checkpoints taken in one run."""
    method: str
    task_times: tuple[float, ...] = field(default=(), repr=False)
    """The flat task times (empty when the region was solved without unrolling)."""

    @property
    def chosen(self) -> tuple[int, ...]:
        return tuple(sorted(h for f in self.firings if f.count for h in f.hints))


# --------------------------------------------------------------------------- flattening


def _count(seq: Seq) -> int:
    total = 0
    for item in seq.items:
        if isinstance(item, HintSite):
            total += 1
        elif isinstance(item, Loop):
            total += item.iterations * _count(item.body)
        elif isinstance(item, Branch):
            total += max(_count(arm) for arm in item.arms)
    return total


def region_cut_count(region: Region) -> int:
    """Cut candidates of the region once flattened (may be astronomically large)."""
    return _count(region.body)


@dataclass(slots=True)
class _Pattern:
    """A flattened piece: ``head`` seconds, then (slot, seconds after it) pairs."""

    head: float
    cuts: list[Slot]
    times: list[float]

    def extend(self, other: _Pattern) -> None:
        if self.cuts:
            self.times[-1] += other.head
        else:
            self.head += other.head
        self.cuts.extend(other.cuts)
        self.times.extend(other.times)

    def add_time(self, seconds: float) -> None:
        if self.cuts:
            self.times[-1] += seconds
        else:
            self.head += seconds


def _flatten(seq: Seq, measured: Mapping[int, float]) -> _Pattern:
    out = _Pattern(0.0, [], [])
    for item in seq.items:
        if isinstance(item, Code):
            out.add_time(item.cost)
        elif isinstance(item, HintSite):
            out.cuts.append((item.hint.id,))
            out.times.append(0.0)
        elif isinstance(item, Loop):
            body = _flatten(item.body, measured)
            for _ in range(item.iterations):
                out.add_time(item.header_cost)
                out.extend(_Pattern(body.head, list(body.cuts), list(body.times)))
            out.add_time(item.header_cost)  # the final test that ends the loop
        elif isinstance(item, Branch):
            arms = [_flatten(arm, measured) for arm in item.arms]
            width = max(len(a.cuts) for a in arms)
            joined = _Pattern(item.test_cost + max(a.head for a in arms), [], [])
            for k in range(width):
                slot = tuple(sorted(h for a in arms if k < len(a.cuts) for h in a.cuts[k]))
                joined.cuts.append(slot)
                joined.times.append(max((a.times[k] for a in arms if k < len(a.times)),
                                        default=0.0))
            out.extend(joined)
    return out


def slot_positions(branch: Branch) -> dict[Slot, int]:
    """Positions each joined slot takes in one execution of ``branch``, as the model counts them.

    The model counts a joined slot once per position whichever arm runs; generated code settles
    its counters to this after the branch (see :mod:`transform.runtime`), so a schedule stays on
    the model's clock when the arm that ran had fewer hints.
    """
    counts: dict[Slot, int] = {}
    for slot in _flatten(Seq(items=(branch,)), {}).cuts:
        counts[slot] = counts.get(slot, 0) + 1
    return counts


def _apply_profile(pattern: _Pattern, measured: Mapping[tuple[int | None, int | None], float],
                   ) -> list[float]:
    """Task times, replaced by measured ones where the profile saw that transition."""
    times = [pattern.head, *pattern.times]
    if not measured:
        return times
    slots: list[Slot | None] = [None, *pattern.cuts, None]
    for k in range(len(times)):
        before, after = slots[k], slots[k + 1]
        key = (before[0] if before else None, after[0] if after else None)
        if key in measured:
            times[k] = measured[key]
    return times


# --------------------------------------------------------------------------- solving


def _single_loop(seq: Seq) -> tuple[float, Loop, float, float, float] | None:
    """``(pre, loop, head, tail, post)`` when all cuts come from one slot in one loop."""
    loops = [i for i, item in enumerate(seq.items) if isinstance(item, Loop)]
    if len(loops) != 1:
        return None
    index = loops[0]
    loop = seq.items[index]
    assert isinstance(loop, Loop)
    outside = [item for i, item in enumerate(seq.items) if i != index]
    if not all(isinstance(item, Code) for item in outside):
        return None
    body = loop.body.items
    sites = [i for i, item in enumerate(body) if isinstance(item, HintSite)]
    if len(sites) != 1 or not all(isinstance(item, Code | HintSite) for item in body):
        return None
    pre = sum(item.cost for item in seq.items[:index] if isinstance(item, Code))
    post = sum(item.cost for item in seq.items[index + 1:] if isinstance(item, Code))
    head = sum(item.cost for item in body[:sites[0]] if isinstance(item, Code))
    tail = sum(item.cost for item in body[sites[0] + 1:] if isinstance(item, Code))
    return pre, loop, head + loop.header_cost, tail, post + loop.header_cost


def _budget(params: ScheduleParams, total: float, cuts: int) -> int:
    """ℓ of resolved parameters (see :meth:`ScheduleParams.resolved`)."""
    assert params.overhead is not None and params.ckpt_cost is not None
    if total <= 0:
        return 0
    return min(sched.checkpoint_budget(total_time=total, overhead=params.overhead,
                                       ckpt_cost=params.ckpt_cost), cuts)


def _slot_cost(slot: Slot, params: ScheduleParams, per_hint: Mapping[int, float]) -> float:
    if any(h in per_hint for h in slot):
        return max(per_hint.get(h, 0.0) for h in slot)
    assert params.ckpt_cost is not None
    return params.ckpt_cost


def schedule_region(region: Region, params: ScheduleParams, *,
                    measured: Mapping[tuple[int | None, int | None], float] | None = None,
                    per_hint_cost: Mapping[int, float] | None = None) -> RegionSchedule:
    """Choose the checkpoints of ``region``.

    ``measured`` maps (previous hint id or None for the start, next hint id or None for the end)
    to measured seconds from a profile; ``per_hint_cost`` gives seconds per checkpoint at a hint
    (from the profile's save sizes) and overrides ``ckpt_cost`` where known.
    """
    per_hint = dict(per_hint_cost or {})
    resolved = params.resolved(region.params, profile_cost=float(np.mean(list(
        per_hint.values()))) if per_hint else None)
    a = resolved.hazard()
    cuts = region_cut_count(region)
    if cuts <= EXPAND_LIMIT:
        return _solve_flat(region, resolved, a, measured or {}, per_hint)
    shape = _single_loop(region.body)
    if shape is None:
        raise ScheduleError(
            f"{region.name}: the flattened run has {cuts:.3g} hint executions spread over "
            "several loops or hints; only one hint repeated by one loop is solved without "
            "unrolling: lower an `_iterations` or keep one hint in the big loop")
    return _solve_loop(region, resolved, a, shape, per_hint)


def static_total_time(region: Region) -> float | None:
    """Σt of one run of ``region`` from the source alone (``_cost`` and the static estimate),
    to set against a profile's measurement; None when the run is too large to flatten and not
    one hint repeated by one loop."""
    if region_cut_count(region) <= EXPAND_LIMIT:
        pattern = _flatten(region.body, {})
        return pattern.head + sum(pattern.times)
    shape = _single_loop(region.body)
    if shape is None:
        return None
    pre, loop, head, tail, post = shape
    return pre + loop.iterations * (head + tail) + post


def _solve_flat(region: Region, params: ScheduleParams, a: float,
                measured: Mapping[tuple[int | None, int | None], float],
                per_hint: Mapping[int, float]) -> RegionSchedule:
    pattern = _flatten(region.body, {})
    times = np.asarray(_apply_profile(pattern, measured), dtype=float)
    total = float(times.sum())
    n_cuts = len(pattern.cuts)
    budget: int | None = None
    if params.objective == "budget":
        budget = _budget(params, total, n_cuts)
        solution = sched.solve_budget(times, budget, a)
    else:
        costs = [_slot_cost(s, params, per_hint) for s in pattern.cuts]
        solution = sched.solve_penalized(times, costs, a)
    without, without_log = sched.evaluate(times, (), a)
    chosen = set(solution.cuts)
    per_slot: dict[Slot, list[int]] = {}
    fired: dict[Slot, list[int]] = {}
    for k, slot in enumerate(pattern.cuts, start=1):
        occ = per_slot.setdefault(slot, [])
        occ.append(k)
        if k in chosen:
            fired.setdefault(slot, []).append(len(occ))
    firings = []
    for slot, occ in per_slot.items():
        hits = tuple(fired.get(slot, ()))
        kind = "never" if not hits else "always" if len(hits) == len(occ) else "occurrences"
        firings.append(Firing(hints=slot, total=len(occ), kind=kind,
                              occurrences=hits if kind == "occurrences" else (),
                              count=len(hits)))
    firings.extend(_silent_slots(region, per_slot))
    return RegionSchedule(
        region=region.name, params=params, hazard=a, total_time=total, task_count=times.size,
        budget=budget, firings=tuple(sorted(firings, key=lambda f: f.hints)),
        expected_recovery=solution.value, expected_recovery_log=solution.log_value,
        without_recovery=without, without_recovery_log=without_log, checkpoints=len(chosen),
        method=solution.method, task_times=tuple(float(t) for t in times))


def _silent_slots(region: Region, seen: Mapping[Slot, list[int]]) -> list[Firing]:
    """Hints that never execute in the model (a loop of 0 iterations): they never fire."""
    present = {h for slot in seen for h in slot}
    return [Firing(hints=(h.id,), total=0, kind="never") for h in region.body.hints()
            if h.id not in present]


def _solve_loop(region: Region, params: ScheduleParams, a: float,
                shape: tuple[float, Loop, float, float, float],
                per_hint: Mapping[int, float]) -> RegionSchedule:
    pre, loop, head, tail, post = shape
    count = loop.iterations
    hint = next(loop.body.hints())
    first_task, period, last_task = pre + head, head + tail, tail + post
    total = pre + count * period + post
    budget: int | None = None
    if params.objective == "budget":
        budget = _budget(params, total, count)
        run = sched.solve_run(pre=first_task, period=period, count=count, post=last_task,
                              budget=budget, a=a)
    else:
        run = sched.solve_run_penalized(pre=first_task, period=period, count=count,
                                        post=last_task,
                                        ckpt_cost=_slot_cost((hint.id,), params, per_hint), a=a)
    kind = "never" if run.cuts == 0 else "always" if run.cuts == count else "balanced"
    firing = Firing(hints=(hint.id,), total=count, kind=kind, first=run.first, last=run.last,
                    blocks=run.blocks, count=run.cuts)
    whole = sched.solve_run(pre=first_task, period=period, count=count, post=last_task,
                            budget=0, a=a)
    return RegionSchedule(
        region=region.name, params=params, hazard=a, total_time=total, task_count=count + 1,
        budget=budget, firings=(firing,), expected_recovery=run.value,
        expected_recovery_log=run.log_value, without_recovery=whole.value,
        without_recovery_log=whole.log_value, checkpoints=run.cuts, method="balanced-loop")
