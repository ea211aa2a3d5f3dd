"""Code generation: a program that checkpoints at the chosen hints and resumes by itself.

Mechanism: *walk and skip*, chosen because it keeps the program's own lines as they are. A
resumed region runs again from its start with ``_ecrl.run`` False; every statement that could
run before the saved point is guarded, headers on the way steer into the saved point, and the
walk ends just after the saved ``_checkpoint()``. Concretely (``K`` numbers a site, ``H`` a hint):

* a simple statement gets a guard line before it, joined by a backslash, so its own line stays
  byte-identical::

      if _ecrl.run: \\
      loss = step(batch)  # the original line, untouched

* definitions (``import``, ``def``, ``class``, ``name = lambda …``) are never guarded: they run
  again, so they are re-created rather than saved (liveness reports them as ``rebind``);
* compound statements on the way to a saved point steer: ``for t in _ecrl.loop(K)(it):``
  (restart at the saved index, or fast-forward), ``if (test) if _ecrl.run else _ecrl.into(K):``
  (and likewise ``elif``/``while``/``case`` guards), ``match`` replays its saved subject,
  ``with`` and ``try`` are simply re-entered;
* compound statements that must be skipped evaluate nothing: ``for t in (it) if _ecrl.run else
  ():``, ``_ecrl.run and (test)``, ``with (cm) if _ecrl.run else _ecrl.SKIP:`` plus a first
  ``_ecrl.skip()`` in the body, an extra ``elif not _ecrl.run: pass`` before an ``else``, an
  extra first ``case _ if not _ecrl.run: pass``;
* after each chosen hint, ``_ecrl.checkpoint(H)`` saves when the schedule says so and, when a
  walk arrives there, binds the saved values again; before the outermost statement holding a
  saved point, ``_ecrl.restore(H)`` binds them for the headers the walk evaluates.

Lifting tasks into functions (CheckHint) would re-indent and move the user's code and break
closures, ``global`` and ``return``; wrapping tasks in guarded blocks would re-indent them.
Here every original line is kept or, for a steered header, changed only inside its expression.

The task tree is Python's ``ast``; libcst is used only here, once: its statements are paired
with the ``ast`` statements by walking both trees in step, and edits are applied by identity.
"""

from __future__ import annotations

import ast
import hashlib
import pprint
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import libcst as cst

from transform._tasks_build import is_elif, is_hint_statement
from transform.analysis import AnalysisSuccess
from transform.calls import check_single_entry
from transform.cfg import (
    free_names,
    import_binding,
    module_call_reads,
    pattern_names,
    target_names,
    walrus_names,
)
from transform.errors import SourceError, SourceIssue
from transform.plan import slot_positions
from transform.planspec import HintSpec, Plan, RegionSpec, SlotRule
from transform.tasks import Branch, Loop, Seq

__all__ = ["Generated", "generate", "already_transformed", "ACTIVATION", "PROGRAM", "RUNTIME",
           "MARKER"]

ACTIVATION = "_ecrl"
PROGRAM = "_ECRL"
RUNTIME = "_ecrl_runtime"
MARKER = f"import transform.runtime as {RUNTIME}"
_RESERVED = (ACTIVATION, PROGRAM, RUNTIME)
_WIDTH = 96


@dataclass(frozen=True, kw_only=True, slots=True)
class Generated:
    """The written program, or the reason nothing was written."""

    code: str
    changed: bool
    note: str = ""
    """One line for the user when the program is left unchanged."""
    checkpoints: tuple[int, ...] = ()
    """Hint ids that became checkpoints."""
    plan: dict[str, Any] = field(default_factory=dict, repr=False)


# --------------------------------------------------------------------------- analysis of a region


@dataclass(slots=True)
class _Step:
    block: list[ast.stmt]
    index: int
    arm: tuple[str, ast.AST] | None
    """How the way continues into ``block[index]`` (``None``: it is the hint)."""


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _is_definition(stmt: ast.stmt) -> bool:
    if isinstance(stmt, _DEFINITIONS):
        return True
    return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Lambda)
            and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name))


def _never_guarded(stmt: ast.stmt) -> bool:
    """Statements that run unguarded while walking: definitions and no-ops."""
    if _is_definition(stmt) or isinstance(stmt, ast.Global | ast.Nonlocal | ast.Pass):
        return True
    if is_hint_statement(stmt) or (isinstance(stmt, ast.Expr)
                                   and isinstance(stmt.value, ast.Constant)):
        return True  # the hint itself and docstrings do nothing
    return isinstance(stmt, ast.AnnAssign) and stmt.value is None and isinstance(
        stmt.target, ast.Name) and stmt.target.id in ("_iterations", "_cost")


def _line_mates(block: Sequence[ast.stmt], stmt: ast.stmt) -> list[ast.stmt]:
    end = stmt.end_lineno or stmt.lineno
    return [s for s in block if s is not stmt and s.lineno <= end
            and stmt.lineno <= (s.end_lineno or s.lineno)]


