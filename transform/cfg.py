"""A statement-level control-flow graph of one region, with the names each node reads and binds.

Nodes are statements (compound statements get a node for their header: the test, the iterator,
the context managers, the match subject) plus ``entry`` and ``exit``. Edges over-approximate
what Python can do — that is what keeps the liveness built on them sound: every statement of a
``try`` body may jump to each handler and to ``finally``; ``finally`` flows to the normal
successor, to the exit and to enclosing loop targets; a ``with`` body may continue after the
block (``__exit__`` may swallow the exception); ``break``/``continue``/``return``/``raise`` jump
where they go.

Per node: ``uses`` (names read), ``defs`` (names possibly bound), ``kills`` (names certainly
rebound or deleted: only these stop liveness). Rules: augmented assignment reads and binds;
``del x`` reads and unbinds; unpacking binds every target; a store into ``obj.x`` or ``obj[i]``
reads ``obj`` (and ``i``); comprehension variables stay inside, but a walrus binds outward (a
may-bind: the comprehension may not run); a lambda or nested def reads its free variables when it
is used (every use of a name bound to a closure reads the closure's free variables, and a closure
that escapes keeps them live everywhere); ``global``/``nonlocal`` names are live at the exit and
read by every call; at module level every call may read the module names that functions read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst
import networkx as nx

__all__ = ["CfgNode", "RegionCfg", "build_cfg", "expression_names", "free_names"]

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


@dataclass(slots=True)
class CfgNode:
    id: int
    kind: str
    node: cst.CSTNode | None = field(default=None, repr=False)
    uses: set[str] = field(default_factory=set)
    defs: set[str] = field(default_factory=set)
    kills: set[str] = field(default_factory=set)
    unbinds: set[str] = field(default_factory=set)
    """Names certainly unbound after this node (``del``, end of an ``except … as e``)."""
    hint: int | None = None


@dataclass(slots=True)
class RegionCfg:
    graph: nx.DiGraph
    nodes: dict[int, CfgNode]
    entry: int
    exit: int
    params: frozenset[str]
    """Names bound at entry (function parameters)."""
    static: frozenset[str]
    """Names every binding of which is an import, def or class statement."""
    escaped: frozenset[str]
    """Free variables of closures that escape: treated as live wherever they may be bound."""
    hint_nodes: dict[int, int]
    """hint id -> node id."""


# --------------------------------------------------------------------------- names


def free_names(node: cst.Lambda | cst.FunctionDef) -> set[str]:
    """Names a lambda or function reads that it does not bind itself."""
    params = node.params
    bound: set[str] = set()
    loads: set[str] = set()
    for p in (*params.posonly_params, *params.params, *params.kwonly_params):
        bound.add(p.name.value)
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            bound.add(star.name.value)
    defaults = [p.default for p in (*params.posonly_params, *params.params,
                                    *params.kwonly_params) if p.default is not None]
    if isinstance(node, cst.Lambda):
        _collect(node.body, loads, bound)
    else:
        declared_outer: set[str] = set()
        for stmt in _walk_statements(node.body):
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Global | cst.Nonlocal):
                        declared_outer.update(n.name.value for n in small.names)
        inner = _BodyNames()
        node.body.visit(inner)
        loads |= inner.loads
        bound |= inner.stores - declared_outer
    outer_loads: set[str] = set()
    for d in defaults:
        _collect(d, outer_loads, set())
    return (loads - bound) | outer_loads


def _walk_statements(block: cst.CSTNode) -> Iterable[cst.CSTNode]:
    stack = [block]
    while stack:
        cur = stack.pop()
        if isinstance(cur, cst.FunctionDef | cst.ClassDef) and cur is not block:
            continue
        yield cur
        stack.extend(c for c in cur.children if isinstance(c, cst.BaseSuite | cst.BaseStatement
                                                           | cst.BaseCompoundStatement
                                                           | cst.If | cst.Else | cst.ExceptHandler
                                                           | cst.Finally | cst.MatchCase))


class _BodyNames(cst.CSTVisitor):
    """Loads and stores of a function body (nested scopes contribute their free names)."""

    def __init__(self) -> None:
        self.loads: set[str] = set()
        self.stores: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.loads.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        self.stores.add(node.name.value)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.stores.add(node.name.value)
        self.loads |= free_names(node)
        for d in node.decorators:
            d.visit(self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.stores.add(node.name.value)
        return True

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self.loads |= free_names(node)
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        d: set[str] = set()
        _targets(node.target, d, self.loads)
        self.stores |= d
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self.stores.add(node.target.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if isinstance(node.target, cst.Name):
            self.stores.add(node.target.value)

    def visit_For(self, node: cst.For) -> None:
        _targets(node.target, self.stores, self.loads)

    def visit_AsName(self, node: cst.AsName) -> None:
        _targets(node.name, self.stores, self.loads)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        pass  # comprehension variables: loads of them cancel against nothing; harmless

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        if isinstance(node.target, cst.Name):
            self.stores.add(node.target.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        self.stores.add(_import_binding(node))
        return False


def _import_binding(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    name = alias.name
    while isinstance(name, cst.Attribute):
        name = name.value  # type: ignore[assignment]
    assert isinstance(name, cst.Name)
    return name.value


def _targets(target: cst.CSTNode, defs: set[str], uses: set[str]) -> None:
    """Names bound by an assignment target; reads of ``obj``/``i`` in ``obj.x``/``obj[i]``."""
    if isinstance(target, cst.Name):
        defs.add(target.value)
    elif isinstance(target, cst.Tuple | cst.List):
        for el in target.elements:
            _targets(el.value, defs, uses)
    elif isinstance(target, cst.StarredElement):
        _targets(target.value, defs, uses)
    elif isinstance(target, cst.Attribute):
        _collect(target.value, uses, set())
    elif isinstance(target, cst.Subscript):
        _collect(target.value, uses, set())
        for sub in target.slice:
            _collect(sub, uses, set())
    else:
        _collect(target, uses, set())


def _collect(node: cst.CSTNode, loads: set[str], bound: set[str],
             walrus: set[str] | None = None, lambdas: list[cst.Lambda] | None = None) -> None:
    """Names read by an expression (minus ``bound``); walrus targets go to ``walrus``."""
    if isinstance(node, cst.Name):
        if node.value not in bound:
            loads.add(node.value)
        return
    if isinstance(node, cst.Attribute):
        _collect(node.value, loads, bound, walrus, lambdas)
        return
    if isinstance(node, cst.Lambda):
        loads.update(free_names(node) - bound)
        if lambdas is not None:
            lambdas.append(node)
        return
    if isinstance(node, cst.NamedExpr):
        if isinstance(node.target, cst.Name) and walrus is not None:
            walrus.add(node.target.value)
        _collect(node.value, loads, bound, walrus, lambdas)
        return
    if isinstance(node, _COMPREHENSIONS):
        inner_bound = set(bound)
        comp: cst.CompFor | None = node.for_in
        parts: list[cst.CSTNode] = []
        first = True
        while isinstance(comp, cst.CompFor):
            # The first iterable is evaluated in the enclosing scope.
            _collect(comp.iter, loads, bound if first else inner_bound, walrus, lambdas)
            first = False
            names: set[str] = set()
            _targets(comp.target, names, loads)
            inner_bound |= names
            parts.extend(cond.test for cond in comp.ifs)
            comp = comp.inner_for_in
        if isinstance(node, cst.DictComp):
            parts += [node.key, node.value]
        else:
            parts.append(node.elt)
        for part in parts:
            _collect(part, loads, inner_bound, walrus, lambdas)
        return
    for child in node.children:
        _collect(child, loads, bound, walrus, lambdas)


def expression_names(node: cst.CSTNode) -> set[str]:
    """Names an expression reads (for tests and tools)."""
    out: set[str] = set()
    _collect(node, out, set())
    return out


# --------------------------------------------------------------------------- graph building


@dataclass(slots=True)
class _Loop:
    head: int
    after: int


class _Graph:
    def __init__(self) -> None:
        self.graph: nx.DiGraph = nx.DiGraph()
        self.nodes: dict[int, CfgNode] = {}
        self.closures: dict[str, set[str]] = {}
        self.escaped: set[str] = set()
        self.call_reads: set[str] = set()
        self.binding_kinds: dict[str, set[str]] = {}
        self.hint_nodes: dict[int, int] = {}

    def new(self, kind: str, node: cst.CSTNode | None = None) -> CfgNode:
        n = CfgNode(id=len(self.nodes), kind=kind, node=node)
        self.nodes[n.id] = n
        self.graph.add_node(n.id)
        return n

    def edge(self, a: int, b: int) -> None:
        self.graph.add_edge(a, b)

    def bind(self, n: CfgNode, names: Iterable[str], how: str, *, certain: bool = True) -> None:
        for name in names:
            n.defs.add(name)
            if certain:
                n.kills.add(name)
            self.binding_kinds.setdefault(name, set()).add(how)

    def read_expr(self, n: CfgNode, expr: cst.CSTNode | None) -> None:
        if expr is None:
            return
        walrus: set[str] = set()
        lambdas: list[cst.Lambda] = []
        loads: set[str] = set()
        _collect(expr, loads, set(), walrus, lambdas)
        n.uses |= loads
        self.bind(n, walrus, "value", certain=False)
        self._closure_uses(n, loads, expr)
        if _has_call(expr):
            n.uses |= self.call_reads
        for lam in lambdas:
            if not _is_direct_value(expr, lam):
                self.escaped |= free_names(lam)

    def _closure_uses(self, n: CfgNode, loads: set[str], expr: cst.CSTNode) -> None:
        for name in loads & set(self.closures):
            n.uses |= self.closures[name]
            if not _only_called(expr, name):
                self.escaped |= self.closures[name]


def _has_call(expr: cst.CSTNode) -> bool:
    if isinstance(expr, cst.Call | cst.Decorator | cst.ClassDef):
        return True
    if isinstance(expr, cst.Lambda):
        return False
    return any(_has_call(c) for c in expr.children)


def _is_direct_value(expr: cst.CSTNode, lam: cst.Lambda) -> bool:
    return expr is lam


def _only_called(expr: cst.CSTNode, name: str) -> bool:
    """Is every occurrence of ``name`` in ``expr`` the callee of a call?"""
    ok = True

    def walk(node: cst.CSTNode, callee: bool) -> None:
        nonlocal ok
        if isinstance(node, cst.Name):
            if node.value == name and not callee:
                ok = False
            return
        if isinstance(node, cst.Call):
            walk(node.func, True)
            for arg in node.args:
                walk(arg, False)
            return
        for child in node.children:
            walk(child, False)

    walk(expr, False)
    return ok


class _Builder:
    def __init__(self, g: _Graph, declared_outer: set[str]) -> None:
        self.g = g
        self.declared_outer = declared_outer
        self.exit = g.new("exit")
        self.handlers: list[list[int]] = []  # stack of handler entry nodes for try bodies
        self.loops: list[_Loop] = []
        self.finally_targets: list[int] = []

    def may_raise_to(self, node: int) -> None:
        for entries in self.handlers[-1:]:
            for h in entries:
                self.g.edge(node, h)

    def block(self, statements: Sequence[cst.BaseStatement], preds: list[int]) -> list[int]:
        for stmt in statements:
            preds = self.statement(stmt, preds)
        return preds

    def link(self, preds: list[int], node: CfgNode) -> None:
        for p in preds:
            self.g.edge(p, node.id)
        self.may_raise_to(node.id)

    def statement(self, stmt: cst.BaseStatement, preds: list[int]) -> list[int]:
        g = self.g
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                preds = self.small(small, stmt, preds)
            return preds
        if isinstance(stmt, cst.If):
            test = g.new("if", stmt)
            g.read_expr(test, stmt.test)
            self.link(preds, test)
            outs = self.block(_body(stmt.body), [test.id])
            if isinstance(stmt.orelse, cst.If):
                outs = outs + self.statement(stmt.orelse, [test.id])
            elif isinstance(stmt.orelse, cst.Else):
                outs = outs + self.block(_body(stmt.orelse.body), [test.id])
            else:
                outs = [*outs, test.id]
            return outs
        if isinstance(stmt, cst.While):
            head = g.new("while", stmt)
            g.read_expr(head, stmt.test)
            self.link(preds, head)
            after = g.new("after-while")
            self.loops.append(_Loop(head.id, after.id))
            ends = self.block(_body(stmt.body), [head.id])
            self.loops.pop()
            for e in ends:
                g.edge(e, head.id)
            outs = [head.id]
            if stmt.orelse is not None:
                outs = self.block(_body(stmt.orelse.body), outs)
            for o in outs:
                g.edge(o, after.id)
            return [after.id]
        if isinstance(stmt, cst.For):
            iterate = g.new("for-iter", stmt)
            g.read_expr(iterate, stmt.iter)
            self.link(preds, iterate)
            head = g.new("for-next", stmt)
            # Resuming inside the loop rebuilds its iterator (range at the saved index, other
            # iterables fast-forwarded), so what the iterable reads stays live in the body.
            head.uses |= iterate.uses
            uses: set[str] = set()
            names: set[str] = set()
            _targets(stmt.target, names, uses)
            head.uses |= uses
            g.bind(head, names, "value")
            g.edge(iterate.id, head.id)
            self.may_raise_to(head.id)
            after = g.new("after-for")
            self.loops.append(_Loop(head.id, after.id))
            ends = self.block(_body(stmt.body), [head.id])
            self.loops.pop()
            for e in ends:
                g.edge(e, head.id)
            # The loop may run zero times: the exit leaves from the iterator, not the target.
            outs = [iterate.id, head.id]
            if stmt.orelse is not None:
                outs = self.block(_body(stmt.orelse.body), outs)
            for o in outs:
                g.edge(o, after.id)
            return [after.id]
        if isinstance(stmt, cst.With):
            enter = g.new("with", stmt)
            for item in stmt.items:
                g.read_expr(enter, item.item)
                if item.asname is not None:
                    names = set()
                    _targets(item.asname.name, names, enter.uses)
                    g.bind(enter, names, "value")
            self.link(preds, enter)
            ends = self.block(_body(stmt.body), [enter.id])
            after = g.new("after-with")
            body_nodes = self._nodes_between(enter.id, after.id)
            for n in body_nodes:
                g.edge(n, after.id)  # __exit__ may swallow an exception raised anywhere
            for e in ends:
                g.edge(e, after.id)
            return [after.id]
        if isinstance(stmt, cst.Try | cst.TryStar):
            return self.try_statement(stmt, preds)
        if isinstance(stmt, cst.Match):
            subject = g.new("match", stmt)
            g.read_expr(subject, stmt.subject)
            self.link(preds, subject)
            outs = []
            prev = [subject.id]
            for case in stmt.cases:
                pat = g.new("case", case)
                names = set()
                _pattern(case.pattern, names, pat.uses)
                # A failed match may leave some captures bound (may-bind); a successful one
                # binds them all before the guard and the body run (certain).
                g.bind(pat, names, "value", certain=False)
                self.link(prev, pat)
                bound = g.new("case-bound", case)
                g.bind(bound, names, "value")
                g.read_expr(bound, case.guard)
                g.edge(pat.id, bound.id)
                self.may_raise_to(bound.id)
                outs += self.block(_body(case.body), [bound.id])
                prev = [pat.id, bound.id] if case.guard is not None else [pat.id]
            return outs + prev
        if isinstance(stmt, cst.FunctionDef):
            node = g.new("def", stmt)
            for d in stmt.decorators:
                g.read_expr(node, d.decorator)
            free = free_names(stmt)
            for p in (*stmt.params.params, *stmt.params.kwonly_params,
                      *stmt.params.posonly_params):
                if p.default is not None:
                    g.read_expr(node, p.default)
            g.bind(node, {stmt.name.value}, "def")
            g.closures[stmt.name.value] = free
            self.link(preds, node)
            return [node.id]
        if isinstance(stmt, cst.ClassDef):
            node = g.new("class", stmt)
            for d in stmt.decorators:
                g.read_expr(node, d.decorator)
            for arg in stmt.bases:
                g.read_expr(node, arg.value)
            inner = _BodyNames()
            stmt.body.visit(inner)
            node.uses |= inner.loads - inner.stores
            node.uses |= g.call_reads
            g.bind(node, {stmt.name.value}, "def")
            self.link(preds, node)
            return [node.id]
        node = g.new(type(stmt).__name__, stmt)
        g.read_expr(node, stmt)
        self.link(preds, node)
        return [node.id]

    def _nodes_between(self, first: int, last: int) -> list[int]:
        return [i for i in self.g.nodes if first < i < last]

    def try_statement(self, stmt: cst.Try | cst.TryStar, preds: list[int]) -> list[int]:
        g = self.g
        start = g.new("try", stmt)
        self.link(preds, start)
        handler_entries: list[int] = []
        handler_nodes: list[tuple[cst.ExceptHandler | cst.ExceptStarHandler, CfgNode]] = []
        for h in stmt.handlers:
            hn = g.new("except", h)
            g.read_expr(hn, h.type)
            if h.name is not None:
                names: set[str] = set()
                _targets(h.name.name, names, hn.uses)
                g.bind(hn, names, "value")
            handler_entries.append(hn.id)
            handler_nodes.append((h, hn))
        fin_entry = g.new("finally", stmt.finalbody) if stmt.finalbody is not None else None
        raise_targets = handler_entries + ([fin_entry.id] if fin_entry else [])
        self.handlers.append(raise_targets or [self.exit.id])
        for t in raise_targets:
            g.edge(start.id, t)
        body_outs = self.block(_body(stmt.body), [start.id])
        self.handlers.pop()
        if stmt.orelse is not None:
            body_outs = self.block(_body(stmt.orelse.body), body_outs)
        outs = list(body_outs)
        if fin_entry is not None:
            self.handlers.append([fin_entry.id])
        for h, hn in handler_nodes:
            ends = self.block(_body(h.body), [hn.id])
            if h.name is not None and isinstance(h.name.name, cst.Name):
                cleanup = g.new("except-end")
                cleanup.kills.add(h.name.name.value)
                cleanup.unbinds.add(h.name.name.value)
                for e in ends:
                    g.edge(e, cleanup.id)
                ends = [cleanup.id]
            outs += ends
        if fin_entry is not None:
            self.handlers.pop()
            for o in outs:
                g.edge(o, fin_entry.id)
            assert stmt.finalbody is not None
            ends = self.block(_body(stmt.finalbody.body), [fin_entry.id])
            # After finally: the normal successor, or wherever the pending jump was going.
            for e in ends:
                g.edge(e, self.exit.id)
                for loop in self.loops[-1:]:
                    g.edge(e, loop.head)
                    g.edge(e, loop.after)
                self.may_raise_to(e)
            return ends
        return outs

    def small(self, small: cst.BaseSmallStatement, line: cst.SimpleStatementLine,
              preds: list[int]) -> list[int]:
        g = self.g
        node = g.new(type(small).__name__, line)
        if isinstance(small, cst.Expr) and _is_hint(small.value):
            node.kind = "hint"
        if isinstance(small, cst.Assign):
            g.read_expr(node, small.value)
            for t in small.targets:
                names: set[str] = set()
                _targets(t.target, names, node.uses)
                g.bind(node, names, "value")
                if isinstance(small.value, cst.Lambda) and isinstance(t.target, cst.Name):
                    # ``f = lambda: x`` reads x wherever f is used, like a nested def.
                    g.closures[t.target.value] = free_names(small.value)
        elif isinstance(small, cst.AugAssign):
            g.read_expr(node, small.value)
            names = set()
            _targets(small.target, names, node.uses)
            node.uses |= names  # x += 1 reads x
            g.bind(node, names, "value")
        elif isinstance(small, cst.AnnAssign):
            g.read_expr(node, small.annotation.annotation)
            if small.value is not None:
                g.read_expr(node, small.value)
                names = set()
                _targets(small.target, names, node.uses)
                g.bind(node, names, "value")
            elif not isinstance(small.target, cst.Name):
                _targets(small.target, set(), node.uses)
        elif isinstance(small, cst.Del):
            names = set()
            _targets(small.target, names, node.uses)
            node.uses |= names
            node.kills |= names
            node.unbinds |= names
        elif isinstance(small, cst.Import | cst.ImportFrom):
            if isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar):
                g.bind(node, {"*"}, "import")
            else:
                assert not isinstance(small.names, cst.ImportStar)
                g.bind(node, {_import_binding(a) for a in small.names}, "import")
        elif isinstance(small, cst.Global | cst.Nonlocal):
            pass
        elif isinstance(small, cst.Return):
            g.read_expr(node, small.value)
        elif isinstance(small, cst.Raise):
            g.read_expr(node, small.exc)
            g.read_expr(node, small.cause)
        else:
            g.read_expr(node, small)
        self.link(preds, node)
        if isinstance(small, cst.Return):
            g.edge(node.id, self.exit.id)
            self._through_finally(node.id)
            return []
        if isinstance(small, cst.Raise):
            if not self.handlers:
                g.edge(node.id, self.exit.id)
            return []
        if isinstance(small, cst.Break):
            if self.loops:
                g.edge(node.id, self.loops[-1].after)
            self._through_finally(node.id)
            return []
        if isinstance(small, cst.Continue):
            if self.loops:
                g.edge(node.id, self.loops[-1].head)
            self._through_finally(node.id)
            return []
        return [node.id]

    def _through_finally(self, node: int) -> None:
        # A jump out of a try with a finally runs the finally first: the handler stack's last
        # targets include the finally entry, which flows on to every jump target.
        for entries in self.handlers[-1:]:
            for h in entries:
                if self.g.nodes[h].kind == "finally":
                    self.g.edge(node, h)


def _is_hint(expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    f = expr.func
    return (isinstance(f, cst.Name) and f.value == "_checkpoint") or (
        isinstance(f, cst.Attribute) and f.attr.value == "_checkpoint")


def _pattern(pattern: cst.CSTNode, binds: set[str], uses: set[str]) -> None:
    if isinstance(pattern, cst.MatchAs):
        if pattern.name is not None:
            binds.add(pattern.name.value)
        if pattern.pattern is not None:
            _pattern(pattern.pattern, binds, uses)
        return
    if isinstance(pattern, cst.MatchStar):
        if pattern.name is not None:
            binds.add(pattern.name.value)
        return
    if isinstance(pattern, cst.MatchMapping):
        if pattern.rest is not None:
            binds.add(pattern.rest.value)
        for el in pattern.elements:
            _collect(el.key, uses, set())
            _pattern(el.pattern, binds, uses)
        return
    if isinstance(pattern, cst.MatchClass):
        _collect(pattern.cls, uses, set())
        for p in pattern.patterns:
            _pattern(p.value, binds, uses)
        for kw in pattern.kwds:
            _pattern(kw.pattern, binds, uses)
        return
    if isinstance(pattern, cst.MatchValue):
        _collect(pattern.value, uses, set())
        return
    for child in pattern.children:
        _pattern(child, binds, uses)


def _body(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    if isinstance(block, cst.IndentedBlock):
        return block.body
    if isinstance(block, cst.SimpleStatementSuite):
        return (cst.SimpleStatementLine(body=block.body),) if block.body else ()
    return ()


def _module_call_reads(module: cst.Module) -> set[str]:
    """Module names that code in functions and classes reads: any call may read them."""
    reads: set[str] = set()
    for stmt in _walk_statements(module):
        if isinstance(stmt, cst.FunctionDef):
            reads |= free_names(stmt)
        elif isinstance(stmt, cst.ClassDef):
            inner = _BodyNames()
            stmt.body.visit(inner)
            reads |= inner.loads
    return reads


def build_cfg(region_node: cst.Module | cst.FunctionDef, statements: Sequence[cst.BaseStatement],
              hint_statements: dict[int, int]) -> RegionCfg:
    """The CFG of a region. ``hint_statements`` maps ``id(statement)`` to hint ids."""
    g = _Graph()
    params: set[str] = set()
    declared_outer: set[str] = set()
    if isinstance(region_node, cst.FunctionDef):
        p = region_node.params
        for prm in (*p.posonly_params, *p.params, *p.kwonly_params):
            params.add(prm.name.value)
        for star in (p.star_arg, p.star_kwarg):
            if isinstance(star, cst.Param):
                params.add(star.name.value)
        for stmt in _walk_statements(region_node.body):
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Global | cst.Nonlocal):
                        declared_outer.update(n.name.value for n in small.names)
        g.call_reads = set(declared_outer)
    else:
        g.call_reads = _module_call_reads(region_node)
    for name in params:
        g.binding_kinds.setdefault(name, set()).add("value")
    entry = g.new("entry")
    builder = _Builder(g, declared_outer)
    ends = builder.block(statements, [entry.id])
    for e in ends:
        g.edge(e, builder.exit.id)
    builder.exit.uses |= declared_outer
    for n in g.nodes.values():
        if n.kind == "hint" and n.node is not None and id(n.node) in hint_statements:
            n.hint = hint_statements[id(n.node)]
            g.hint_nodes[n.hint] = n.id
    static = frozenset(name for name, kinds in g.binding_kinds.items()
                       if kinds <= {"import", "def"} and name not in declared_outer)
    return RegionCfg(graph=g.graph, nodes=g.nodes, entry=entry.id, exit=builder.exit.id,
                     params=frozenset(params), static=static, escaped=frozenset(g.escaped),
                     hint_nodes=g.hint_nodes)
