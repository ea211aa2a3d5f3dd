"""Hints in a function called from a loop: the caller *hosts* the callee's checkpoints.

pytorch/examples' mnist calls ``train(args, model, …)`` once per epoch from ``main()``'s loop,
and the batch loop is in ``train()``. A hint there cannot be a checkpoint of ``train()`` alone
(a restart would run the earlier epochs' calls again, see :mod:`transform.calls`). Hosted, it is
a checkpoint of ``main()``: the schedule sees ``train()``'s body where it is called (the batch
loop nested in the epoch loop), a save holds the live values of every function on the call
stack, and a resume walks ``main()``'s loop to the saved epoch, restores ``main()``'s values,
calls ``train()`` again with them, and walks its loop to the saved batch.

A function ``f`` holding hints (or hosting another) is hosted by the function ``g`` that calls it
when, statically and conservatively, the call is the only reference to ``f`` in the file (by
name; a method by its attribute name), it is the whole value of a simple statement of ``g``'s own
body (``f(…)``, ``x = f(…)``, ``x: T = f(…)``, ``x += f(…)``) that sits alone on its line, inside a
``for`` or ``while`` loop of ``g`` (or of the module's top level; not in a lambda or
comprehension), ``f`` is not called
implicitly (``forward``, dunder methods), has no decorator but the schedule's, and declares no
``global``/``nonlocal`` names. Hosting repeats up the calls (``main`` → ``run_epoch`` →
``micro_steps``); the function at the top is the region. A call found this way whose arguments
are not plain expressions (names, constants, attributes, subscripts, arithmetic, lambdas with
plain defaults) is refused:
the resume evaluates them again, from the values saved at the checkpoint, and a call among them
(``next(it)``) would not give what it gave the first time.

Anything else keeps today's rule (:mod:`transform.calls`): a checkpointing function entered more
than once is refused with the call site.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from transform.calls import PARAMS_DECORATORS, NameIndex, decorator_name
from transform.errors import SourceIssue

__all__ = ["Hosting", "find_hostings", "hosted_under"]

_CALL_STATEMENTS = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)
_LOOPS = (ast.For, ast.While)
_OPAQUE = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

_PLAIN = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.BinOp,
          ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.List, ast.Starred,
          ast.IfExp, ast.JoinedStr, ast.FormattedValue,
          ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hosting:
    """``callee`` runs inside ``caller``'s region: its body is part of the caller's."""

    callee: ast.FunctionDef
    callee_name: str
    """Qualified (``Trainer.run_epoch``): what the running frame's ``co_qualname`` says."""
    caller: ast.FunctionDef | ast.Module
    caller_name: str
    """Qualified, or ``<module>`` for a loop at the module's top level."""
    call: ast.stmt
    """The caller's statement whose value is the call."""


def find_hostings(module: ast.Module, holders: Mapping[int, ast.FunctionDef], lines: list[str],
                  path: str) -> tuple[dict[int, Hosting], SourceIssue | None]:
    """Which functions are hosted (id of the callee's ``def`` → :class:`Hosting`), from the
    functions holding hints (``holders``: id → def), and the first refused hosting call.

    A function is hosted where it has to be: its call is in a loop of its caller, or its caller
    (called once, from a loop further up) is hosted in turn. One called once from a function
    that runs once stays its own region, restored in place into what its caller rebuilds."""
    index = NameIndex(module)
    sites: dict[int, tuple[ast.FunctionDef | ast.Module, ast.stmt, ast.Call, bool] | None] = {}

    def site(func: ast.FunctionDef
             ) -> tuple[ast.FunctionDef | ast.Module, ast.stmt, ast.Call, bool] | None:
        if id(func) not in sites:
            sites[id(func)] = _host_of(func, index)
        return sites[id(func)]

    def needed(func: ast.FunctionDef, seen: frozenset[int]) -> bool:
        found = site(func)
        if found is None:
            return False
        caller, _, _, in_loop = found
        return in_loop or (isinstance(caller, ast.FunctionDef) and id(caller) not in seen
                           and needed(caller, seen | {id(func)}))

    hosted: dict[int, Hosting] = {}
    todo = list(holders.values())
    issue: SourceIssue | None = None
    while todo:
        func = todo.pop()
        found = site(func)
        if id(func) in hosted or found is None or not needed(func, frozenset()):
            continue
        caller, statement, call, _ = found
        if _leads_to(caller, func, hosted):
            continue  # recursion: refused by transform.calls
        if issue is None:
            issue = _refusal(statement, call, func, lines, path)
        hosted[id(func)] = Hosting(callee=func, callee_name=index.qualified[id(func)],
                                   caller=caller,
                                   caller_name=index.qualified.get(id(caller), "<module>"),
                                   call=statement)
        if isinstance(caller, ast.FunctionDef):
            todo.append(caller)
    return hosted, issue