def _bindings(body: Sequence[ast.stmt]) -> dict[str, list[ast.stmt]]:
    """Name → the statements of a region that bind it (nested scopes: only their names)."""
    out: dict[str, list[ast.stmt]] = {}

    def add(names: Iterable[str], stmt: ast.stmt) -> None:
        for n in names:
            out.setdefault(n, []).append(stmt)

    def visit(block: Sequence[ast.stmt]) -> None:
        for s in block:
            names: set[str] = set()
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                add([s.name], s)
                continue
            if isinstance(s, ast.Import | ast.ImportFrom):
                add((import_binding(a) for a in s.names), s)
                continue
            if isinstance(s, ast.Assign):
                for t in s.targets:
                    target_names(t, names, set())
            elif isinstance(s, ast.AugAssign | ast.For | ast.AsyncFor) or (
                    isinstance(s, ast.AnnAssign) and s.value is not None):
                target_names(s.target, names, set())
            elif isinstance(s, ast.With | ast.AsyncWith):
                for item in s.items:
                    if item.optional_vars is not None:
                        target_names(item.optional_vars, names, set())
            elif isinstance(s, ast.Try | ast.TryStar):
                names.update(h.name for h in s.handlers if h.name)
            elif isinstance(s, ast.Match):
                for case in s.cases:
                    pattern_names(case.pattern, names, set())
            for expr in _own_expressions(s):
                names |= walrus_names(expr)
            add(names, s)
            for _name, value in ast.iter_fields(s):
                if isinstance(value, list) and value:
                    if isinstance(value[0], ast.stmt):
                        visit(value)
                    elif isinstance(value[0], ast.ExceptHandler | ast.match_case):
                        for h in value:
                            visit(h.body)

    visit(body)
    return out


def _own_expressions(stmt: ast.stmt) -> list[ast.expr]:
    """The expressions of a statement itself (not of the statements in its blocks)."""
    out: list[ast.expr] = []
    for _name, value in ast.iter_fields(stmt):
        if isinstance(value, ast.expr):
            out.append(value)
        elif isinstance(value, list):
            out.extend(v for v in value if isinstance(v, ast.expr))
            for v in value:
                if isinstance(v, ast.withitem):
                    out.append(v.context_expr)
                elif isinstance(v, ast.match_case) and v.guard is not None:
                    out.append(v.guard)
    return out


def _is_range_call(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) \
        and expr.func.id == "range"


_UNSAVEABLE_CALLS = {"open": "an open file", "iter": "an iterator",
                     "enumerate": "an iterator", "zip": "an iterator", "map": "an iterator",
                     "filter": "an iterator"}


def _unsaveable_kind(stmt: ast.stmt) -> str | None:
    """What an assignment binds when it is obviously something no checkpoint can hold."""
    value = stmt.value if isinstance(stmt, ast.Assign) else None
    if isinstance(value, ast.GeneratorExp):
        return "a generator"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return _UNSAVEABLE_CALLS.get(value.func.id)
    return None


class _Marks:
    """Per statement: what the generated code does there (filled region by region)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = lines
        self.skip: set[int] = set()
        self.site: dict[tuple[str, int], int] = {}
        self.sites: dict[int, set[int]] = {}
        self.ranges: set[int] = set()
        self.hint_loops: dict[int, list[int]] = {}
        self.hint_subjects: dict[int, list[int]] = {}
        self.restore_before: dict[int, list[int]] = {}
        self.chosen: dict[int, int] = {}
        """id(hint statement) → hint id."""
        self.chains: dict[int, list[_Step]] = {}
        self.branches: dict[int, int] = {}
        """id(branch statement) → its settle site (branches holding chosen slots)."""
        self.settle: dict[int, dict[int, int]] = {}
        """settle site → {slot id: positions per execution of the branch}."""

    def site_for(self, kind: str, node: ast.AST, hint: int) -> int:
        key = (kind, id(node))
        if key not in self.site:
            self.site[key] = len(self.site) + 1
            self.sites[self.site[key]] = set()
        k = self.site[key]
        self.sites[k].add(hint)
        return k

    def mark_skip(self, stmt: ast.stmt) -> None:
        if id(stmt) in self.skip:
            return
        self.skip.add(id(stmt))
        # A skipped try still runs its blocks (nothing raises), a skipped loop its else block.
        if isinstance(stmt, ast.Try | ast.TryStar):
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                for s in block:
                    self.mark_skip(s)
        elif isinstance(stmt, ast.For | ast.While):
            for s in stmt.orelse:
                self.mark_skip(s)

    def region(self, body: list[ast.stmt], chosen: dict[int, int]) -> None:
        chains: dict[int, list[_Step]] = {}

        def visit(block: list[ast.stmt], chain: list[_Step]) -> None:
            for i, s in enumerate(block):
                if id(s) in chosen:
                    chains[chosen[id(s)]] = [*chain, _Step(block, i, None)]
                elif isinstance(s, ast.For | ast.While):
                    visit(s.body, [*chain, _Step(block, i, ("loop", s))])
                elif isinstance(s, ast.If):
                    node = s
                    while True:
                        visit(node.body, [*chain, _Step(block, i, ("arm", node))])
                        nxt = node.orelse
                        if len(nxt) == 1 and isinstance(nxt[0], ast.If) \
                                and is_elif(self.lines, nxt[0]):
                            node = nxt[0]
                            continue
                        if nxt:
                            visit(nxt, [*chain, _Step(block, i, ("else", node))])
                        break
                elif isinstance(s, ast.With):
                    visit(s.body, [*chain, _Step(block, i, ("with", s))])
                elif isinstance(s, ast.Try | ast.TryStar):
                    visit(s.body, [*chain, _Step(block, i, ("try", s))])
                elif isinstance(s, ast.Match):
                    for case in s.cases:
                        visit(case.body, [*chain, _Step(block, i, ("case", case))])

        visit(body, [])
        for hint, chain in sorted(chains.items()):
            self.chains[hint] = chain
            self.hint_loops[hint] = []
            self.hint_subjects[hint] = []
            for step in chain:
                for s in step.block[:step.index]:
                    self.mark_skip(s)
                stmt = step.block[step.index]
                if step.arm is None:
                    continue
                kind, node = step.arm
                if kind == "loop":
                    k = self.site_for("loop", stmt, hint)
                    if isinstance(stmt, ast.For):
                        self.hint_loops[hint].append(k)
                        if _is_range_call(stmt.iter):
                            self.ranges.add(k)
                elif kind in ("arm", "else"):
                    self.site_for(kind, node, hint)
                elif kind == "with":
                    self.site_for("with", stmt, hint)
                elif kind == "case":
                    self.hint_subjects[hint].append(self.site_for("match", stmt, hint))
                    self.site_for("case", node, hint)
            if len(chain) > 1:
                top = chain[0].block[chain[0].index]
                self.restore_before.setdefault(id(top), []).append(hint)

    def walk_executed(self, hint: int, stmt: ast.stmt) -> bool:
        """Does ``stmt`` run again (unguarded) on the way to ``hint``'s saved point?"""
        for step in self.chains[hint]:
            before = step.block[:step.index]
            if any(s is stmt for s in before):
                return _never_guarded(stmt) and all(
                    _never_guarded(m) for m in _line_mates(step.block, stmt))
        return False


