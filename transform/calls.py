"""How often a checkpointing function is entered: refuse the shapes a resume cannot continue.

A function whose hints become checkpoints resumes by counting its entries: on restart the
program runs from the top, the callers run again, and the entry the resume state belongs to
walks back to the saved point. That is exact only when every entry before the saved one is the
same work again and nothing the earlier entries do can overwrite the state. A function called
once per epoch breaks it: the restart runs the earlier calls in full, and their checkpoints
overwrite the saved later state (progress goes 1→2→3→1… and a run killed often never ends). A
function called while another checkpointing function runs (hints in ``train()`` and in
``main()``'s epoch loop) cannot be resumed at all: one resume state holds one region's position.

So, statically and conservatively, a checkpointing function is accepted only when the program
enters it at most once: at most one call site, called by name (never passed, stored or wrapped;
a method must be called by name in this file, and never one Python or torch calls implicitly:
dunder methods, ``forward``),
not inside a loop, comprehension or lambda of its caller, and every function on the way up to
the module is entered at most once too and does not checkpoint itself. Everything else is
refused at transform time, naming the call site and what to do (move the hint into the caller's
loop). The analysis is by name: a method is matched by its attribute name, a function by its
name; a shadowing name can only make it refuse more, never accept a shape it should not.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from transform.errors import SourceIssue
from transform.tasks import CHECKHINT_NAME, PARAMS_NAME

PARAMS_DECORATORS = (PARAMS_NAME, CHECKHINT_NAME)

__all__ = ["EntryIssue", "NameIndex", "check_single_entry", "decorator_name"]

_REPEATING = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp,
              ast.GeneratorExp, ast.Lambda)


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryIssue:
    """Why a checkpointing function may be entered more than once, and where."""

    node: ast.AST
    """The call site (or reference) to point at."""
    kind: str
    message: str

    def issue(self, path: str) -> SourceIssue:
        return SourceIssue(path=path, line=getattr(self.node, "lineno", 1),
                           column=getattr(self.node, "col_offset", 0) + 1, message=self.message,
                           kind=self.kind)


class NameIndex:
    """Parents of every node, every load of each name (``f``) and of each attribute (``x.f``),
    and the qualified name of every def and class."""

    def __init__(self, module: ast.Module) -> None:
        self.parent: dict[int, ast.AST] = {}
        self.names: dict[str, list[ast.Name]] = {}
        self.attributes: dict[str, list[ast.Attribute]] = {}
        self.qualified: dict[int, str] = {}
        stack: list[tuple[ast.AST, str]] = [(module, "")]
        while stack:
            node, prefix = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.qualified[id(node)] = f"{prefix}{node.name}"
                prefix = f"{prefix}{node.name}."
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
                stack.append((child, prefix))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.names.setdefault(node.id, []).append(node)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.attributes.setdefault(node.attr, []).append(node)

    def up(self, node: ast.AST) -> ast.AST | None:
        return self.parent.get(id(node))

    def references(self, func: ast.FunctionDef | ast.AsyncFunctionDef
                   ) -> list[ast.Name | ast.Attribute]:
        """Loads that may denote ``func``: its name; for a method, ``x.name`` as well."""
        refs: list[ast.Name | ast.Attribute] = list(self.names.get(func.name, []))
        if isinstance(self.up(func), ast.ClassDef):
            refs += self.attributes.get(func.name, [])
        return sorted(refs, key=lambda n: (n.lineno, n.col_offset))

    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose code ``node`` belongs to."""
        cur = self.up(node)
        while cur is not None and not isinstance(cur, ast.Module | ast.FunctionDef
                                                 | ast.AsyncFunctionDef):
            cur = self.up(cur)
        assert cur is not None
        return cur

    def label(self, scope: ast.AST) -> str:
        return f"{self.qualified[id(scope)]}()" if id(scope) in self.qualified \
            else "the module's top level"


def check_single_entry(module: ast.Module, chosen: Mapping[str, ast.FunctionDef]
                       ) -> EntryIssue | None:
    """The first reason a checkpointing function (``chosen``: region name → ``def``) may be
    entered more than once per run, or while another checkpointing function runs; None when
    each is entered at most once."""
    index = NameIndex(module)
    for name in sorted(chosen):
        issue = _entered_once(chosen[name], name, index, set(chosen), set(),
                              f"{name}() holds checkpoints and")
        if issue is not None:
            return issue
    return None


