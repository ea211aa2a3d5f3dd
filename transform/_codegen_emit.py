"""Writing the generated program: the original's concrete syntax tree (libcst) with the marked
statements guarded, the headers on the way to a saved point steered, and the generated lines
inserted; every original line is kept or, for a steered header, changed only inside its
expression.

The task tree is Python's ``ast``; libcst is used only here, once: its statements are paired
with the ``ast`` statements by walking both trees in step, and edits are applied by identity.
"""

from __future__ import annotations

import ast
import difflib
import pprint
import textwrap
from collections.abc import Sequence
from typing import Any

import libcst as cst

from transform._codegen_marks import never_guarded
from transform._codegen_model import ACTIVATION, MARKER, PROGRAM, WIDTH, Marks

__all__ = ["Emitter", "LINES_PLACEHOLDER", "line_map", "with_line_map"]


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
    if len(indent) + len(one) <= WIDTH or len(names) == 1:
        return one
    body = textwrap.fill(", ".join(names), width=WIDTH - len(indent) - 1,
                         subsequent_indent=" ", break_long_words=False)
    return f"({body}) = {first}"


class Emitter:
    def __init__(self, module: cst.Module, ast_module: ast.Module, marks: Marks,
                 plan_hints: dict[int, dict[str, Any]], prologue: list[str],
                 region_names: dict[int, str], path_chains: set[int],
                 hosted_names: dict[int, str] | None = None) -> None:
        self.module = module
        self.ast_module = ast_module
        self.marks = marks
        self.plan_hints = plan_hints
        self.prologue = prologue
        self.region_names = region_names
        self.path_chains = path_chains
        self.hosted_names = hosted_names or {}
        """id(function node) → region, for hosted functions: their body uses its walk."""
        """ids of the ``if`` statements of chains with an arm that leads to a saved point."""
        self.default_indent = module.default_indent

    # -- text of inserted statements
    def assignment_lines(self, hint: int, indent: str, level: int | None = None) -> list[str]:
        """Bind the saved values of the hint's own function, or (``level``) of a function
        above it on the call stack."""
        info = self.plan_hints[hint] if level is None else self.plan_hints[hint]["outer"][level]
        at = "" if level is None else f", {level}"
        out: list[str] = []
        if info["save"]:
            out.append(_targets(info["save"], f"{ACTIVATION}.restore({hint}{at})", indent))
        for name in info["maybe"]:
            out.append(f"if {ACTIVATION}.saved({name!r}{at}): "
                       f"{name} = {ACTIVATION}.value({name!r}{at})")
        return out

    def guarded(self, head: str, lines: list[str], indent: str) -> cst.BaseStatement:
        if len(lines) == 1 and "\n" not in lines[0] and \
                len(indent) + len(head) + len(lines[0]) + 1 <= WIDTH:
            return _statement(f"{head} {lines[0]}\n")
        body = "".join(textwrap.indent(line, "    ") + "\n" for line in lines)
        stmt = _statement(f"{head}\n{body}")
        assert isinstance(stmt, cst.If)
        return stmt.with_changes(body=stmt.body.with_changes(indent=None))

    def restore_point(self, hint: int, level: int | None, indent: str) -> cst.BaseStatement:
        lines = self.assignment_lines(hint, indent + self.default_indent, level)
        at = "" if level is None else f", {level}"
        return self.guarded(f"if {ACTIVATION}.restoring({hint}):",
                            lines or [f"{ACTIVATION}.restore({hint}{at})"], indent)

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
              indent: str, *, top: bool = False, region: str | None = None,
              within: str | None = None) -> list[Any]:
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
            for before, level in self.marks.restore_before.get(id(first_ast), ()):
                group.append(self.restore_point(before, level, indent))
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
        if region is not None or within is not None:
            at = _prologue_index(list(stmts))
            flat_at = sum(len(g) for g in groups[:at])
            call = f"enter({region!r})" if region is not None else f"within({within!r})"
            flat.insert(flat_at, _statement(f"{ACTIVATION} = {PROGRAM}.{call}\n"))
        return flat

    def suite(self, suite: cst.BaseSuite, ast_stmts: Sequence[ast.stmt], indent: str, *,
              region: str | None = None, first: cst.BaseSmallStatement | None = None,
              within: str | None = None) -> cst.BaseSuite:
        if isinstance(suite, cst.IndentedBlock):
            inner = indent + (suite.indent if suite.indent is not None else self.default_indent)
            body = self.block(suite.body, ast_stmts, inner, region=region, within=within)
            if first is not None:
                body.insert(0, cst.SimpleStatementLine(body=[first]))
            if first is None and all(a is b for a, b in zip(body, suite.body, strict=False)) \
                    and len(body) == len(suite.body):
                return suite
            return suite.with_changes(body=body)
        assert isinstance(suite, cst.SimpleStatementSuite)
        if any(id(a) in self.marks.skip and not never_guarded(a) for a in ast_stmts):
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

    def guard_line(self, line: cst.SimpleStatementLine, indent: str, test: str = "run"
                   ) -> cst.If:
        return cst.If(
            test=_expr(f"{ACTIVATION}.{test}"),
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
            call = marks.site.get(("call", id(mine[0])))
            if call is not None:
                # A call that leads to saved points runs while walking into one of them.
                return self.guard_line(node, indent, f"enters({call})")
            if any(id(a) in marks.skip for a in mine) and \
                    not all(never_guarded(a) for a in mine):
                return self.guard_line(node, indent)
            return node
        a = mine[0]
        skipped = id(a) in marks.skip
        if isinstance(node, cst.FunctionDef):
            assert isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef)
            region = self.region_names.get(id(a))
            body = self.suite(node.body, a.body, indent, region=region,
                              within=self.hosted_names.get(id(a)))
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



