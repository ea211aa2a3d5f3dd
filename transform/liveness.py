"""Liveness at the hints: backward to a fixpoint, intersected with "may be bound".

Over the region's :mod:`transform.cfg` graph: ``live_in(n) = uses(n) ∪ (live_out(n) − kills(n))``
iterated over loop back edges until nothing changes, and forward ``bound_out(n) = bound_in(n) ∪
defs(n) − unbinds(n)`` so that a name that cannot hold a value at the hint (not yet assigned on any
path, or deleted on every path) is never saved. The facts at a hint are what code generation must
save there: the names live after the hint statement and possibly bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transform.cfg import CfgNode, RegionCfg
from transform.graphfree import GraphFreeFunctions, graph_free_reads

__all__ = ["LiveFacts", "live_at_hints", "live_before"]


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
    detach: tuple[str, ...] = ()
    """Sorted names in ``save`` that every later read uses without its autograd graph
    (``.item()``, ``.detach()``, a function of the program's that only detaches it:
    :mod:`transform.graphfree`): a tensor they hold is saved detached."""


def _graph_reads(cfg: RegionCfg, saved: frozenset[str], functions: GraphFreeFunctions,
                 no_grad: frozenset[int]) -> Callable[[CfgNode], frozenset[str]]:
    """A node's reads that may need an autograd graph: all its reads but the graph-free ones of
    names some hint saves (never a name a call or closure may read behind the statement's
    back). Only statements reading a saved name are searched. ``functions`` are the module's
    graph-free functions (their names bound nowhere else in the module); ``no_grad`` the ids of
    the statements that run under ``torch.no_grad()``."""

    def reads(node: CfgNode) -> frozenset[str]:
        candidates = (node.uses & saved) - cfg.indirect_reads
        if node.node is None or not candidates:
            return frozenset(node.uses)
        return frozenset(node.uses - graph_free_reads(node.node, candidates, functions,
                                                      no_grad=id(node.node) in no_grad))

    return reads


def _fixpoint_live(cfg: RegionCfg, reads: Callable[[CfgNode], frozenset[str]] | None = None
                   ) -> dict[int, frozenset[str]]:
    """Live after each node; with ``reads``, live counting only the reads it gives."""
    graph = cfg.graph
    gen = {n: frozenset(node.uses) if reads is None else reads(node)
           for n, node in cfg.nodes.items()}
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
        new_in = gen[n] | (out - node.kills)
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


def live_at_hints(cfg: RegionCfg, functions: GraphFreeFunctions | None = None,
                  no_grad: frozenset[int] = frozenset()) -> dict[int, LiveFacts]:
    """Live facts for every hint of the region, by hint id. ``functions``: the module's
    functions that read arguments graph-free (:func:`transform.graphfree.graph_free_functions`);
    ``no_grad``: the region's statements under ``torch.no_grad()``
    (:func:`transform.graphfree.no_grad_statements`)."""
    live_out = _fixpoint_live(cfg)
    saved = frozenset().union(*(live_out[n] for n in cfg.hint_nodes.values()))
    graph_live_out = _fixpoint_live(cfg, _graph_reads(cfg, saved, functions or {}, no_grad)) \
        if saved else {}
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
        detach = save - graph_live_out.get(node, frozenset()) - cfg.escaped
        facts[hint] = LiveFacts(hint=hint, save=tuple(sorted(save)),
                                rebind=tuple(sorted(rebind)),
                                maybe_unbound=tuple(sorted(save - must[node])),
                                detach=tuple(sorted(detach)))
    return facts


def live_before(cfg: RegionCfg, statements: dict[int, int]) -> dict[int, LiveFacts]:
    """Live facts just before each of ``statements`` (``id(statement)`` → a key), by key: what
    a resume must give back to run the statement again (a call that leads to checkpoints, see
    :mod:`transform._hosting`). The statement's own reads count; a tensor is never detached."""
    live_out = _fixpoint_live(cfg)
    may, must = _fixpoint_bound(cfg)
    facts: dict[int, LiveFacts] = {}
    for n, node in cfg.nodes.items():
        key = statements.get(id(node.node)) if node.node is not None else None
        if key is None:
            continue
        preds = list(cfg.graph.predecessors(n))
        may_in = frozenset().union(*(may[p] for p in preds))
        must_in = frozenset.intersection(*(must[p] for p in preds)) if preds else frozenset()
        live = set(node.uses | (live_out[n] - node.kills)) | set(cfg.escaped)
        if "*" not in may_in:
            live &= may_in
        live.discard("*")
        rebind = {name for name in live if name in cfg.static}
        save = live - rebind
        facts[key] = LiveFacts(hint=key, save=tuple(sorted(save)),
                               rebind=tuple(sorted(rebind)),
                               maybe_unbound=tuple(sorted(save - must_in)))
    return facts
