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

Built on :mod:`ast`: names come from one recursive pass per expression (no visitor objects), and
the free names of each function or lambda are computed once and cached.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import networkx as nx

__all__ = ["CfgNode", "RegionCfg", "build_cfg", "expression_names", "free_names",
           "target_names", "pattern_names", "import_binding", "walrus_names",
           "module_call_reads", "plain_functions", "generator_functions"]

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(slots=True)
class CfgNode:
    id: int
    kind: str
    node: ast.AST | None = field(default=None, repr=False)
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
    """Names every binding of which is an import, def, class or ``name = lambda …``."""
    escaped: frozenset[str]
    """Free variables of closures that escape: treated as live wherever they may be bound."""
    hint_nodes: dict[int, int]
    """hint id -> node id."""
    declared_outer: frozenset[str] = frozenset()
    """Names the region declares ``global`` or ``nonlocal``."""
    indirect_reads: frozenset[str] = frozenset()
    """Names a call may read without naming them: what the module's functions read (or the
    region's ``global``/``nonlocal`` names) and the free names of its closures."""


# --------------------------------------------------------------------------- names

_FREE_CACHE: dict[int, tuple[ast.AST, frozenset[str]]] = {}


def _arg_names(args: ast.arguments) -> set[str]:
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    for star in (args.vararg, args.kwarg):
        if star is not None:
            names.add(star.arg)
    return names


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def free_names(node: ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """Names a lambda or function reads that it does not bind itself (defaults included)."""
    hit = _FREE_CACHE.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    bound = _arg_names(node.args)
    loads: set[str] = set()
    if isinstance(node, ast.Lambda):
        _collect(node.body, loads, bound)
    else:
        declared = _declared_outer(node.body)
        stores: set[str] = set()
        _body_names(node.body, loads, stores)
        bound |= stores - declared
        loads -= bound
    outer: set[str] = set()
    for d in _defaults(node.args):
        _collect(d, outer, set())
    result = frozenset((loads - bound) | outer)
    _FREE_CACHE[id(node)] = (node, result)
    return result


def _declared_outer(body: Sequence[ast.stmt]) -> set[str]:
    out: set[str] = set()
    for stmt in _own_statements(body):
        if isinstance(stmt, ast.Global | ast.Nonlocal):
            out.update(stmt.names)
    return out


def _own_statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements of a body and its nested blocks, not entering nested defs or classes."""
    stack = list(reversed(body))
    while stack:
        cur = stack.pop()
        yield cur
        if isinstance(cur, (*_FUNCTIONS, ast.ClassDef)):
            continue
        for _name, value in ast.iter_fields(cur):
            if isinstance(value, list) and value:
                if isinstance(value[0], ast.stmt):
                    stack.extend(reversed(value))
                elif isinstance(value[0], ast.excepthandler | ast.match_case):
                    for h in reversed(value):
                        stack.extend(reversed(h.body))


def _body_names(body: Sequence[ast.stmt], loads: set[str], stores: set[str]) -> None:
    """Loads and stores of a function body; nested scopes contribute their free names."""
    for stmt in body:
        _node_names(stmt, loads, stores)


def _node_names(node: ast.AST, loads: set[str], stores: set[str]) -> None:
    if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Load):
            loads.add(node.id)
        elif isinstance(node.ctx, ast.Store):
            stores.add(node.id)
        else:
            loads.add(node.id)
            stores.add(node.id)
        return
    if isinstance(node, _FUNCTIONS):
        stores.add(node.name)
        loads.update(free_names(node))
        for d in node.decorator_list:
            _collect(d, loads, set())
        return
    if isinstance(node, ast.Lambda):
        loads.update(free_names(node))
        return
    if isinstance(node, ast.ClassDef):
        stores.add(node.name)
        for e in (*node.decorator_list, *node.bases, *(k.value for k in node.keywords)):
            _collect(e, loads, set())
        _body_names(node.body, loads, set())  # class attributes bind nothing outside
        return
    if isinstance(node, _COMPREHENSIONS):
        walrus: set[str] = set()
        _collect(node, loads, set(), walrus)
        stores |= walrus
        return
    if isinstance(node, ast.Import | ast.ImportFrom):
        stores.update(import_binding(a) for a in node.names)
        return
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
        stores.add(node.name)
    elif isinstance(node, ast.MatchMapping) and node.rest:
        stores.add(node.rest)
    for child in ast.iter_child_nodes(node):
        _node_names(child, loads, stores)


def import_binding(alias: ast.alias) -> str:
    """The name an import alias binds (``import a.b`` binds ``a``; ``*`` stays ``*``)."""
    if alias.asname:
        return alias.asname
    return alias.name.split(".", 1)[0]


def target_names(target: ast.AST, defs: set[str], uses: set[str]) -> None:
    """Names bound by an assignment target; reads of ``obj``/``i`` in ``obj.x``/``obj[i]``."""
    if isinstance(target, ast.Name):
        defs.add(target.id)
    elif isinstance(target, ast.Tuple | ast.List):
        for el in target.elts:
            target_names(el, defs, uses)
    elif isinstance(target, ast.Starred):
        target_names(target.value, defs, uses)
    elif isinstance(target, ast.Attribute):
        _collect(target.value, uses, set())
    elif isinstance(target, ast.Subscript):
        _collect(target.value, uses, set())
        _collect(target.slice, uses, set())
    else:
        _collect(target, uses, set())


class _Calls:
    """Side facts of one expression walk: did it call anything, which lambdas did it hold."""

    __slots__ = ("called", "lambdas")

    def __init__(self) -> None:
        self.called = False
        self.lambdas: list[ast.Lambda] = []


def _collect(node: ast.AST, loads: set[str], bound: set[str],
             walrus: set[str] | None = None, calls: _Calls | None = None) -> None:
    """Names read by an expression (minus ``bound``); walrus targets go to ``walrus``."""
    if isinstance(node, ast.Name):
        if node.id not in bound:
            loads.add(node.id)
        return
    if isinstance(node, ast.Constant):
        return
    if isinstance(node, ast.Attribute):
        _collect(node.value, loads, bound, walrus, calls)
        return
    if isinstance(node, ast.Call):
        if calls is not None:
            calls.called = True
    elif isinstance(node, ast.Lambda):
        loads.update(free_names(node) - bound)
        if calls is not None:
            calls.lambdas.append(node)
        return
    elif isinstance(node, ast.NamedExpr):
        if walrus is not None and isinstance(node.target, ast.Name):
            walrus.add(node.target.id)
        _collect(node.value, loads, bound, walrus, calls)
        return
    elif isinstance(node, _COMPREHENSIONS):
        inner_bound = set(bound)
        first = True
        for comp in node.generators:
            # The first iterable is evaluated in the enclosing scope.
            _collect(comp.iter, loads, bound if first else inner_bound, walrus, calls)
            first = False
            names: set[str] = set()
            target_names(comp.target, names, loads)
            inner_bound |= names
            for cond in comp.ifs:
                _collect(cond, loads, inner_bound, walrus, calls)
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for part in parts:
            _collect(part, loads, inner_bound, walrus, calls)
        return
    for child in ast.iter_child_nodes(node):
        _collect(child, loads, bound, walrus, calls)


def walrus_names(node: ast.AST) -> set[str]:
    """Names an expression binds in its own scope with ``:=``."""
    out: set[str] = set()
    _collect(node, set(), set(), out)
    return out


def expression_names(node: ast.AST) -> set[str]:
    """Names an expression reads (for tests and tools)."""
    out: set[str] = set()
    _collect(node, out, set())
    return out


def pattern_names(pattern: ast.AST, binds: set[str], uses: set[str]) -> None:
    """Captures a match pattern binds; names its value and class patterns read."""
    if isinstance(pattern, ast.MatchAs):
        if pattern.name:
            binds.add(pattern.name)
        if pattern.pattern is not None:
            pattern_names(pattern.pattern, binds, uses)
        return
    if isinstance(pattern, ast.MatchStar):
        if pattern.name:
            binds.add(pattern.name)
        return
    if isinstance(pattern, ast.MatchMapping):
        if pattern.rest:
            binds.add(pattern.rest)
        for key in pattern.keys:
            _collect(key, uses, set())
        for p in pattern.patterns:
            pattern_names(p, binds, uses)
        return
    if isinstance(pattern, ast.MatchClass):
        _collect(pattern.cls, uses, set())
        for p in (*pattern.patterns, *pattern.kwd_patterns):
            pattern_names(p, binds, uses)
        return
    if isinstance(pattern, ast.MatchValue):
        _collect(pattern.value, uses, set())
        return
    for child in ast.iter_child_nodes(pattern):
        pattern_names(child, binds, uses)


# --------------------------------------------------------------------------- graph building


@dataclass(slots=True)
class _Loop:
    head: int
    after: int


class _Graph:
    def __init__(self) -> None:
        self.graph: nx.DiGraph = nx.DiGraph()
        self.nodes: dict[int, CfgNode] = {}
        self.closures: dict[str, frozenset[str]] = {}
        self.escaped: set[str] = set()
        self.call_reads: set[str] = set()
        self.binding_kinds: dict[str, set[str]] = {}
        self.hint_nodes: dict[int, int] = {}
        self.edges: list[tuple[int, int]] = []

    def new(self, kind: str, node: ast.AST | None = None) -> CfgNode:
        n = CfgNode(id=len(self.nodes), kind=kind, node=node)
        self.nodes[n.id] = n
        return n

    def edge(self, a: int, b: int) -> None:
        self.edges.append((a, b))

    def bind(self, n: CfgNode, names: Iterable[str], how: str, *, certain: bool = True) -> None:
        for name in names:
            n.defs.add(name)
            if certain:
                n.kills.add(name)
            self.binding_kinds.setdefault(name, set()).add(how)

    def read_expr(self, n: CfgNode, expr: ast.AST | None) -> None:
        if expr is None:
            return
        walrus: set[str] = set()
        calls = _Calls()
        loads: set[str] = set()
        _collect(expr, loads, set(), walrus, calls)
        n.uses |= loads
        self.bind(n, walrus, "value", certain=False)
        self._closure_uses(n, loads, expr)
        if calls.called:
            n.uses |= self.call_reads
        for lam in calls.lambdas:
            if expr is not lam:
                self.escaped |= free_names(lam)

    def _closure_uses(self, n: CfgNode, loads: set[str], expr: ast.AST) -> None:
        for name in loads & self.closures.keys():
            n.uses |= self.closures[name]
            if not _only_called(expr, name):
                self.escaped |= self.closures[name]


def _only_called(expr: ast.AST, name: str) -> bool:
    """Is every occurrence of ``name`` in ``expr`` the callee of a call?"""
    ok = True

    def walk(node: ast.AST, callee: bool) -> None:
        nonlocal ok
        if isinstance(node, ast.Name):
            if node.id == name and not callee:
                ok = False
            return
        if isinstance(node, ast.Call):
            walk(node.func, True)
            for arg in (*node.args, *node.keywords):
                walk(arg, False)
            return
        for child in ast.iter_child_nodes(node):
            walk(child, False)

    walk(expr, False)
    return ok


def _is_lambda_binding(stmt: ast.Assign) -> bool:
    return isinstance(stmt.value, ast.Lambda) and len(stmt.targets) == 1 \
        and isinstance(stmt.targets[0], ast.Name)


class _Builder:
    def __init__(self, g: _Graph, declared_outer: set[str]) -> None:
        self.g = g
        self.declared_outer = declared_outer
        self.exit = g.new("exit")
        self.handlers: list[list[int]] = []  # stack of handler entry nodes for try bodies
        self.loops: list[_Loop] = []

    def may_raise_to(self, node: int) -> None:
        for entries in self.handlers[-1:]:
            for h in entries:
                self.g.edge(node, h)

    def block(self, statements: Sequence[ast.stmt], preds: list[int]) -> list[int]:
        for stmt in statements:
            preds = self.statement(stmt, preds)
        return preds

    def link(self, preds: list[int], node: CfgNode) -> None:
        for p in preds:
            self.g.edge(p, node.id)
        self.may_raise_to(node.id)

    def loop_body(self, head: int, body: Sequence[ast.stmt]) -> tuple[list[int], int]:
        after = self.g.new("after-loop")
        self.loops.append(_Loop(head, after.id))
        ends = self.block(body, [head])
        self.loops.pop()
        for e in ends:
            self.g.edge(e, head)
        return ends, after.id

    def statement(self, stmt: ast.stmt, preds: list[int]) -> list[int]:
        g = self.g
        if isinstance(stmt, ast.If):
            test = g.new("if", stmt)
            g.read_expr(test, stmt.test)
            self.link(preds, test)
            outs = self.block(stmt.body, [test.id])
            return outs + (self.block(stmt.orelse, [test.id]) if stmt.orelse else [test.id])
        if isinstance(stmt, ast.While):
            head = g.new("while", stmt)
            g.read_expr(head, stmt.test)
            self.link(preds, head)
            _, after = self.loop_body(head.id, stmt.body)
            outs = self.block(stmt.orelse, [head.id]) if stmt.orelse else [head.id]
            for o in outs:
                g.edge(o, after)
            return [after]
        if isinstance(stmt, ast.For | ast.AsyncFor):
            iterate = g.new("for-iter", stmt)
            g.read_expr(iterate, stmt.iter)
            self.link(preds, iterate)
            head = g.new("for-next", stmt)
            # Resuming inside the loop rebuilds its iterator (range at the saved index, other
            # iterables fast-forwarded), so what the iterable reads stays live in the body.
            head.uses |= iterate.uses
            names: set[str] = set()
            target_names(stmt.target, names, head.uses)
            g.bind(head, names, "value")
            g.edge(iterate.id, head.id)
            self.may_raise_to(head.id)
            _, after = self.loop_body(head.id, stmt.body)
            # The loop may run zero times: the exit leaves from the iterator, not the target.
            outs = [iterate.id, head.id]
            if stmt.orelse:
                outs = self.block(stmt.orelse, outs)
            for o in outs:
                g.edge(o, after)
            return [after]
        if isinstance(stmt, ast.With | ast.AsyncWith):
            enter = g.new("with", stmt)
            for item in stmt.items:
                g.read_expr(enter, item.context_expr)
                if item.optional_vars is not None:
                    names = set()
                    target_names(item.optional_vars, names, enter.uses)
                    g.bind(enter, names, "value")
            self.link(preds, enter)
            first_inner = len(g.nodes)
            ends = self.block(stmt.body, [enter.id])
            after_with = g.new("after-with")
            if not all(_never_suppresses(item.context_expr) for item in stmt.items):
                for inner in range(first_inner, after_with.id):
                    g.edge(inner, after_with.id)  # __exit__ may swallow an exception raised here
            for e in ends:
                g.edge(e, after_with.id)
            return [after_with.id]
        if isinstance(stmt, ast.Try | ast.TryStar):
            return self.try_statement(stmt, preds)
        if isinstance(stmt, ast.Match):
            subject = g.new("match", stmt)
            g.read_expr(subject, stmt.subject)
            self.link(preds, subject)
            arm_ends: list[int] = []
            prev = [subject.id]
            for case in stmt.cases:
                pat = g.new("case", case)
                names = set()
                pattern_names(case.pattern, names, pat.uses)
                # A failed match may leave some captures bound (may-bind); a successful one
                # binds them all before the guard and the body run (certain).
                g.bind(pat, names, "value", certain=False)
                self.link(prev, pat)
                bound = g.new("case-bound", case)
                g.bind(bound, names, "value")
                g.read_expr(bound, case.guard)
                g.edge(pat.id, bound.id)
                self.may_raise_to(bound.id)
                arm_ends += self.block(case.body, [bound.id])
                prev = [pat.id, bound.id] if case.guard is not None else [pat.id]
            return arm_ends + prev
        if isinstance(stmt, _FUNCTIONS):
            node = g.new("def", stmt)
            for d in stmt.decorator_list:
                g.read_expr(node, d)
            if stmt.decorator_list:
                node.uses |= g.call_reads  # a decorator is a call
            for d in _defaults(stmt.args):
                g.read_expr(node, d)
            g.bind(node, {stmt.name}, "def")
            g.closures[stmt.name] = free_names(stmt)
            self.link(preds, node)
            return [node.id]
        if isinstance(stmt, ast.ClassDef):
            node = g.new("class", stmt)
            for expr in (*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)):
                g.read_expr(node, expr)
            loads: set[str] = set()
            stores: set[str] = set()
            _body_names(stmt.body, loads, stores)
            node.uses |= loads - stores
            node.uses |= g.call_reads
            g.bind(node, {stmt.name}, "def")
            self.link(preds, node)
            return [node.id]
        return self.small(stmt, preds)

    def try_statement(self, stmt: ast.Try | ast.TryStar, preds: list[int]) -> list[int]:
        g = self.g
        start = g.new("try", stmt)
        self.link(preds, start)
        handler_nodes: list[tuple[ast.ExceptHandler, CfgNode]] = []
        for h in stmt.handlers:
            hn = g.new("except", h)
            g.read_expr(hn, h.type)
            if h.name:
                g.bind(hn, {h.name}, "value")
            handler_nodes.append((h, hn))
        handler_entries = [hn.id for _, hn in handler_nodes]
        fin_entry = g.new("finally", stmt) if stmt.finalbody else None
        raise_targets = handler_entries + ([fin_entry.id] if fin_entry else [])
        self.handlers.append(raise_targets or [self.exit.id])
        for t in raise_targets:
            g.edge(start.id, t)
        body_outs = self.block(stmt.body, [start.id])
        self.handlers.pop()
        if stmt.orelse:
            body_outs = self.block(stmt.orelse, body_outs)
        outs = list(body_outs)
        if fin_entry is not None:
            self.handlers.append([fin_entry.id])
        for h, hn in handler_nodes:
            ends = self.block(h.body, [hn.id])
            if h.name:
                cleanup = g.new("except-end")
                cleanup.kills.add(h.name)
                cleanup.unbinds.add(h.name)
                for e in ends:
                    g.edge(e, cleanup.id)
                ends = [cleanup.id]
            outs += ends
        if fin_entry is not None:
            self.handlers.pop()
            for o in outs:
                g.edge(o, fin_entry.id)
            ends = self.block(stmt.finalbody, [fin_entry.id])
            # After finally: the normal successor, or wherever the pending jump was going.
            for e in ends:
                g.edge(e, self.exit.id)
                for loop in self.loops[-1:]:
                    g.edge(e, loop.head)
                    g.edge(e, loop.after)
                self.may_raise_to(e)
            return ends
        return outs

    def small(self, small: ast.stmt, preds: list[int]) -> list[int]:
        g = self.g
        node = g.new(type(small).__name__, small)
        if isinstance(small, ast.Expr) and _is_hint(small.value):
            node.kind = "hint"
        if isinstance(small, ast.Assign):
            g.read_expr(node, small.value)
            lam = _is_lambda_binding(small)
            for t in small.targets:
                names: set[str] = set()
                target_names(t, names, node.uses)
                g.bind(node, names, "def" if lam else "value")
            if lam:
                # ``f = lambda: x`` reads x wherever f is used, like a nested def.
                target = small.targets[0]
                assert isinstance(target, ast.Name) and isinstance(small.value, ast.Lambda)
                g.closures[target.id] = free_names(small.value)
        elif isinstance(small, ast.AugAssign):
            g.read_expr(node, small.value)
            names = set()
            target_names(small.target, names, node.uses)
            node.uses |= names  # x += 1 reads x
            g.bind(node, names, "value")
        elif isinstance(small, ast.AnnAssign):
            g.read_expr(node, small.annotation)
            if small.value is not None:
                g.read_expr(node, small.value)
                names = set()
                target_names(small.target, names, node.uses)
                g.bind(node, names, "value")
            elif not isinstance(small.target, ast.Name):
                target_names(small.target, set(), node.uses)
        elif isinstance(small, ast.Delete):
            names = set()
            for t in small.targets:
                target_names(t, names, node.uses)
            node.uses |= names
            node.kills |= names
            node.unbinds |= names
        elif isinstance(small, ast.Import | ast.ImportFrom):
            g.bind(node, {import_binding(a) for a in small.names}, "import")
        elif isinstance(small, ast.Global | ast.Nonlocal):
            pass
        elif isinstance(small, ast.Return):
            g.read_expr(node, small.value)
        elif isinstance(small, ast.Raise):
            g.read_expr(node, small.exc)
            g.read_expr(node, small.cause)
        else:
            g.read_expr(node, small)
        self.link(preds, node)
        if isinstance(small, ast.Return):
            g.edge(node.id, self.exit.id)
            self._through_finally(node.id)
            return []
        if isinstance(small, ast.Raise):
            if not self.handlers:
                g.edge(node.id, self.exit.id)
            return []
        if isinstance(small, ast.Break):
            if self.loops:
                g.edge(node.id, self.loops[-1].after)
            self._through_finally(node.id)
            return []
        if isinstance(small, ast.Continue):
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


_NEVER_SUPPRESS = frozenset({
    "torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
    "torch.no_grad", "torch.enable_grad", "torch.inference_mode", "torch.set_grad_enabled",
    "torch.autograd.set_detect_anomaly", "torch.autograd.detect_anomaly",
    "torch.profiler.record_function", "open", "contextlib.nullcontext"})
"""Context managers whose ``__exit__`` never swallows an exception: the AMP recipe computes its
``loss`` inside ``with torch.autocast(…)``, and a body that might be left half-way would keep
the previous step's ``loss`` (with its autograd graph) live at every hint of the loop."""


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return None if head is None else f"{head}.{expr.attr}"
    return None


def _never_suppresses(expr: ast.expr) -> bool:
    """``expr`` makes a context manager of :data:`_NEVER_SUPPRESS` (by the name it is called
    by: a program that rebinds ``torch`` or ``open`` is not one this analysis follows)."""
    return isinstance(expr, ast.Call) and _dotted(expr.func) in _NEVER_SUPPRESS


def _is_hint(expr: ast.AST) -> bool:
    if not isinstance(expr, ast.Call):
        return False
    f = expr.func
    return (isinstance(f, ast.Name) and f.id == "_checkpoint") or (
        isinstance(f, ast.Attribute) and f.attr == "_checkpoint")


def plain_functions(module: ast.Module) -> dict[str, ast.FunctionDef]:
    """Module-level functions defined by a plain ``def`` (no decorator) whose name nothing else
    in the module binds (no assignment, import, parameter, other definition or ``global``):
    a call by that name is a call of that function."""
    defs: dict[str, list[ast.AST]] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defs.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            defs.setdefault(node.id, []).append(node)
        elif isinstance(node, ast.alias):
            defs.setdefault((node.asname or node.name).split(".")[0], []).append(node)
        elif isinstance(node, ast.arg):
            defs.setdefault(node.arg, []).append(node)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for declared in node.names:
                defs.setdefault(declared, []).append(node)
    return {stmt.name: stmt for stmt in module.body
            if isinstance(stmt, ast.FunctionDef) and not stmt.decorator_list
            and defs.get(stmt.name) == [stmt]}


def module_call_reads(module: ast.Module) -> set[str]:
    """Module names that code in functions and classes reads: any call may read them."""
    reads: set[str] = set()
    for stmt in _all_definitions(module.body):
        if isinstance(stmt, _FUNCTIONS):
            reads |= free_names(stmt)
        else:
            loads: set[str] = set()
            _body_names(stmt.body, loads, set())
            reads |= loads
    return reads


def generator_functions(module: ast.Module) -> frozenset[str]:
    """The :func:`plain_functions` that are generator functions (a ``yield`` of their own): a
    call of one makes a generator."""
    return frozenset(name for name, function in plain_functions(module).items()
                     if any(isinstance(node, ast.Yield | ast.YieldFrom)
                            for node in _own_nodes(function)))


def _own_nodes(function: ast.FunctionDef) -> Iterable[ast.AST]:
    """The nodes of a function's body, not those of the functions, lambdas and classes in it."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                          | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _all_definitions(body: Sequence[ast.stmt]) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef
                                                         | ast.ClassDef]:
    for stmt in _own_statements(body):
        if isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
            yield stmt


def build_cfg(region_node: ast.Module | ast.FunctionDef, statements: Sequence[ast.stmt],
              hint_statements: dict[int, int], *,
              call_reads: set[str] | None = None) -> RegionCfg:
    """The CFG of a region. ``hint_statements`` maps ``id(statement)`` to hint ids.

    ``call_reads`` (module regions): the module names functions read, when the caller has
    them already (:func:`module_call_reads`).
    """
    g = _Graph()
    params: set[str] = set()
    declared_outer: set[str] = set()
    if isinstance(region_node, ast.FunctionDef):
        params = _arg_names(region_node.args)
        declared_outer = _declared_outer(region_node.body)
        g.call_reads = set(declared_outer)
    else:
        g.call_reads = call_reads if call_reads is not None else module_call_reads(region_node)
    for name in params:
        g.binding_kinds.setdefault(name, set()).add("value")
    entry = g.new("entry")
    builder = _Builder(g, declared_outer)
    ends = builder.block(statements, [entry.id])
    for e in ends:
        g.edge(e, builder.exit.id)
    builder.exit.uses |= declared_outer
    for n in g.nodes.values():
        # By identity, not by name: CheckHint's checkpoint_fn_name gives hints other names.
        if n.node is not None and id(n.node) in hint_statements:
            n.kind = "hint"
            n.hint = hint_statements[id(n.node)]
            g.hint_nodes[n.hint] = n.id
    g.graph.add_nodes_from(g.nodes)
    g.graph.add_edges_from(g.edges)
    static = frozenset(name for name, kinds in g.binding_kinds.items()
                       if kinds <= {"import", "def"} and name not in declared_outer)
    return RegionCfg(graph=g.graph, nodes=g.nodes, entry=entry.id, exit=builder.exit.id,
                     params=frozenset(params), static=static, escaped=frozenset(g.escaped),
                     hint_nodes=g.hint_nodes, declared_outer=frozenset(declared_outer),
                     indirect_reads=frozenset(g.call_reads).union(*g.closures.values()))