def _host_of(func: ast.FunctionDef, index: NameIndex
             ) -> tuple[ast.FunctionDef | ast.Module, ast.stmt, ast.Call, bool] | None:
    """The caller, statement and call that could host ``func``, and whether the call is in a
    loop, if its shape allows."""
    if func.name == "forward" or (func.name.startswith("__") and func.name.endswith("__")):
        return None
    if any(decorator_name(d) not in PARAMS_DECORATORS for d in func.decorator_list):
        return None
    if any(isinstance(n, ast.Global | ast.Nonlocal) for n in ast.walk(func)):
        return None
    refs = index.references(func)
    if len(refs) != 1:
        return None
    call = index.up(refs[0])
    if not isinstance(call, ast.Call) or call.func is not refs[0]:
        return None
    statement = index.up(call)
    if not isinstance(statement, _CALL_STATEMENTS) or statement.value is not call:
        return None
    scope = index.scope(statement)
    if not isinstance(scope, ast.FunctionDef | ast.Module) or scope is func:
        return None
    node = index.up(statement)
    in_loop = False
    while node is not None and node is not scope:
        if isinstance(node, (*_OPAQUE, ast.ClassDef)):
            return None
        if isinstance(node, _LOOPS) and statement not in getattr(node, "orelse", ()):
            in_loop = True
        node = index.up(node)
    return scope, statement, call, in_loop


def hosted_under(node: ast.AST, hostings: Iterable[Hosting]) -> list[ast.FunctionDef]:
    """The functions whose bodies are part of ``node``'s region, through every level."""
    pending = list(hostings)
    out: list[ast.FunctionDef] = []
    hosts = {id(node)}
    changed = True
    while changed:
        changed = False
        for hosting in pending:
            if id(hosting.caller) in hosts and id(hosting.callee) not in hosts:
                hosts.add(id(hosting.callee))
                out.append(hosting.callee)
                changed = True
    return out


def _leads_to(caller: ast.FunctionDef | ast.Module, func: ast.FunctionDef,
              hosted: dict[int, Hosting]) -> bool:
    """Is ``caller`` hosted, directly or up the chain, by ``func``?"""
    seen: ast.AST = caller
    while seen is not func:
        step = hosted.get(id(seen))
        if step is None:
            return False
        seen = step.caller
    return True


def _evaluated(expr: ast.expr) -> Iterable[ast.AST]:
    """The nodes that evaluating ``expr`` evaluates: a lambda's defaults, not its body (made
    again on resume, a callback lambda closes over the restored names, as the first one did)."""
    stack: list[ast.AST] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            stack.extend(node.args.defaults)
            stack.extend(d for d in node.args.kw_defaults if d is not None)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _refusal(statement: ast.stmt, call: ast.Call, func: ast.FunctionDef, lines: list[str],
             path: str) -> SourceIssue | None:
    for arg in (*call.args, *(k.value for k in call.keywords)):
        bad = next((n for n in _evaluated(arg) if not isinstance(n, _PLAIN)), None)
        if bad is not None:
            return SourceIssue(
                path=path, line=bad.lineno if hasattr(bad, "lineno") else statement.lineno,
                column=getattr(bad, "col_offset", statement.col_offset) + 1,
                kind="checkpoints-call-arguments",
                message=f"{func.name}() holds checkpoints and a resume calls it again here with "
                        "its arguments evaluated again from the saved values: an argument "
                        "must be a plain expression (names, constants, attributes, "
                        "subscripts, arithmetic, lambdas), not a call; compute it on the line "
                        "before and pass the name")
    # ast offsets count UTF-8 bytes
    first = lines[statement.lineno - 1].encode("utf-8")
    last = lines[(statement.end_lineno or statement.lineno) - 1].encode("utf-8")
    tail = last[statement.end_col_offset or 0:].strip()
    if first[:statement.col_offset].strip() or (tail and not tail.startswith(b"#")):
        return SourceIssue(path=path, line=statement.lineno, column=statement.col_offset + 1,
                           kind="checkpoints-call-not-alone",
                           message=f"{func.name}() holds checkpoints: put its call on a line "
                                   "of its own (a resume runs that line again)")
    return None