def _entered_once(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, index: NameIndex,
                  chosen: set[str], seen: set[int], subject: str) -> EntryIssue | None:
    """``subject`` opens the messages reported as they are: ``train() holds checkpoints and``,
    or for a caller ``main(), which leads to train() that holds checkpoints,``."""
    if id(func) in seen:
        return EntryIssue(node=func, kind="recursive-checkpoints",
                          message=f"{subject} calls itself (directly or through its callers): "
                                  "a resumed program cannot tell which call the saved state "
                                  "belongs to; keep the hints in the outermost call's loop")
    seen = seen | {id(func)}
    calls = []
    for ref in index.references(func):
        parent = index.up(ref)
        if isinstance(parent, ast.Call) and parent.func is ref:
            calls.append(parent)
            continue
        return EntryIssue(
            node=ref, kind="checkpoints-by-reference",
            message=f"{subject} is used here as a value (passed, stored or wrapped), so the "
                    "transformer cannot tell how often it runs: call it directly, once, or "
                    "move the hints to the loop that calls it")
    method = isinstance(index.up(func), ast.ClassDef)
    # A decorator other than the schedule's own may register the function to be called
    # elsewhere (atexit.register, a framework's hooks).
    registered = any(decorator_name(d) not in PARAMS_DECORATORS for d in func.decorator_list)
    if (method or registered) and (not calls or func.name == "forward"
                                   or (func.name.startswith("__") and func.name.endswith("__"))):
        return EntryIssue(
            node=func, kind="checkpoints-called-implicitly",
            message=f"{subject} is called by something other than this file's code (an "
                    "operator such as model(x) → forward, a protocol method, a decorator that "
                    "registers it, or a framework calling it by name), so the transformer "
                    "cannot tell how often it runs: move the hints to the loop that drives it")
    if len(calls) > 1:
        lines = ", ".join(str(c.lineno) for c in calls)
        return EntryIssue(
            node=calls[1], kind="checkpoints-called-repeatedly",
            message=f"{name}() holds checkpoints and is called on lines {lines}: a restart "
                    "would run the earlier calls again and their checkpoints would overwrite "
                    "the saved later state; call it once, or move its hints to the code that "
                    "calls it")
    for call in calls:
        scope = index.scope(call)
        caller_name = index.qualified.get(id(scope), "")
        if caller_name in chosen:
            return EntryIssue(
                node=call, kind="nested-checkpoints",
                message=f"{name}() holds checkpoints and is called here by {caller_name}(), "
                        "which checkpoints too: one resume state holds one function's "
                        "position, so the program could not continue both; keep only "
                        f"{caller_name}()'s hints (remove those in {name}())")
        node: ast.AST | None = index.up(call)
        while node is not None and node is not scope:
            if isinstance(node, _REPEATING):
                if isinstance(node, ast.For | ast.AsyncFor | ast.While):
                    where = f"a loop (line {node.lineno})"
                    advice = (f"move the hint into that loop of {index.label(scope)}, after the "
                              f"call, and remove the hints in {name}()")
                else:
                    where = "a comprehension or lambda"
                    advice = f"call {name}() once, outside it"
                return EntryIssue(
                    node=call, kind="checkpoints-called-in-loop",
                    message=f"{name}() holds checkpoints and is called here inside {where}, "
                            "once per iteration: a restart would run the earlier calls again "
                            "and their checkpoints would overwrite the saved later state; "
                            f"{advice}")
            node = index.up(node)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            issue = _entered_once(scope, caller_name, index, chosen, seen,
                                  f"{caller_name}(), which leads to {name}() that holds "
                                  "checkpoints,")
            if issue is not None:
                if issue.kind in ("recursive-checkpoints", "checkpoints-by-reference"):
                    return issue
                return EntryIssue(
                    node=call, kind=issue.kind,
                    message=f"{name}() holds checkpoints and is called here by "
                            f"{caller_name}(), which may run more than once (line "
                            f"{getattr(issue.node, 'lineno', '?')}): a restart would run the "
                            "earlier calls again and their checkpoints would overwrite the "
                            f"saved later state; move the hints to the loop that calls "
                            f"{caller_name}()")
    return None


def decorator_name(expr: ast.expr) -> str | None:
    node = expr.func if isinstance(expr, ast.Call) else expr
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None