# --------------------------------------------------------------------------- the plan


def _slot_rules(result: AnalysisSuccess, all_hints: bool) -> tuple[dict[int, int],
                                                                     dict[int, dict[str, Any]]]:
    """hint → slot id, and slot id → firing rule (as the runtime reads it)."""
    slot_of: dict[int, int] = {}
    rules: dict[int, dict[str, Any]] = {}
    for schedule in result.schedules:
        for f in schedule.firings:
            if not f.hints:
                continue
            if all_hints:
                rule: dict[str, Any] = {"kind": "always", "total": f.total, "count": f.total}
            elif f.count == 0:
                continue
            else:
                rule = {"kind": f.kind, "total": f.total, "count": f.count}
                if f.kind == "occurrences":
                    rule["occurrences"] = list(f.occurrences)
                elif f.kind == "balanced":
                    rule.update(first=f.first, last=f.last, blocks=f.blocks)
            slot = min(f.hints)
            rules[slot] = rule
            for h in f.hints:
                slot_of[h] = slot
    if all_hints:
        for hint in result.hints:
            if hint.id not in slot_of:
                slot_of[hint.id] = hint.id
                rules[hint.id] = {"kind": "always", "total": 0, "count": 1}
    return slot_of, rules


def _module_values(module: ast.Module) -> set[str]:
    """Names the module's own code binds to values (not by import, def or class)."""
    out: set[str] = set()
    for name, stmts in _bindings(module.body).items():
        if any(not _is_definition(s) for s in stmts):
            out.add(name)
    return out


def _declared_globals(func: ast.FunctionDef) -> list[str]:
    names: list[str] = []
    stack: list[ast.stmt] = list(func.body)
    while stack:
        s = stack.pop()
        if isinstance(s, ast.Global):
            names.extend(s.names)
        elif not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for _name, value in ast.iter_fields(s):
                if isinstance(value, list) and value:
                    if isinstance(value[0], ast.stmt):
                        stack.extend(value)
                    elif isinstance(value[0], ast.ExceptHandler | ast.match_case):
                        for h in value:
                            stack.extend(h.body)
    return sorted(set(names))


def _params(func: ast.FunctionDef) -> list[str]:
    a = func.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return names


# --------------------------------------------------------------------------- emitting


def _expr(template: str, **subs: cst.BaseExpression) -> cst.BaseExpression:
    node = cst.parse_expression(template)
    if not subs:
        return node
    return node.visit(_Substitute(subs))  # type: ignore[return-value]


class _Substitute(cst.CSTTransformer):
    def __init__(self, subs: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.subs = subs

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name
                   ) -> cst.BaseExpression:
        return self.subs.get(original_node.value, updated_node)


def _paren(node: cst.BaseExpression) -> cst.BaseExpression:
    """One more pair of parentheses, always (so the original reads back unambiguously)."""
    return node.with_changes(lpar=[cst.LeftParen(), *node.lpar],
                             rpar=[*node.rpar, cst.RightParen()])


def _arg(node: cst.BaseExpression) -> cst.BaseExpression:
    """An expression as a call's only argument: a bare tuple needs parentheses."""
    return _paren(node) if isinstance(node, cst.Tuple) else node


def _statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text)


