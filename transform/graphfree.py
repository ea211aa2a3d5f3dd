"""Reads of a value that need no autograd graph: where a tensor may be saved detached.

A tensor still in an autograd graph cannot be saved as it is (restored as a leaf, a later
``backward()`` would silently stop reaching what it came from). It can be saved detached when no
later read needs its graph: ``x.item()``, ``x.tolist()``, ``x.detach()``, ``float(x)``,
``int(x)``, ``bool(x)``, ``isinstance(x, …)``, ``len(x)``, ``f"{x:.4f}"`` (a format spec of
its own) and arithmetic under ``with torch.no_grad():`` (``avg = 0.9 * avg + 0.1 * loss``, which
records no graph) give the same result either way.

So does a call of one of the program's own functions that uses its argument only in such reads.
pytorch/examples' word language model carries its LSTM state across batches as
``hidden = repackage_hidden(hidden)``, a function that detaches every tensor of a tuple,
recursively::

    def repackage_hidden(h):
        if isinstance(h, torch.Tensor):
            return h.detach()
        return tuple(repackage_hidden(v) for v in h)

:func:`graph_free_functions` finds, for each module-level function, the positional parameters it
reads only that way: in the reads above, as the iterable of a loop or comprehension whose target
is itself read only that way, or passed on at such a parameter of such a function (itself
included). It is a greatest fixpoint: everything is assumed graph-free, and what has a read that
is not is removed until nothing changes. A parameter the function assigns, returns, stores,
reads an attribute of (``x.requires_grad`` differs once detached), or that a nested function
binds again, is not graph-free. Only functions bound once in the whole module, by a plain ``def``
without decorators, count: anything else may be another function at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from transform.cfg import plain_functions

__all__ = ["GraphFreeFunctions", "graph_free_functions", "graph_free_reads",
           "no_grad_statements"]

_GRAPH_FREE_METHODS = frozenset({"item", "tolist", "detach"})
_GRAPH_FREE_BUILTINS = frozenset({"float", "int", "bool", "len"})
_NO_GRAD = frozenset({"no_grad", "inference_mode"})

GraphFreeFunctions = Mapping[str, frozenset[int]]
"""Function name → the positions of its graph-free positional parameters."""


def _parents(root: ast.AST) -> dict[int, ast.AST]:
    parents: dict[int, ast.AST] = {}
    for parent in ast.walk(root):
        for child in ast.iter_child_nodes(parent):
            parents[id(child)] = parent
    return parents


def _is_no_grad(item: ast.withitem) -> bool:
    """``torch.no_grad()`` or ``torch.inference_mode()``, without arguments."""
    call = item.context_expr
    return isinstance(call, ast.Call) and not call.args and not call.keywords \
        and isinstance(call.func, ast.Attribute) and call.func.attr in _NO_GRAD \
        and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"


def _under_no_grad(node: ast.AST, parents: dict[int, ast.AST], outer: bool) -> bool:
    """Whether ``node`` runs under a ``with torch.no_grad():`` (``outer``: the searched
    statement does); not inside a function or lambda, which runs whenever it is called."""
    child, parent = node, parents.get(id(node))
    while parent is not None:
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                      | ast.ClassDef):
            return False
        if isinstance(parent, ast.With) and any(child is s for s in parent.body) \
                and any(_is_no_grad(item) for item in parent.items):
            return True
        child, parent = parent, parents.get(id(parent))
    return outer


def no_grad_statements(root: ast.Module | ast.FunctionDef) -> frozenset[int]:
    """The ids of ``root``'s own statements (not those of functions in it) that run under a
    ``with torch.no_grad():`` or ``with torch.inference_mode():``."""
    found: set[int] = set()

    def visit(body: list[ast.stmt], under: bool) -> None:
        for statement in body:
            if under:
                found.add(id(statement))
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            inner = under or (isinstance(statement, ast.With) and any(
                _is_no_grad(item) for item in statement.items))
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(statement, field, []) or [], inner if field == "body" else under)
            for handler in getattr(statement, "handlers", []):
                visit(handler.body, under)
            for case in getattr(statement, "cases", []):
                visit(case.body, under)

    visit(root.body, False)
    return frozenset(found)


def _free_read(name: ast.Name, parents: dict[int, ast.AST], functions: GraphFreeFunctions,
               free_locals: frozenset[str] | set[str] = frozenset(),
               no_grad: bool = False) -> bool:
    """Whether this load of ``name`` reads it without needing an autograd graph (``no_grad``:
    the statement searched runs under ``torch.no_grad()``)."""
    parent = parents.get(id(name))
    if isinstance(parent, ast.BinOp | ast.UnaryOp | ast.Compare):
        # Arithmetic under no_grad records no graph: the same numbers, attached or not.
        return _under_no_grad(name, parents, no_grad)
    if isinstance(parent, ast.Attribute) and parent.attr in _GRAPH_FREE_METHODS:
        call = parents.get(id(parent))
        return isinstance(call, ast.Call) and call.func is parent and not call.args \
            and not call.keywords
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) \
            and not parent.keywords and name in parent.args:
        callee, position = parent.func.id, parent.args.index(name)
        if callee in _GRAPH_FREE_BUILTINS:
            return len(parent.args) == 1
        if callee == "isinstance":
            return position == 0 and len(parent.args) == 2
        return position in functions.get(callee, ()) and not any(
            isinstance(arg, ast.Starred) for arg in parent.args[:position + 1])
    if isinstance(parent, ast.For | ast.comprehension) and parent.iter is name:
        return isinstance(parent.target, ast.Name) and parent.target.id in free_locals
    if isinstance(parent, ast.FormattedValue) and parent.value is name:
        # f"{loss:.4f}": a tensor formats as its item() (0-dim) or raises (any other), with or
        # without its graph; an empty spec or a conversion prints a tensor's repr, grad_fn in it.
        spec = parent.format_spec
        return parent.conversion == -1 and isinstance(spec, ast.JoinedStr) and bool(
            spec.values) and all(isinstance(v, ast.Constant) and v.value for v in spec.values)
    return False


def graph_free_reads(statement: ast.AST, names: set[str] | frozenset[str],
                     functions: GraphFreeFunctions | None = None,
                     no_grad: bool = False) -> set[str]:
    """The names of ``names`` that ``statement`` mentions, each time as a graph-free read.

    ``functions``: the program's functions that read their arguments graph-free
    (:func:`graph_free_functions`); ``no_grad``: ``statement`` runs under ``torch.no_grad()``
    (:func:`no_grad_statements`). The whole statement is searched (a loop's body too, for
    its header's node): more mentions can only make a name not graph-free."""
    parents = _parents(statement)
    verdict: dict[str, bool] = {}
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and node.id in names:
            if not isinstance(node.ctx, ast.Load) \
                    and not isinstance(parents.get(id(node)), ast.AugAssign):
                continue  # bound or deleted here, not read (``x += …`` reads it)
            free = isinstance(node.ctx, ast.Load) and _free_read(
                node, parents, functions or {}, no_grad=no_grad)
            verdict[node.id] = verdict.get(node.id, True) and free
    return {name for name, free in verdict.items() if free}


def _positional(function: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*function.args.posonlyargs, *function.args.args)]