# --------------------------------------------------------------------------- the line map

LINES_PLACEHOLDER = "__ecrl_lines__"
"""Stands for the line map in the emitted program until the map of the final text is known."""


def line_map(generated: str, original: str) -> dict[str, Any]:
    """Where each line of a generated program comes from in the original, as the literal the
    program hands the runtime (``Program(..., lines=...)``), so that a traceback is shown in the
    original's lines without the runtime parsing anything.

    ``runs``: ``[generated line, original line, count]`` for each stretch of consecutive lines
    that map to consecutive original lines (1-based; a line the generator added is in none);
    ``text``: the original's text (stripped) of the lines whose generated line differs (the
    steered headers), by original line number.
    """
    ours = generated.splitlines()
    theirs = original.splitlines()
    mapping = [0] * (len(ours) + 1)
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("equal", "replace"):
            # "replace": a steered header (the user's line with generated code inside it).
            for k in range(i2 - i1):
                mapping[i1 + k + 1] = min(j1 + k, j2 - 1) + 1
    runs: list[list[int]] = []
    text: dict[int, str] = {}
    for line in range(1, len(mapping)):
        source_line = mapping[line]
        if source_line == 0:
            continue
        if runs and runs[-1][0] + runs[-1][2] == line and runs[-1][1] + runs[-1][2] == source_line:
            runs[-1][2] += 1
        else:
            runs.append([line, source_line, 1])
        if ours[line - 1].strip() != theirs[source_line - 1].strip():
            text[source_line] = theirs[source_line - 1].strip()
    return {"runs": runs, "text": text}


def with_line_map(code: str, original: str) -> str:
    """``code`` with its own line map in place of :data:`LINES_PLACEHOLDER`.

    The map's literal shifts the lines after it, and their numbers can lengthen the literal:
    formatted again until it describes the text it is part of. The number of lines it takes only
    grows with the shift, so this ends (after two or three rounds).
    """
    at = code.index(LINES_PLACEHOLDER, code.index(MARKER))
    head, tail = code[:at], code[at + len(LINES_PLACEHOLDER):]
    literal = "{}"
    for _ in range(32):
        whole = head + literal + tail
        # Continuation lines line up under the literal's start, after ``    lines=``.
        formatted = textwrap.indent(
            pprint.pformat(line_map(whole, original), width=WIDTH - 10, sort_dicts=False,
                           compact=True), " " * 10)[10:]
        if formatted == literal:
            return whole
        literal = formatted
    raise AssertionError("the line map did not settle")