def _targets(names: Sequence[str], first: str, indent: str = "") -> str:
    """``a, b = <rest>`` (``[a] = `` for one name), wrapped to the width."""
    joined = names[0] if len(names) == 1 else ", ".join(names)
    one = f"[{joined}] = {first}" if len(names) == 1 else f"{joined} = {first}"
    if len(indent) + len(one) <= _WIDTH or len(names) == 1:
        return one
    body = textwrap.fill(", ".join(names), width=_WIDTH - len(indent) - 1,
                         subsequent_indent=" ", break_long_words=False)
    return f"({body}) = {first}"


class _Emitter:
    def __init__(self, module: cst.Module, ast_module: ast.Module, marks: _Marks,
                 plan_hints: dict[int, dict[str, Any]], prologue: list[str],
                 region_names: dict[int, str], path_chains: set[int]) -> None:
        self.module = module
        self.ast_module = ast_module
        self.marks = marks
        self.plan_hints = plan_hints
        self.prologue = prologue
        self.region_names = region_names
        self.path_chains = path_chains
        """ids of the ``if`` statements of chains with an arm that leads to a saved point."""
        self.default_indent = module.default_indent

    # -- text of inserted statements
    def assignment_lines(self, hint: int, indent: str) -> list[str]:
        info = self.plan_hints[hint]
        out: list[str] = []
        if info["save"]:
            out.append(_targets(info["save"], f"{ACTIVATION}.restore({hint})", indent))
        for name in info["maybe"]:
            out.append(f"if {ACTIVATION}.saved({name!r}): {name} = {ACTIVATION}.value({name!r})")
        return out

    def guarded(self, head: str, lines: list[str], indent: str) -> cst.BaseStatement:
        if len(lines) == 1 and "\n" not in lines[0] and \
                len(indent) + len(head) + len(lines[0]) + 1 <= _WIDTH:
            return _statement(f"{head} {lines[0]}\n")
        body = "".join(textwrap.indent(line, "    ") + "\n" for line in lines)
        stmt = _statement(f"{head}\n{body}")
        assert isinstance(stmt, cst.If)
        return stmt.with_changes(body=stmt.body.with_changes(indent=None))

    def restore_point(self, hint: int, indent: str) -> cst.BaseStatement:
        lines = self.assignment_lines(hint, indent + self.default_indent)
        return self.guarded(f"if {ACTIVATION}.restoring({hint}):",
                            lines or [f"{ACTIVATION}.restore({hint})"], indent)

    def hint_site(self, hint: int, indent: str) -> cst.BaseStatement:
        lines = self.assignment_lines(hint, indent + self.default_indent)
        if not lines:
            return _statement(f"{ACTIVATION}.checkpoint({hint})\n")
        return self.guarded(f"if {ACTIVATION}.checkpoint({hint}):", lines, indent)

    # -- blocks
    def module_code(self) -> str:
        body = list(self.module.body)
        groups = self.block(body, self.ast_module.body, "", top=True)
        at = _prologue_index(body)
        prologue = [_statement(line) for line in self.prologue]
        flat: list[cst.BaseStatement] = []
        for i, group in enumerate(groups):  # one group of statements per original statement
            if i == at:
                flat.extend(prologue)
            flat.extend(group)
        if at >= len(groups):
            flat.extend(prologue)
        return self.module.with_changes(body=flat).code

    def block(self, stmts: Sequence[cst.BaseStatement], ast_stmts: Sequence[ast.stmt],
              indent: str, *, top: bool = False, region: str | None = None) -> list[Any]:
        """Emit a block. At the module's top (``top``) a list of groups (for the prologue)."""
        groups: list[list[cst.BaseStatement]] = []
        pos = 0
        for node in stmts:
            if isinstance(node, cst.SimpleStatementLine):
                mine = list(ast_stmts[pos:pos + len(node.body)])
                pos += len(node.body)
            else:
                mine = [ast_stmts[pos]]
                pos += 1
            group: list[cst.BaseStatement] = []
            first_ast = mine[0]
            for before in self.marks.restore_before.get(id(first_ast), ()):
                group.append(self.restore_point(before, indent))
            settle = self.marks.branches.get(id(first_ast))
            if settle is not None:
                group.append(_statement(f"{ACTIVATION}.mark({settle})\n"))
            if group:
                # the statement's comments stay above the lines inserted before it
                group[0], node = _move_comments(node, group[0])
            group.append(self.statement(node, mine, indent))
            if settle is not None:
                group.append(_statement(f"{ACTIVATION}.settle({settle})\n"))
            for a in mine:
                chosen = self.marks.chosen.get(id(a))
                if chosen is not None:
                    group.append(self.hint_site(chosen, indent))
            groups.append(group)
        assert pos == len(ast_stmts), "libcst and ast disagree on the statements"
        if top:
            return groups
        flat = [s for g in groups for s in g]
        if region is not None:
            at = _prologue_index(list(stmts))
            flat_at = sum(len(g) for g in groups[:at])
            flat.insert(flat_at, _statement(f"{ACTIVATION} = {PROGRAM}.enter({region!r})\n"))
        return flat

    def suite(self, suite: cst.BaseSuite, ast_stmts: Sequence[ast.stmt], indent: str, *,
              region: str | None = None, first: cst.BaseSmallStatement | None = None
              ) -> cst.BaseSuite:
        if isinstance(suite, cst.IndentedBlock):
            inner = indent + (suite.indent if suite.indent is not None else self.default_indent)
            body = self.block(suite.body, ast_stmts, inner, region=region)
            if first is not None:
                body.insert(0, cst.SimpleStatementLine(body=[first]))
            if first is None and all(a is b for a, b in zip(body, suite.body, strict=False)) \
                    and len(body) == len(suite.body):
                return suite
            return suite.with_changes(body=body)
        assert isinstance(suite, cst.SimpleStatementSuite)
        if any(id(a) in self.marks.skip and not _never_guarded(a) for a in ast_stmts):
            # A one-line block that must be skipped: its statements move to their own lines.
            inner = indent + self.default_indent
            line = cst.SimpleStatementLine(body=suite.body)
            guarded = self.guard_line(line, inner)
            body_list: list[cst.BaseStatement] = [guarded]
            if first is not None:
                body_list.insert(0, cst.SimpleStatementLine(body=[first]))
            return cst.IndentedBlock(body=body_list, header=suite.trailing_whitespace)
        if first is not None:
            return suite.with_changes(body=[first, *suite.body])
        return suite

    def guard_line(self, line: cst.SimpleStatementLine, indent: str) -> cst.If:
        return cst.If(
            test=_expr(f"{ACTIVATION}.run"),
            body=cst.SimpleStatementSuite(
                body=line.body,
                leading_whitespace=cst.SimpleWhitespace(" \\\n" + indent),
                trailing_whitespace=line.trailing_whitespace),
            leading_lines=line.leading_lines,
            whitespace_before_test=cst.SimpleWhitespace(" "),
            whitespace_after_test=cst.SimpleWhitespace(""))

    def statement(self, node: cst.BaseStatement, mine: list[ast.stmt], indent: str
                  ) -> cst.BaseStatement:
        marks = self.marks
        if isinstance(node, cst.SimpleStatementLine):
            if any(id(a) in marks.skip for a in mine) and \
                    not all(_never_guarded(a) for a in mine):
                return self.guard_line(node, indent)
            return node
        a = mine[0]
        skipped = id(a) in marks.skip
        if isinstance(node, cst.FunctionDef):
            assert isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef)
            region = self.region_names.get(id(a))
            body = self.suite(node.body, a.body, indent, region=region)
            return node if body is node.body else node.with_changes(body=body)
        if isinstance(node, cst.ClassDef):
            assert isinstance(a, ast.ClassDef)
            body = self.suite(node.body, a.body, indent)
            return node if body is node.body else node.with_changes(body=body)
        if isinstance(node, cst.For):
            assert isinstance(a, ast.For | ast.AsyncFor)
            return self.for_(node, a, indent, skipped)
        if isinstance(node, cst.While):
            assert isinstance(a, ast.While)
            k = marks.site.get(("loop", id(a)))
            test = node.test
            if k is not None:
                test = _expr(f"__X__ if {ACTIVATION}.run else {ACTIVATION}.into({k})",
                             __X__=_paren(test))
            elif skipped:
                test = _expr(f"{ACTIVATION}.run and __X__", __X__=_paren(test))
            return node.with_changes(
                test=test, body=self.suite(node.body, a.body, indent),
                orelse=self.else_(node.orelse, a.orelse, indent))
        if isinstance(node, cst.If):
            assert isinstance(a, ast.If)
            return self.if_(node, a, indent, skipped)
        if isinstance(node, cst.With):
            assert isinstance(a, ast.With | ast.AsyncWith)
            return self.with_(node, a, indent, skipped)
        if isinstance(node, cst.Try | cst.TryStar):
            assert isinstance(a, ast.Try | ast.TryStar)
            handlers: list[cst.ExceptHandler | cst.ExceptStarHandler] = []
            originals: Sequence[cst.ExceptHandler | cst.ExceptStarHandler] = node.handlers
            for handler, ah in zip(originals, a.handlers, strict=True):
                handlers.append(handler.with_changes(body=self.suite(handler.body, ah.body,
                                                                     indent)))
            final = node.finalbody
            if final is not None:
                final = final.with_changes(body=self.suite(final.body, a.finalbody, indent))
            return node.with_changes(body=self.suite(node.body, a.body, indent),
                                     handlers=handlers,
                                     orelse=self.else_(node.orelse, a.orelse, indent),
                                     finalbody=final)
        if isinstance(node, cst.Match):
            assert isinstance(a, ast.Match)
            return self.match_(node, a, indent, skipped)
        raise AssertionError(f"unexpected statement {type(node).__name__}")

    def else_(self, orelse: cst.Else | None, stmts: Sequence[ast.stmt], indent: str
              ) -> cst.Else | None:
        if orelse is None:
            return None
        return orelse.with_changes(body=self.suite(orelse.body, stmts, indent))

    def for_(self, node: cst.For, a: ast.For | ast.AsyncFor, indent: str, skipped: bool
             ) -> cst.For:
        k = self.marks.site.get(("loop", id(a)))
        it = node.iter
        if k is not None:
            it = _expr(f"{ACTIVATION}.loop({k})(__X__)", __X__=_arg(it))
            if skipped:
                it = _expr(f"__X__ if {ACTIVATION}.enters({k}) else ()", __X__=it)
        elif skipped:
            it = _expr(f"__X__ if {ACTIVATION}.run else ()", __X__=_paren(it))
        return node.with_changes(iter=it, body=self.suite(node.body, a.body, indent),
                                 orelse=self.else_(node.orelse, a.orelse, indent))

    def if_(self, node: cst.If, a: ast.If, indent: str, skipped: bool) -> cst.If:
        marks = self.marks
        k = marks.site.get(("arm", id(a)))
        test = node.test
        if k is not None:
            test = _expr(f"__X__ if {ACTIVATION}.run else {ACTIVATION}.into({k})",
                         __X__=_paren(test))
        elif skipped or id(a) in self.path_chains:
            test = _expr(f"{ACTIVATION}.run and __X__", __X__=_paren(test))
        body = self.suite(node.body, a.body, indent)
        orelse: cst.If | cst.Else | None = node.orelse
        if isinstance(orelse, cst.If):
            assert len(a.orelse) == 1 and isinstance(a.orelse[0], ast.If)
            orelse = self.if_(orelse, a.orelse[0], indent, skipped)
        elif isinstance(orelse, cst.Else):
            orelse = orelse.with_changes(body=self.suite(orelse.body, a.orelse, indent))
            if skipped:
                ke = marks.site.get(("else", id(a)))
                guard = f"not {ACTIVATION}.run" if ke is None else \
                    f"not {ACTIVATION}.enters({ke})"
                skip_arm = _statement(f"if {guard}: pass\n")
                assert isinstance(skip_arm, cst.If)
                orelse = skip_arm.with_changes(orelse=orelse)
        return node.with_changes(test=test, body=body, orelse=orelse)

    def with_(self, node: cst.With, a: ast.With | ast.AsyncWith, indent: str, skipped: bool
              ) -> cst.With:
        k = self.marks.site.get(("with", id(a)))
        if not skipped:
            return node.with_changes(body=self.suite(node.body, a.body, indent))
        cond = f"{ACTIVATION}.run" if k is None else f"{ACTIVATION}.enters({k})"
        items = [item.with_changes(item=_expr(f"__X__ if {cond} else {ACTIVATION}.SKIP",
                                              __X__=_paren(item.item)))
                 for item in node.items]
        skip_call = cst.Expr(_expr(f"{ACTIVATION}.skip({k if k is not None else ''})"))
        return node.with_changes(items=items,
                                 body=self.suite(node.body, a.body, indent, first=skip_call))

    def match_(self, node: cst.Match, a: ast.Match, indent: str, skipped: bool) -> cst.Match:
        marks = self.marks
        k = marks.site.get(("match", id(a)))
        cases = []
        case_indent = indent + (node.indent if node.indent is not None else self.default_indent)
        for case, ac in zip(node.cases, a.cases, strict=True):
            body = self.suite(case.body, ac.body, case_indent)
            kc = marks.site.get(("case", id(ac)))
            guard = case.guard
            if k is not None:
                if kc is not None:
                    guard = (_expr(f"__X__ if {ACTIVATION}.run else {ACTIVATION}.into({kc})",
                                   __X__=_paren(guard)) if guard is not None else
                             _expr(f"{ACTIVATION}.run or {ACTIVATION}.into({kc})"))
                else:
                    guard = (_expr(f"{ACTIVATION}.run and __X__", __X__=_paren(guard))
                             if guard is not None else _expr(f"{ACTIVATION}.run"))
            changes: dict[str, Any] = {"body": body}
            if guard is not case.guard:
                changes.update(guard=guard, whitespace_before_if=cst.SimpleWhitespace(" "),
                               whitespace_after_if=cst.SimpleWhitespace(" "))
            cases.append(case.with_changes(**changes))
        subject = node.subject
        if k is not None:
            subject = _expr(f"{ACTIVATION}.subject({k}, __X__) if {ACTIVATION}.run else "
                            f"{ACTIVATION}.replay({k})", __X__=_arg(subject))
        elif skipped:
            subject = _expr(f"__X__ if {ACTIVATION}.run else None", __X__=_paren(subject))
            first = cst.MatchCase(
                pattern=cst.MatchAs(), guard=_expr(f"not {ACTIVATION}.run"),
                body=cst.SimpleStatementSuite(body=[cst.Pass()]),
                whitespace_before_if=cst.SimpleWhitespace(" "),
                whitespace_after_if=cst.SimpleWhitespace(" "))
            cases.insert(0, first)
        return node.with_changes(subject=subject, cases=cases)


