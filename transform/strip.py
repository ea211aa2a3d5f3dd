"""Undo :mod:`transform.codegen`: the original program back from a transformed one, exactly.

Every construct the generator writes has one shape, recognised here by the generated names
(``_ecrl``, ``_ECRL``, ``_ecrl_runtime``): inserted statements are dropped (their leading comments
go back to the statement they were taken from), guards are unwrapped into the original line, and
steered or skipped headers give back the expression they wrap, with the one pair of parentheses
the generator added. ``strip(generate(p)) == p`` for every program the generator accepts (tested
on the fixtures and on generated programs), so transforming again is idempotent and ``--check``
can compare a transformed file with its original's transformation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import libcst as cst

from transform._codegen_model import ACTIVATION, PROGRAM, RUNTIME

__all__ = ["strip"]


def strip(code: str) -> str:
    """The program ``code`` was generated from."""
    return cst.parse_module(code).visit(_Strip()).code


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _is_attr(node: cst.CSTNode | None, attr: str) -> bool:
    return isinstance(node, cst.Attribute) and _is_name(node.value, ACTIVATION) \
        and node.attr.value == attr


def _is_call(node: cst.CSTNode | None, attr: str) -> bool:
    return isinstance(node, cst.Call) and _is_attr(node.func, attr)


def _mentions_generated(node: cst.CSTNode) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            nonlocal found
            if n.value in (ACTIVATION, PROGRAM, RUNTIME):
                found = True

    node.visit(Finder())
    return found


def _unparen(node: cst.BaseExpression) -> cst.BaseExpression:
    """Remove the one pair of parentheses the generator added."""
    if not node.lpar:
        return node
    return node.with_changes(lpar=node.lpar[1:], rpar=node.rpar[:-1])


def _unarg(node: cst.BaseExpression) -> cst.BaseExpression:
    """A wrapped call's only argument: a tuple got one more pair of parentheses."""
    return _unparen(node) if isinstance(node, cst.Tuple) else node


def _loop_argument(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """``_ecrl.loop(K)(X)`` → X."""
    if isinstance(node, cst.Call) and _is_call(node.func, "loop") and len(node.args) == 1:
        return _unarg(node.args[0].value)
    return None


def _header(node: cst.BaseExpression) -> cst.BaseExpression:
    """The original expression of a steered or skipped header (or ``node`` if not one)."""
    loop = _loop_argument(node)
    if loop is not None:
        return loop
    if isinstance(node, cst.IfExp):
        test, body, orelse = node.test, node.body, node.orelse
        if _is_attr(test, "run"):
            if isinstance(orelse, cst.Tuple) and not orelse.elements:
                return _unparen(body)  # for … in (it) if _ecrl.run else ()
            if _is_call(orelse, "into") or _is_attr(orelse, "SKIP") or \
                    (isinstance(orelse, cst.Name) and orelse.value == "None"):
                return _unparen(body)
            if _is_call(orelse, "replay") and _is_call(body, "subject"):
                assert isinstance(body, cst.Call)
                return _unarg(body.args[1].value)
        if _is_call(test, "enters"):
            if isinstance(orelse, cst.Tuple) and not orelse.elements:
                inner = _loop_argument(body)
                if inner is not None:
                    return inner
            if _is_attr(orelse, "SKIP"):
                return _unparen(body)
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.And) \
            and _is_attr(node.left, "run"):
        return _unparen(node.right)
    return node


def _guard(node: cst.BaseExpression | None) -> tuple[bool, cst.BaseExpression | None]:
    """(was it generated, the original guard) of a ``case`` guard."""
    if node is None:
        return False, None
    if _is_attr(node, "run"):
        return True, None
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or) \
            and _is_attr(node.left, "run") and _is_call(node.right, "into"):
        return True, None
    original = _header(node)
    return original is not node, original


