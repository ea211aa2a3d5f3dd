"""Liveness at the hints: backward to a fixpoint, intersected with "may be bound".

Over the region's :mod:`transform.cfg` graph: ``live_in(n) = uses(n) ∪ (live_out(n) − kills(n))``
iterated over loop back edges until nothing changes, and forward ``bound_out(n) = bound_in(n) ∪
defs(n) − unbinds(n)`` so that a name that cannot hold a value at the hint (not yet assigned on any
path, or deleted on every path) is never saved. The facts at a hint are what code generation must
save there: the names live after the hint statement and possibly bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from transform.cfg import RegionCfg

__all__ = ["LiveFacts", "live_at_hints"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveFacts:
    """What must survive a checkpoint at one hint."""

    hint: int
    save: tuple[str, ...]
    """Sorted names holding values to save (live after the hint and possibly bound)."""
    rebind: tuple[str, ...]
    """Sorted live names bound only by import/def/class statements: re-run, not pickled."""
    maybe_unbound: tuple[str, ...]
    """Sorted names in ``save`` that are unbound on some path to the hint (save if bound)."""


def _fixpoint_live(cfg: RegionCfg) -> dict[int, frozenset[str]]:
    graph = cfg.graph
    live_in: dict[int, frozenset[str]] = {n: frozenset() for n in cfg.nodes}
    live_out: dict[int, frozenset[str]] = {n: frozenset() for n in cfg.nodes}
    work = list(cfg.nodes)
    queued = set(work)
    while work:
        n = work.pop()
        queued.discard(n)
        node = cfg.nodes[n]
        out: frozenset[str] = frozenset().union(*(live_in[s] for s in graph.successors(n)))
        live_out[n] = out
        new_in = frozenset(node.uses | (out - node.kills))
        if new_in != live_in[n]:
            live_in[n] = new_in
            for p in graph.predecessors(n):
                if p not in queued:
                    queued.add(p)
                    work.append(p)
    return live_out


def _fixpoint_bound(cfg: RegionCfg) -> tuple[dict[int, frozenset[str]], dict[int, frozenset[str]]]:
    """(may be bound, must be bound) after each node."""
    graph = cfg.graph
    universe = frozenset(cfg.params).union(*(n.defs for n in cfg.nodes.values()))
    may: dict[int, frozenset[str]] = {n: frozenset() for n in cfg.nodes}
    must: dict[int, frozenset[str]] = {n: universe for n in cfg.nodes}
    work = list(reversed(list(cfg.nodes)))
    queued = set(work)
    while work:
        n = work.pop()
        queued.discard(n)
        node = cfg.nodes[n]
        preds = list(graph.predecessors(n))
        if n == cfg.entry:
            may_in = must_in = frozenset(cfg.params)
        else:
            may_in = frozenset().union(*(may[p] for p in preds))
            must_in = frozenset.intersection(*(must[p] for p in preds)) if preds else frozenset()
        new_may = (may_in | node.defs) - node.unbinds
        new_must = (must_in | node.kills - node.unbinds) - node.unbinds
        if new_may != may[n] or new_must != must[n]:
            may[n], must[n] = new_may, new_must
            for s in graph.successors(n):
                if s not in queued:
                    queued.add(s)
                    work.append(s)
    return may, must


def live_at_hints(cfg: RegionCfg) -> dict[int, LiveFacts]:
    """Live facts for every hint of the region, by hint id."""
    live_out = _fixpoint_live(cfg)
    may, must = _fixpoint_bound(cfg)
    facts: dict[int, LiveFacts] = {}
    for hint, node in cfg.hint_nodes.items():
        bound = may[node]
        live = set(live_out[node]) | set(cfg.escaped)
        if "*" not in bound:
            live &= bound
        live.discard("*")
        rebind = {name for name in live if name in cfg.static}
        save = live - rebind
        facts[hint] = LiveFacts(hint=hint, save=tuple(sorted(save)),
                                rebind=tuple(sorted(rebind)),
                                maybe_unbound=tuple(sorted(save - must[node])))
    return facts