def _prologue_index(body: Sequence[cst.BaseStatement]) -> int:
    """Where generated set-up goes: after a docstring and ``from __future__`` imports."""
    i = 0
    if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1 \
            and isinstance(body[0].body[0], cst.Expr) \
            and isinstance(body[0].body[0].value, cst.SimpleString | cst.ConcatenatedString):
        i = 1
    while i < len(body) and _is_future_import(body[i]):
        i += 1
    return i


def _is_future_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name)
        and s.module.value == "__future__" for s in stmt.body)


def _move_comments(source: cst.BaseStatement, target: cst.BaseStatement
                   ) -> tuple[cst.BaseStatement, cst.BaseStatement]:
    """Give ``source``'s leading comments and blank lines to ``target`` (inserted before it)."""
    assert isinstance(source, cst.SimpleStatementLine | cst.BaseCompoundStatement)
    assert isinstance(target, cst.SimpleStatementLine | cst.BaseCompoundStatement)
    if not source.leading_lines:
        return target, source
    return (target.with_changes(leading_lines=source.leading_lines),
            source.with_changes(leading_lines=()))


# --------------------------------------------------------------------------- entry point


def _issue(result: AnalysisSuccess, node: ast.AST, kind: str, message: str) -> SourceError:
    return SourceError(SourceIssue(path=result.path, line=getattr(node, "lineno", 1),
                                   column=getattr(node, "col_offset", 0) + 1, message=message,
                                   kind=kind))