class _Function:
    """One candidate: its locals that may be read graph-free (positional parameters and
    single-name loop targets), and every mention of each."""

    def __init__(self, function: ast.FunctionDef) -> None:
        self.parameters = _positional(function)
        self.parents: dict[int, ast.AST] = {}
        mentions: dict[str, list[ast.AST]] = {}
        for statement in function.body:
            self.parents.update(_parents(statement))
            for node in ast.walk(statement):
                if isinstance(node, ast.Name):
                    mentions.setdefault(node.id, []).append(node)
                elif isinstance(node, ast.arg):
                    mentions.setdefault(node.arg, []).append(node)
                elif isinstance(node, ast.Global | ast.Nonlocal):
                    for declared in node.names:
                        mentions.setdefault(declared, []).append(node)
        self.mentions = mentions
        loop_targets = {node.target.id for statement in function.body
                        for node in ast.walk(statement)
                        if isinstance(node, ast.For | ast.comprehension)
                        and isinstance(node.target, ast.Name)}
        self.free: set[str] = (set(self.parameters) | loop_targets) - {
            a.arg for a in (function.args.vararg, function.args.kwarg) if a is not None} - {
            a.arg for a in function.args.kwonlyargs}
        self.binds = {name for name, nodes in mentions.items()
                      if any(not isinstance(n, ast.Name) or not isinstance(n.ctx, ast.Load)
                             for n in nodes)} | set(self.parameters)

    def settle(self, functions: GraphFreeFunctions) -> bool:
        """Drop the locals with a read or binding that is not graph-free; whether any was."""
        visible = {name: positions for name, positions in functions.items()
                   if name not in self.binds}
        dropped = False
        for local in sorted(self.free):
            if not all(self._free_mention(node, local, visible)
                       for node in self.mentions.get(local, ())):
                self.free.discard(local)
                dropped = True
        return dropped

    def _free_mention(self, node: ast.AST, local: str, functions: GraphFreeFunctions) -> bool:
        if not isinstance(node, ast.Name):
            return False  # bound again by a nested function, or declared global
        if isinstance(node.ctx, ast.Load):
            return _free_read(node, self.parents, functions, self.free)
        # A store: only as the target of a loop over a graph-free local, so that every value
        # it takes is an element of a value read graph-free.
        parent = self.parents.get(id(node))
        return local not in self.parameters \
            and isinstance(node.ctx, ast.Store) \
            and isinstance(parent, ast.For | ast.comprehension) and parent.target is node \
            and isinstance(parent.iter, ast.Name) and parent.iter.id in self.free

    def positions(self) -> frozenset[int]:
        return frozenset(i for i, name in enumerate(self.parameters) if name in self.free)


def graph_free_functions(module: ast.Module) -> dict[str, frozenset[int]]:
    """The module's functions that read some positional parameters graph-free, with their
    positions (functions with none are left out)."""
    functions = {name: _Function(node) for name, node in plain_functions(module).items()}
    while True:
        current = {name: f.positions() for name, f in functions.items()}
        changed = False
        for function in functions.values():
            changed |= function.settle(current)
        if not changed:
            return {name: positions for name, f in functions.items()
                    if (positions := f.positions())}