def _generated_statement(stmt: cst.BaseStatement) -> bool:
    """A statement the generator inserted (and the original never had)."""
    if isinstance(stmt, cst.If):
        return _is_call(stmt.test, "restoring") or _is_call(stmt.test, "checkpoint")
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Import):
            return any(a.asname is not None and _is_name(a.asname.name, RUNTIME)
                       for a in small.names)
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return _is_name(small.targets[0].target, PROGRAM) or (
                _is_name(small.targets[0].target, ACTIVATION)
                and isinstance(small.value, cst.Call)
                and isinstance(small.value.func, cst.Attribute)
                and _is_name(small.value.func.value, PROGRAM))
        if isinstance(small, cst.Expr):
            return any(_is_call(small.value, name)
                       for name in ("checkpoint", "mark", "settle", "skip"))
    return False


def _unguard(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """``if _ecrl.run: \\`` (or, for a call that leads to checkpoints, ``if _ecrl.enters(K):
    \\``) + the original line → the original line."""
    if isinstance(stmt, cst.If) and (_is_attr(stmt.test, "run") or _is_call(stmt.test, "enters")) \
            and stmt.orelse is None \
            and isinstance(stmt.body, cst.SimpleStatementSuite) \
            and stmt.body.leading_whitespace.value.startswith(" \\"):
        return cst.SimpleStatementLine(body=stmt.body.body, leading_lines=stmt.leading_lines,
                                       trailing_whitespace=stmt.body.trailing_whitespace)
    return stmt


def _block(body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    out: list[cst.BaseStatement] = []
    carried: Sequence[cst.EmptyLine] = ()
    for stmt in body:
        if _generated_statement(stmt):
            lines = getattr(stmt, "leading_lines", ())
            carried = [*carried, *lines]
            continue
        stmt = _unguard(stmt)
        if carried:
            assert isinstance(stmt, cst.SimpleStatementLine | cst.BaseCompoundStatement)
            stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
            carried = ()
        out.append(stmt)
    return out


class _Strip(cst.CSTTransformer):
    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=_block(updated_node.body))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=_block(updated_node.body))

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                   updated_node: cst.SimpleStatementSuite
                                   ) -> cst.SimpleStatementSuite:
        body = [s for s in updated_node.body
                if not (isinstance(s, cst.Expr) and _is_call(s.value, "skip"))]
        return updated_node.with_changes(body=body)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return updated_node.with_changes(iter=_header(updated_node.iter))

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return updated_node.with_changes(test=_header(updated_node.test))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        orelse = updated_node.orelse
        # ``elif not _ecrl.run: pass`` (or ``not _ecrl.enters(K)``) guards a skipped ``else``
        if isinstance(orelse, cst.If) and isinstance(orelse.test, cst.UnaryOperation) \
                and isinstance(orelse.test.operator, cst.Not) \
                and (_is_attr(orelse.test.expression, "run")
                     or _is_call(orelse.test.expression, "enters")) \
                and isinstance(orelse.orelse, cst.Else):
            orelse = orelse.orelse
        return updated_node.with_changes(test=_header(updated_node.test), orelse=orelse)

    def leave_WithItem(self, original_node: cst.WithItem, updated_node: cst.WithItem
                       ) -> cst.WithItem:
        return updated_node.with_changes(item=_header(updated_node.item))

    def leave_Match(self, original_node: cst.Match, updated_node: cst.Match) -> cst.Match:
        cases = [c for c in updated_node.cases
                 if not (isinstance(c.pattern, cst.MatchAs) and c.pattern.pattern is None
                         and c.pattern.name is None and c.guard is not None
                         and isinstance(c.guard, cst.UnaryOperation)
                         and _is_attr(c.guard.expression, "run"))]
        return updated_node.with_changes(subject=_header(updated_node.subject), cases=cases)

    def leave_MatchCase(self, original_node: cst.MatchCase, updated_node: cst.MatchCase
                        ) -> cst.MatchCase:
        generated, guard = _guard(updated_node.guard)
        if not generated:
            return updated_node
        changes: dict[str, Any] = {"guard": guard}
        if guard is None:
            changes.update(whitespace_before_if=cst.SimpleWhitespace(""),
                           whitespace_after_if=cst.SimpleWhitespace(""))
        return updated_node.with_changes(**changes)


def looks_generated(code: str) -> bool:
    """Does any generated name remain after stripping (then the strip was not exact)?"""
    return _mentions_generated(cst.parse_module(code))