def _check_reserved(result: AnalysisSuccess) -> None:
    for node in ast.walk(result.tree.module):
        name = None
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.alias):
            name = node.asname or node.name.split(".")[0]
        elif isinstance(node, ast.arg):
            name = node.arg
        if name in _RESERVED:
            raise _issue(result, node, "reserved-name",
                         f"`{name}` is a name generated code uses: rename it")


def already_transformed(source: str, path: str) -> SourceIssue | None:
    """The issue to report when ``source`` is itself a program ecrl-transform wrote."""
    if MARKER not in source:
        return None
    return SourceIssue(path=path, line=source[:source.index(MARKER)].count("\n") + 1, column=1,
                       kind="already-transformed",
                       message="this program was written by ecrl-transform and its generated "
                               "code was edited: transform the original program instead")


def generate(result: AnalysisSuccess, *, all_hints: bool = False,
             ckpt_dir: str | None = None) -> Generated:
    """Write the program of an analysis: checkpoints at the chosen hints, resume on start.

    Raises :class:`SourceError` for a program whose chosen checkpoints cannot be generated
    soundly (both the module's top level and a function checkpoint; a live value that is
    obviously unsaveable; a name the generated code needs).
    """
    tree = result.tree
    source = tree.source
    if not tree.hints:
        return Generated(code=source, changed=False,
                         note=f"{result.path} has no _checkpoint() hints: nothing to do")
    done = already_transformed(source, result.path)
    if done is not None:
        raise SourceError(done)
    chosen_ids = sorted(h.id for h in tree.hints) if all_hints else sorted(result.chosen)
    if not chosen_ids:
        return Generated(code=source, changed=False,
                         note=f"{result.path}: none of its {len(tree.hints)} hint(s) was chosen "
                              "as a checkpoint (see --explain; raise --overhead or use "
                              "--all-hints): nothing to do")
    _check_reserved(result)
    hints_by_id = {h.id: h for h in tree.hints}
    regions = {r.name: r for r in tree.regions}
    chosen_regions = sorted({hints_by_id[h].region for h in chosen_ids})
    if "<module>" in chosen_regions and len(chosen_regions) > 1:
        other = next(r for r in chosen_regions if r != "<module>")
        first = next(hints_by_id[h] for h in chosen_ids if hints_by_id[h].region == other)
        raise SourceError(SourceIssue(
            path=result.path, line=first.position.line, column=first.position.column,
            kind="nested-checkpoints",
            message=f"checkpoints both at the module's top level and in {other}(): a resumed "
                    "program can continue only one of them; keep the hints of one level (or "
                    "call the function from a function)"))
    functions = {name: node for name in chosen_regions
                 if isinstance(node := regions[name].node, ast.FunctionDef)}
    entry = check_single_entry(tree.module, functions)
    if entry is not None:
        raise SourceError(entry.issue(result.path))

    lines = source.splitlines()
    marks = _Marks(lines)
    slot_of, rules = _slot_rules(result, all_hints)
    module_values = _module_values(tree.module)
    call_reads = module_call_reads(tree.module)
    plan_hints: dict[int, dict[str, Any]] = {}
    plan_regions: dict[str, dict[str, Any]] = {}
    region_names: dict[int, str] = {}
    path_chains: set[int] = set()
    for name in chosen_regions:
        region = regions[name]
        node = region.node
        chosen = {id(hints_by_id[h].statement): h for h in chosen_ids
                  if hints_by_id[h].region == name}
        marks.chosen.update(chosen)
        marks.region(node.body, chosen)
        bindings = _bindings(node.body)
        info: dict[str, Any] = {}
        if isinstance(node, ast.FunctionDef):
            region_names[id(node)] = name
            declared = _declared_globals(node)
            local_names = set(bindings) | set(_params(node))
            reads = set(free_names(node)) | call_reads
            info = {"params": _params(node), "declared": declared,
                    "globals": sorted((reads & module_values) - set(declared) - local_names)}
        plan_regions[name] = info
        for hint in sorted(chosen.values()):
            chain = marks.chains[hint]
            for step in chain:
                if step.arm is not None and step.arm[0] in ("arm", "else"):
                    path_chains.add(id(step.block[step.index]))
                    for arm_node in _if_chain(step.block[step.index], lines):
                        path_chains.add(id(arm_node))
            plan_hints[hint] = _hint_plan(result, hint, chain, bindings, marks, slot_of)
    for name in chosen_regions:
        _settle_sites(regions[name].body, marks, slot_of)
    source_hash = hashlib.sha256(source.encode("utf-8")).hexdigest()
    plan = Plan(
        original=Path(result.path).name,
        ckpt_dir=ckpt_dir,
        regions={k: RegionSpec.from_literal(v) for k, v in plan_regions.items()},
        hints={k: HintSpec.from_literal(v) for k, v in plan_hints.items()},
        slots={s: SlotRule.from_literal(rules[s])
               for s in sorted({slot_of[h] for h in plan_hints})},
        sites={k: frozenset(v) for k, v in marks.sites.items()},
        ranges=frozenset(marks.ranges),
        settle=marks.settle,
    )
    # The fingerprint covers the source and what the runtime does with it, not the file's name.
    fingerprinted = {k: v for k, v in plan.to_literal().items() if k not in ("source", "original")}
    plan = replace(plan, source=hashlib.sha256(
        (source_hash + pprint.pformat(fingerprinted, sort_dicts=True)).encode()).hexdigest())
    plan_literal = plan.to_literal()
    literal = textwrap.indent(pprint.pformat(plan_literal, width=_WIDTH - 4, sort_dicts=False,
                                             compact=True), "    ")
    prologue = [f"{MARKER}  # ecrl-transform: resumable checkpoints (docs/transform.md)\n",
                f"{PROGRAM} = {RUNTIME}.Program(\n    __file__,\n{literal})\n"]
    if "<module>" in chosen_regions:
        prologue.append(f"{ACTIVATION} = {PROGRAM}.enter('<module>')\n")

    module = cst.parse_module(source)
    code = _Emitter(module, tree.module, marks, plan_hints, prologue, region_names,
                    path_chains).module_code()
    return Generated(code=code, changed=True, checkpoints=tuple(chosen_ids),
                     plan=plan_literal)


def _settle_sites(seq: Seq, marks: _Marks, slot_of: dict[int, int]) -> None:
    """Number the branches whose arms hold chosen slots, with each slot's model positions."""
    for item in seq.items:
        if isinstance(item, Loop):
            _settle_sites(item.body, marks, slot_of)
        elif isinstance(item, Branch):
            positions: dict[int, int] = {}
            for slot, count in slot_positions(item).items():
                ids = {slot_of[h] for h in slot if h in slot_of}
                for sid in ids:
                    positions[sid] = positions.get(sid, 0) + count
            if positions:
                k = len(marks.site) + len(marks.settle) + 1
                marks.branches[id(item.node)] = k
                marks.settle[k] = dict(sorted(positions.items()))
            for arm in item.arms:
                _settle_sites(arm, marks, slot_of)


def _if_chain(node: ast.stmt, lines: Sequence[str]) -> list[ast.If]:
    out: list[ast.If] = []
    cur: ast.stmt | None = node
    while isinstance(cur, ast.If):
        out.append(cur)
        nxt = cur.orelse
        cur = nxt[0] if len(nxt) == 1 and isinstance(nxt[0], ast.If) and is_elif(lines, nxt[0]) \
            else None
    return out


def _hint_plan(result: AnalysisSuccess, hint: int, chain: list[_Step],
               bindings: dict[str, list[ast.stmt]], marks: _Marks,
               slot_of: dict[int, int]) -> dict[str, Any]:
    facts = result.live[hint]
    maybe = set(facts.maybe_unbound)
    save = set(facts.save)
    # Enclosing ``with … as x`` targets are bound afresh when the walk re-enters the block.
    for step in chain:
        stmt = step.block[step.index]
        if step.arm is not None and step.arm[0] == "with":
            assert isinstance(stmt, ast.With)
            for item in stmt.items:
                names: set[str] = set()
                if item.optional_vars is not None:
                    target_names(item.optional_vars, names, set())
                for n in names:
                    if len(bindings.get(n, ())) == 1:
                        save.discard(n)
                        maybe.discard(n)
    # Definitions re-created only if the walk runs all of them again; else saved as values.
    for name in facts.rebind:
        stmts = bindings.get(name, [])
        if not stmts or not all(marks.walk_executed(hint, s) for s in stmts):
            save.add(name)
            maybe.add(name)
    line = result.tree.hints[hint - 1].position.line
    for name in sorted(save):
        stmts = bindings.get(name, [])
        kinds = [_unsaveable_kind(s) for s in stmts]
        if stmts and all(kinds):
            raise _issue(result, stmts[0], "unsaveable",
                         f"`{name}` holds {kinds[0]} and is live at the checkpoint on line "
                         f"{line}, which cannot save it: create it after the checkpoint, or "
                         "move the hint to where it is not live")
    return {
        "region": result.tree.hints[hint - 1].region,
        "line": line,
        "slot": slot_of[hint],
        "save": sorted(save - maybe),
        "maybe": sorted(maybe),
        "loops": marks.hint_loops[hint],
        "subjects": marks.hint_subjects[hint],
    }
