"""Building the task tree (:mod:`transform.tasks`) from a program's source.

The tree is built on Python's own :mod:`ast` (the C parser: an order of magnitude faster than a
concrete syntax tree, and its ``lineno``/``col_offset`` are exact). Code generation maps
statements to libcst nodes by their position only when it writes a program, so ``--explain``
never pays for libcst. The whole file is scanned once (:class:`_Scan`) for what the rules need —
which statements hold hints, hints in bad places, functions that yield or call ``exec`` — so no
subtree is walked twice. Hints in ``except``/``else``/``finally`` clauses and loop ``else``
clauses are rejected.

Costs: ``_cost: X`` as a statement of a code segment declares that segment's time; otherwise a
static estimate (:data:`~transform.tasks.STATEMENT_SECONDS` per simple statement, times the
iterations of enclosing hint-free loops, the dearest arm of a branch) stands in, and a profile can
replace both (see :mod:`transform.profile`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from transform._hosting import find_hostings, hosted_under
from transform.errors import SourceError, SourceIssue
from transform.tasks import (
    CHECKHINT_NAME,
    HINT_NAME,
    PARAMS_NAME,
    STATEMENT_SECONDS,
    Branch,
    Code,
    Hint,
    HintSite,
    Item,
    Loop,
    Position,
    Region,
    RegionParams,
    Seq,
    TaskTree,
)

__all__ = [
    "LITERAL_LIMIT",
    "MAX_ITERATIONS",
    "build_task_tree",
    "is_hint_statement",
    "is_elif",
    "parse_source",
    "param_problem",
]

_PARAM_KEYS = ("overhead", "ckpt_cost", "failure_rate", "mtbf")
_CHECKHINT_KEYS = {"allowance": "overhead", "checkpoint_cost": "ckpt_cost",
                   "failure_prob": "failure_rate"}
_HINT_NAME_KEY = "checkpoint_fn_name"
"""CheckHint's name for the hint function of the decorated function (``_checkpoint`` unless
given)."""
_UNSOUND_CALLS = {
    "exec": "exec() can bind and read any name",
    "eval": "eval() can read any name",
    "locals": "locals() exposes every name",
    "vars": "vars() exposes every name",
}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Import,
           ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Return, ast.Raise, ast.Pass, ast.Break,
           ast.Continue, ast.Assert)


# --------------------------------------------------------------------------- helpers


def _is_hint_call(node: ast.AST, names: frozenset[str] = frozenset((HINT_NAME,))) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in names
    return isinstance(func, ast.Attribute) and func.attr in names


def is_hint_statement(stmt: ast.AST) -> bool:
    """Is ``stmt`` the statement ``_checkpoint()`` (or ``mod._checkpoint()``)?"""
    return isinstance(stmt, ast.Expr) and _is_hint_call(stmt.value)


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


LITERAL_LIMIT = 10**100
"""Largest magnitude a constant expression may reach at any step of its evaluation: bounds the
work (``10**10**10`` is refused, not computed) and keeps every value a finite float."""
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod, ast.Pow: operator.pow}


def _literal_number(expr: ast.expr) -> int | float | None:
    """The value of a bounded constant arithmetic expression (``10**9``, ``3_600 * 24``), else
    None: not a number, not constant, or beyond :data:`LITERAL_LIMIT` (never evaluated there)."""
    try:
        return _bounded(expr)
    except (_Unbounded, ArithmeticError, ValueError):
        return None


class _Unbounded(Exception):
    """An operand or result outside the bounded range (or not a literal number at all)."""


def _checked(value: int | float) -> int | float:
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > LITERAL_LIMIT:
        raise _Unbounded
    return value


def _bounded(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) is not int and type(value) is not float:
            raise _Unbounded
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _bounded(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _bounded(node.left), _bounded(node.right)
        if isinstance(node.op, ast.Pow) and abs(left) > 1 and right > 0 and \
                right * math.log10(abs(left)) > math.log10(LITERAL_LIMIT):
            raise _Unbounded  # refused before it is computed: 10**10**10 would run for hours
        if isinstance(node.op, ast.Pow) and left == 0 and right < 0:
            raise ZeroDivisionError
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, complex):
            raise _Unbounded
        return _checked(value)
    raise _Unbounded


MAX_ITERATIONS = 10**18
"""Largest ``_iterations`` accepted (a loop the schedule can still count exactly)."""
_WHERE = {"_iterations": "as the first statement of the loop body",
          "_cost": "in the stretch of code between hints that it times"}


def _assignment_message(name: str) -> str:
    return (f"`{name} = N` is an assignment: write it as an annotation, `{name}: N` "
            f"(CheckHint's syntax), {_WHERE[name]}")


def _range_count(*args: int) -> int:
    """``len(range(*args))`` without its C-size limit (``range(10**30)`` has a length too);
    a zero step, which range() rejects, counts none."""
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if step == 0:
        return 0
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


def _misspelt_annotation(stmt: ast.stmt) -> str | None:
    """``_iterations = N`` (or ``_iterations: int = N``) with a number: meant as the hint
    annotation (a variable of that name computed by the program is left alone)."""
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign) and _literal_number(stmt.value) is not None:
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None \
            and _literal_number(stmt.value) is not None:
        targets = [stmt.target]
    for t in targets:
        if isinstance(t, ast.Name) and t.id in ("_iterations", "_cost"):
            return t.id
    return None


def _annotation_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
            and stmt.value is None and stmt.target.id in ("_iterations", "_cost"):
        return stmt.target.id
    return None


class _Lines:
    """Byte offsets (``ast``) to 1-based character columns (editors), line by line."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()

    def column(self, line: int, byte_offset: int) -> int:
        if 1 <= line <= len(self.lines):
            text = self.lines[line - 1]
            if not text.isascii():
                return len(text.encode("utf-8")[:byte_offset].decode("utf-8", "replace")) + 1
        return byte_offset + 1

    def position(self, node: ast.AST) -> Position:
        line: int = getattr(node, "lineno", 1)
        end_line: int = getattr(node, "end_lineno", None) or line
        end_col: int = getattr(node, "end_col_offset", None) or 0
        return Position(line=line, column=self.column(line, getattr(node, "col_offset", 0)),
                        end_line=end_line, end_column=self.column(end_line, end_col))


# --------------------------------------------------------------------------- the one scan


@dataclass(slots=True)
class _ScopeFacts:
    yields: ast.AST | None = None
    unsound: tuple[ast.AST, str] | None = None


class _Scan:
    """One pass over the whole file: every fact the task-tree rules ask about.

    ``holding``: ids of statements that hold a hint statement of their own region (not through a
    nested def, class or lambda). ``facts``: per function (id) and for the module (key 0), the
    first ``yield`` and the first ``exec``/``eval``/``locals``/``vars`` call of its own body.
    ``problem``: the first hint in a place no checkpoint can be (comprehension, lambda,
    expression).
    """

    def __init__(self) -> None:
        self.holding: set[int] = set()
        self.hint_statements: set[int] = set()
        self.facts: dict[int, _ScopeFacts] = {0: _ScopeFacts()}
        self.problem: tuple[ast.AST, str, str] | None = None
        self.names = frozenset((HINT_NAME,))
        """Names that call a hint here: ``_checkpoint``, and CheckHint's ``checkpoint_fn_name``
        of the enclosing decorated function (or of a module-level call)."""

    def run(self, module: ast.Module) -> None:
        self.names = self.hint_names(self.names, [s.value for s in module.body
                                                  if isinstance(s, ast.Expr)])
        self.block(module.body, [], 0, inside="")

    def block(self, body: Sequence[ast.stmt], stack: list[ast.stmt], scope: int,
              inside: str) -> None:
        for stmt in body:
            self.statement(stmt, stack, scope, inside)

    def statement(self, stmt: ast.stmt, stack: list[ast.stmt], scope: int, inside: str) -> None:
        if isinstance(stmt, ast.Expr) and _is_hint_call(stmt.value, self.names):
            if inside == "class" and self.problem is None:
                self.problem = (stmt, "hint-in-class",
                                "_checkpoint() directly in a class body cannot be a checkpoint: "
                                "put it in a method or at module level")
            self.hint_statements.add(id(stmt))
            self.holding.update(id(s) for s in stack)
            assert isinstance(stmt.value, ast.Call)
            for a in (*stmt.value.args, *(k.value for k in stmt.value.keywords)):
                self.expr(a, scope, "")
            return
        if isinstance(stmt, ast.ClassDef):
            for e in (*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)):
                self.expr(e, scope, inside)
            # A class body runs once, at definition: its own scope, never a region.
            self.facts.setdefault(id(stmt), _ScopeFacts())
            self.block(stmt.body, [], id(stmt), inside="class")
            return
        if isinstance(stmt, _FUNCTIONS):
            for e in (*stmt.decorator_list, *_defaults(stmt.args)):
                self.expr(e, scope, inside)
            self.facts[id(stmt)] = _ScopeFacts()
            outer = self.names
            self.names = self.hint_names(outer, stmt.decorator_list)
            self.block(stmt.body, [], id(stmt), inside="")
            self.names = outer
            return
        stack.append(stmt)
        for _name, value in ast.iter_fields(stmt):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.block(value, stack, scope, inside)
                    continue
                for v in value:
                    if isinstance(v, ast.AST):
                        self.child(v, stack, scope, inside)
            elif isinstance(value, ast.AST):
                self.child(value, stack, scope, inside)
        stack.pop()

    def child(self, node: ast.AST, stack: list[ast.stmt], scope: int, inside: str) -> None:
        """A non-statement child of a statement: handlers, cases, with items, expressions."""
        if isinstance(node, ast.excepthandler | ast.match_case):
            for _name, value in ast.iter_fields(node):
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    self.block(value, stack, scope, inside)
                elif isinstance(value, ast.AST):
                    self.expr(value, scope, inside)
            return
        self.expr(node, scope, inside)

    def expr(self, node: ast.AST, scope: int, inside: str) -> None:
        todo: list[tuple[ast.AST, str]] = [(node, inside)]
        while todo:
            cur, where = todo.pop()
            if isinstance(cur, ast.Call):
                if _is_hint_call(cur, self.names):
                    self.bad_hint(cur, where)
                elif isinstance(cur.func, ast.Name) and cur.func.id in _UNSOUND_CALLS \
                        and where != "lambda":
                    facts = self.facts.setdefault(scope, _ScopeFacts())
                    if facts.unsound is None and not (cur.func.id == "vars" and cur.args):
                        facts.unsound = (cur, _UNSOUND_CALLS[cur.func.id])
            elif isinstance(cur, ast.Yield | ast.YieldFrom):
                if where != "lambda":
                    facts = self.facts.setdefault(scope, _ScopeFacts())
                    if facts.yields is None:
                        facts.yields = cur
            elif isinstance(cur, ast.Lambda):
                where = "lambda"
            elif isinstance(cur, _COMPREHENSIONS) and where != "lambda":
                where = "comprehension"
            todo.extend((c, where) for c in ast.iter_child_nodes(cur))

    def hint_names(self, names: frozenset[str], exprs: Sequence[ast.expr]) -> frozenset[str]:
        """``names`` plus CheckHint's ``checkpoint_fn_name="…"`` of any parameter call among
        ``exprs``."""
        for expr in exprs:
            call = _params_call(expr)
            for kw in call.keywords if call is not None else ():
                if kw.arg != _HINT_NAME_KEY:
                    continue
                if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str) \
                        and kw.value.value.isidentifier():
                    names = names | {kw.value.value}
                elif self.problem is None:
                    self.problem = (kw.value, "bad-params",
                                    f"{_HINT_NAME_KEY}= needs the hint function's name as a "
                                    "string literal (like \"_checkpoint\")")
        return names

    def bad_hint(self, call: ast.Call, where: str) -> None:
        if self.problem is not None:
            return
        if where == "comprehension":
            self.problem = (call, "hint-in-comprehension",
                            "_checkpoint() inside a comprehension cannot be a checkpoint: write "
                            "the loop as a for statement")
        elif where == "lambda":
            self.problem = (call, "hint-in-lambda",
                            "_checkpoint() inside a lambda cannot be a checkpoint: use a def")
        else:
            self.problem = (call, "hint-in-expression",
                            "_checkpoint() must be a statement of its own, not part of an "
                            "expression")


# --------------------------------------------------------------------------- builder


class _Builder:
    def __init__(self, path: str, source: str, scan: _Scan) -> None:
        self.path = path
        self.lines = _Lines(source)
        self.scan = scan
        self.hints: list[Hint] = []
        self.warnings: list[SourceIssue] = []
        self._hint_ids: dict[int, int] = {}
        self._declared_at: Position | None = None
        self.host_calls: dict[int, ast.FunctionDef] = {}
        """Call statement → the hosted function it calls (its body is inlined there)."""

    # -- positions and issues
    def pos(self, node: ast.AST) -> Position:
        return self.lines.position(node)

    def issue(self, node: ast.AST, kind: str, message: str) -> SourceIssue:
        p = self.pos(node)
        return SourceIssue(path=self.path, line=p.line, column=p.column, message=message,
                           kind=kind)

    def fail(self, node: ast.AST, kind: str, message: str) -> SourceError:
        return SourceError(self.issue(node, kind, message))

    def warn(self, node: ast.AST, kind: str, message: str) -> None:
        self.warnings.append(self.issue(node, kind, message))

    def holds_hint(self, stmt: ast.stmt) -> bool:
        return id(stmt) in self.scan.holding

    # -- static cost estimates
    def iterations(self, loop: ast.For | ast.While, *, required: bool) -> tuple[int, str]:
        first = loop.body[0] if loop.body else None
        if first is not None and _annotation_name(first) == "_iterations":
            assert isinstance(first, ast.AnnAssign)
            value = _literal_number(first.annotation)
            if value is None or value < 0 or value != int(value) or value > MAX_ITERATIONS:
                raise self.fail(first.annotation, "bad-iterations",
                                "_iterations needs a non-negative integer literal or a bounded "
                                "constant expression (like 1000 or 10**6, at most 10**18)")
            return int(value), "annotation"
        if first is not None and _misspelt_annotation(first) is not None:
            raise self.fail(first, "iterations-assignment", _assignment_message(
                _misspelt_annotation(first) or ""))
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) \
                and isinstance(loop.iter.func, ast.Name) and loop.iter.func.id == "range" \
                and not loop.iter.keywords and 1 <= len(loop.iter.args) <= 3 \
                and not any(isinstance(a, ast.Starred) for a in loop.iter.args):
            values = [_literal_number(arg) for arg in loop.iter.args]
            if all(isinstance(v, int) for v in values):
                ints = [int(v) for v in values if v is not None]
                count = _range_count(*ints)
                if count > MAX_ITERATIONS and required:
                    raise self.fail(loop.iter, "bad-iterations",
                                    f"this range() has {count:.3g} iterations, more than the "
                                    "10**18 a schedule can count: use a smaller bound")
                return count, "range"
        if required:
            raise self.fail(loop, "unbounded-loop",
                            "this loop holds _checkpoint() hints but its iteration count is "
                            "unknown: add `_iterations: N` as the first statement of its body")
        self.warn(loop, "unbounded-loop",
                  "loop without `_iterations: N` or literal range(): its cost counts one "
                  "iteration")
        return 1, "default"

    def estimate(self, node: ast.stmt) -> float:
        """Seconds for one execution of ``node`` (see the module docstring)."""
        kind = type(node)
        if kind in _SIMPLE:
            return 0.0 if _annotation_name(node) else STATEMENT_SECONDS
        if kind in _FUNCTIONS or kind is ast.ClassDef:
            return STATEMENT_SECONDS
        if isinstance(node, ast.For | ast.While | ast.AsyncFor):
            n, _ = self.iterations(node, required=False) if not isinstance(node, ast.AsyncFor) \
                else (1, "default")
            return STATEMENT_SECONDS + n * (STATEMENT_SECONDS + self.block_cost(node.body))
        if isinstance(node, ast.If):
            return STATEMENT_SECONDS + max(self.block_cost(node.body),
                                           self.block_cost(node.orelse))
        if isinstance(node, ast.Match):
            return STATEMENT_SECONDS + max((self.block_cost(c.body) for c in node.cases),
                                           default=0.0)
        if isinstance(node, ast.With | ast.AsyncWith):
            return STATEMENT_SECONDS + self.block_cost(node.body)
        if isinstance(node, ast.Try | ast.TryStar):
            handlers = max((self.block_cost(h.body) for h in node.handlers), default=0.0)
            return (self.block_cost(node.body) + handlers + self.block_cost(node.orelse)
                    + self.block_cost(node.finalbody))
        return STATEMENT_SECONDS

    def block_cost(self, block: Sequence[ast.stmt]) -> float:
        return sum(self.estimate(s) for s in block)

    # -- the tree
    def hint_of(self, stmt: ast.Expr, region: str, loops: tuple[int, ...]) -> Hint:
        key = id(stmt)
        if key not in self._hint_ids:
            self._hint_ids[key] = len(self.hints) + 1
            self.hints.append(Hint(id=len(self.hints) + 1, position=self.pos(stmt),
                                   region=region, loops=loops, statement=stmt))
        return self.hints[self._hint_ids[key] - 1]

    def check_alone(self, stmt: ast.Expr) -> None:
        call = stmt.value
        assert isinstance(call, ast.Call)
        if call.args or call.keywords:
            raise self.fail(call, "hint-arguments",
                            "_checkpoint() takes no arguments: parameters go in "
                            "@checkpoint_params(...) or on the command line")
        # Alone: nothing before it on its first line, at most a comment after it on its last
        # (code generation inserts whole lines after a hint).
        lines = self.lines.lines
        first = lines[stmt.lineno - 1].encode("utf-8")
        end_line = stmt.end_lineno or stmt.lineno
        last = lines[end_line - 1].encode("utf-8")
        after = last[stmt.end_col_offset or 0:].strip()
        if first[:stmt.col_offset].strip() or (after and not after.startswith(b"#")):
            raise self.fail(call, "hint-not-alone", "put _checkpoint() on a line of its own")

    def seq(self, statements: Sequence[ast.stmt], region: str,
            loops: tuple[int, ...], enclosing: tuple[ast.stmt, ...]) -> Seq:
        items: list[Item] = []
        pending: list[ast.stmt] = []
        declared: float | None = None

        def flush() -> None:
            nonlocal declared
            if pending:
                start, end = self.pos(pending[0]), self.pos(pending[-1])
                cost = declared if declared is not None else sum(self.estimate(s)
                                                                 for s in pending)
                items.append(Code(
                    position=Position(line=start.line, column=start.column,
                                      end_line=end.end_line, end_column=end.end_column),
                    statements=tuple(pending), cost=cost, declared=declared is not None,
                    enclosing=enclosing))
            elif declared is not None:
                assert self._declared_at is not None
                items.append(Code(position=self._declared_at, statements=(), cost=declared,
                                  declared=True, enclosing=enclosing))
            pending.clear()
            declared = None

        for index, stmt in enumerate(statements):
            misspelt = _misspelt_annotation(stmt)
            if misspelt is not None:
                raise self.fail(stmt, f"{misspelt.lstrip('_')}-assignment",
                                _assignment_message(misspelt))
            ann = _annotation_name(stmt)
            if ann == "_iterations":
                if index != 0 or not loops:
                    raise self.fail(stmt, "misplaced-iterations",
                                    "`_iterations: N` must be the first statement of a loop body")
                continue
            if ann == "_cost":
                assert isinstance(stmt, ast.AnnAssign)
                value = _literal_number(stmt.annotation)
                if value is None or value < 0:
                    raise self.fail(stmt, "bad-cost",
                                    "_cost needs a non-negative number of seconds (like 0.25)")
                if declared is not None:
                    raise self.fail(stmt, "bad-cost",
                                    "two `_cost` annotations in one task: keep one per stretch "
                                    "of code between hints")
                declared = float(value)
                self._declared_at = self.pos(stmt)
                continue
            if id(stmt) in self.scan.hint_statements:
                assert isinstance(stmt, ast.Expr)
                self.check_alone(stmt)
                flush()
                items.append(HintSite(hint=self.hint_of(stmt, region, loops),
                                      enclosing=enclosing))
                continue
            if not self.holds_hint(stmt):
                pending.append(stmt)
                continue
            flush()
            items.extend(self.structured(stmt, region, loops, enclosing))
        flush()
        return Seq(items=tuple(items))

    def structured(self, stmt: ast.stmt, region: str, loops: tuple[int, ...],
                   enclosing: tuple[ast.stmt, ...]) -> list[Item]:
        callee = self.host_calls.get(id(stmt))
        if callee is not None:
            # The call, then the callee's body where it runs: one structure for the schedule.
            call = Code(position=self.pos(stmt), statements=(stmt,), cost=STATEMENT_SECONDS,
                        declared=False, enclosing=enclosing)
            return [call, *self.seq(callee.body, region, loops, ()).items]
        if isinstance(stmt, ast.AsyncFor | ast.AsyncWith):
            word = "for" if isinstance(stmt, ast.AsyncFor) else "with"
            raise self.fail(stmt, "async-hint", f"hints inside `async {word}` are not supported")
        if isinstance(stmt, ast.For | ast.While):
            if stmt.orelse and any(self.holds_hint(s) or id(s) in self.scan.hint_statements
                                   for s in stmt.orelse):
                raise self.fail(stmt.orelse[0], "unsupported-hint",
                                "hints in a loop's else clause are not supported: move the hint "
                                "after the loop")
            count, source = self.iterations(stmt, required=True)
            body = self.seq(stmt.body, region, (*loops, stmt.lineno), ())
            return [Loop(position=self.pos(stmt), node=stmt, iterations=count,
                         iterations_from=source, header_cost=STATEMENT_SECONDS, body=body,
                         enclosing=enclosing)]
        if isinstance(stmt, ast.If):
            arms: list[Seq] = []
            node: ast.If | None = stmt
            orelse: list[ast.stmt] = []
            while node is not None:
                arms.append(self.seq(node.body, region, loops, ()))
                orelse = node.orelse
                node = orelse[0] if len(orelse) == 1 and isinstance(orelse[0], ast.If) \
                    and self._is_elif(orelse[0]) else None
            arms.append(self.seq(orelse, region, loops, ()) if orelse else Seq(items=()))
            return [Branch(position=self.pos(stmt), node=stmt, arms=tuple(arms),
                           test_cost=STATEMENT_SECONDS, enclosing=enclosing)]
        if isinstance(stmt, ast.Match):
            arms = []
            for case in stmt.cases:
                arms.append(self.seq(case.body, region, loops, ()))
            if not any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None
                       and c.guard is None for c in stmt.cases):
                arms.append(Seq(items=()))
            return [Branch(position=self.pos(stmt), node=stmt, arms=tuple(arms),
                           test_cost=STATEMENT_SECONDS, enclosing=enclosing)]
        if isinstance(stmt, ast.With):
            entry = Code(position=self.pos(stmt), statements=(), cost=STATEMENT_SECONDS,
                         declared=False, enclosing=enclosing)
            inner = self.seq(stmt.body, region, loops, (*enclosing, stmt))
            return [entry, *inner.items]
        if isinstance(stmt, ast.Try | ast.TryStar):
            for part in (*(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                if any(self.holds_hint(s) or id(s) in self.scan.hint_statements for s in part):
                    raise self.fail(part[0], "unsupported-hint",
                                    "hints in except/else/finally clauses are not supported: "
                                    "keep hints in the try body or outside the try")
            return list(self.seq(stmt.body, region, loops, (*enclosing, stmt)).items)
        raise self.fail(stmt, "unsupported-hint",
                        f"hints inside `{type(stmt).__name__}` statements are not supported")

    def _is_elif(self, node: ast.If) -> bool:
        return is_elif(self.lines.lines, node)


def is_elif(lines: Sequence[str], node: ast.If) -> bool:
    """``elif`` and ``else:`` + a nested ``if`` give the same ``ast``; the source tells them apart
    (an ``elif`` arm's ``If`` starts at the word ``elif``)."""
    line = lines[node.lineno - 1] if node.lineno <= len(lines) else ""
    return line.encode("utf-8")[node.col_offset:node.col_offset + 4] == b"elif"


def _params(builder: _Builder, calls: Sequence[ast.Call]) -> RegionParams:
    """The schedule parameters written in the source, checked where they are written (a bad
    value is blamed on its keyword and line, never on a command-line flag)."""
    values: dict[str, float] = {}
    where: dict[str, ast.keyword] = {}
    for call in calls:
        checkhint = _call_name(call) == CHECKHINT_NAME
        keys = (*_CHECKHINT_KEYS, _HINT_NAME_KEY) if checkhint else _PARAM_KEYS
        usage = f"{_call_name(call)} takes keywords {', '.join(keys)}"
        if call.args:
            raise builder.fail(call.args[0], "bad-params", usage)
        for kw in call.keywords:
            if kw.arg not in keys:
                raise builder.fail(kw, "bad-params", usage)
            if kw.arg == _HINT_NAME_KEY:
                if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)
                        and kw.value.value.isidentifier()):
                    raise builder.fail(kw.value, "bad-params",
                                       f"{_HINT_NAME_KEY}= needs the hint function's name as a "
                                       "string literal (like \"_checkpoint\")")
                continue
            value = _literal_number(kw.value)
            if value is None:
                raise builder.fail(kw.value, "bad-params",
                                   f"{_call_name(call)}({kw.arg}=...) needs a number literal")
            key = _CHECKHINT_KEYS[kw.arg] if checkhint else kw.arg
            problem = param_problem(key, float(value))
            if problem is not None:
                raise builder.fail(kw.value, "bad-params",
                                   f"{_call_name(call)}({kw.arg}={value!r}): {problem}")
            values[key] = float(value)
            where[key] = kw
    if "failure_rate" in values and "mtbf" in values:
        raise builder.fail(where["mtbf"], "bad-params",
                           "give a failure rate or an MTBF, not both")
    return RegionParams(**values)


def param_problem(key: str, value: float) -> str | None:
    """Why a schedule parameter's value is unusable, in words shared with the command line."""
    if not math.isfinite(value):
        return "must be a finite number"
    if key == "overhead" and value < 0:
        return "the allowance is a non-negative fraction of run time (like 0.05)"
    if key == "ckpt_cost" and value <= 0:
        return "a checkpoint's cost is positive seconds"
    if key == "failure_rate" and not 0 < value < 1:
        return "the probability of a failure in one second is in (0, 1)"
    if key == "mtbf" and value <= 0:
        return "the mean time between failures is positive seconds"
    return None


def _params_call(expr: ast.expr) -> ast.Call | None:
    if isinstance(expr, ast.Call) and _call_name(expr) in (PARAMS_NAME, CHECKHINT_NAME):
        return expr
    return None


def _functions(module: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    def walk(body: Sequence[ast.stmt], prefix: str
             ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for stmt in body:
            for node in _compound_children(stmt):
                if isinstance(node, _FUNCTIONS):
                    name = f"{prefix}{node.name}"
                    yield name, node
                    yield from walk(node.body, f"{name}.")
                elif isinstance(node, ast.ClassDef):
                    yield from walk(node.body, f"{prefix}{node.name}.")

    yield from walk(module.body, "")


def _compound_children(stmt: ast.stmt) -> Iterator[ast.stmt]:
    """The statement itself, and statements nested in its blocks (not inside defs)."""
    yield stmt
    if isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)) or type(stmt) in _SIMPLE:
        return
    for _name, value in ast.iter_fields(stmt):
        if isinstance(value, list):
            for v in value:
                if isinstance(v, ast.stmt):
                    yield from _compound_children(v)
                elif isinstance(v, ast.ExceptHandler | ast.match_case):
                    for inner in v.body:
                        yield from _compound_children(inner)


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _syntax_issue(path: str, exc: SyntaxError) -> SourceIssue:
    return SourceIssue(path=path, line=exc.lineno or 1, column=max(exc.offset or 1, 1),
                       message=f"syntax error: {exc.msg}", kind="syntax")


def parse_source(source: str, path: str) -> ast.Module:
    """CPython's parser: the exact position and wording of a syntax error."""
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise SourceError(_syntax_issue(path, exc)) from None
    except ValueError as exc:  # null bytes
        raise SourceError(SourceIssue(path=path, line=1, column=1,
                                      message=f"syntax error: {exc}", kind="syntax")) from None


def build_task_tree(source: str, path: str, module: ast.Module | None = None) -> TaskTree:
    """Parse ``source`` and build its task tree; raises :class:`SourceError` for bad input."""
    if module is None:
        module = parse_source(source, path)
    scan = _Scan()
    scan.run(module)
    builder = _Builder(path, source, scan)
    if scan.problem is not None:
        node, kind, message = scan.problem
        raise builder.fail(node, kind, message)

    holders = {id(func): func for _, func in _functions(module)
               if isinstance(func, ast.FunctionDef)
               and any(builder.holds_hint(s) or id(s) in scan.hint_statements
                       for s in func.body)}
    hosted, hosting_issue = find_hostings(module, holders, builder.lines.lines, path)
    for hosting in hosted.values():
        builder.host_calls[id(hosting.call)] = hosting.callee
        # The call statement and what encloses it in the caller hold the callee's hints.
        scan.holding.update(id(s) for s in _enclosing(hosting.caller, hosting.call))

    regions: list[Region] = []
    for name, func in _functions(module):
        if not any(builder.holds_hint(s) or id(s) in scan.hint_statements for s in func.body):
            continue
        if isinstance(func, ast.AsyncFunctionDef):
            raise builder.fail(func, "hint-in-async",
                               f"{name} is async: hints in async functions are not supported")
        facts = scan.facts.get(id(func), _ScopeFacts())
        if facts.yields is not None:
            raise builder.fail(facts.yields, "hint-in-generator",
                               f"{name} is a generator (it yields): a checkpoint cannot resume "
                               "its caller's iteration; move the hints to the consuming loop")
        if facts.unsound is not None:
            node, why = facts.unsound
            raise builder.fail(node, "unsound-call",
                               f"{why}, so liveness cannot be sound in {name}, which holds "
                               "hints")
        if id(func) in hosted:
            continue  # its body is part of the region of the function that calls it
        calls = [c for f in (func, *hosted_under(func, hosted.values()))
                 for d in f.decorator_list
                 if (c := _params_call(d)) is not None]
        regions.append(Region(name=name, position=builder.pos(func), node=func,
                              body=builder.seq(func.body, name, (), ()),
                              params=_params(builder, calls)))

    top = module.body
    if any(builder.holds_hint(s) or id(s) in scan.hint_statements for s in top):
        facts = scan.facts[0]
        if facts.unsound is not None:
            node, why = facts.unsound
            raise builder.fail(node, "unsound-call",
                               f"{why}, so liveness cannot be sound at module level, which "
                               "holds hints")
        calls = [c for s in top if isinstance(s, ast.Expr)
                 and (c := _params_call(s.value)) is not None]
        regions.insert(0, Region(name="<module>", position=Position(line=1, column=1,
                                                                     end_line=1, end_column=1),
                                 node=module, body=builder.seq(top, "<module>", (), ()),
                                 params=_params(builder, calls)))
    hints = tuple(sorted(builder.hints, key=lambda h: (h.position.line, h.position.column)))
    renumber = {h.id: i + 1 for i, h in enumerate(hints)}
    if any(old != new for old, new in renumber.items()):
        regions = [_renumber_region(r, renumber) for r in regions]
        hints = tuple(_renumber_hint(h, renumber) for h in hints)
    return TaskTree(path=path, source=source, module=module, regions=tuple(regions),
                    hints=hints, warnings=tuple(builder.warnings),
                    hosted=tuple(hosted.values()), hosting_issue=hosting_issue)


def _enclosing(func: ast.FunctionDef | ast.Module, target: ast.stmt) -> list[ast.stmt]:
    """``target`` and the statements of ``func`` that enclose it."""
    parents: dict[int, ast.AST] = {}
    for parent in ast.walk(func):
        for child in ast.iter_child_nodes(parent):
            parents[id(child)] = parent
    out: list[ast.stmt] = []
    node: ast.AST | None = target
    while node is not None and node is not func:
        if isinstance(node, ast.stmt):
            out.append(node)
        node = parents.get(id(node))
    return out


def _renumber_hint(hint: Hint, renumber: dict[int, int]) -> Hint:
    return Hint(id=renumber[hint.id], position=hint.position, region=hint.region,
                loops=hint.loops, statement=hint.statement)


def _renumber_seq(seq: Seq, renumber: dict[int, int]) -> Seq:
    items: list[Item] = []
    for item in seq.items:
        if isinstance(item, HintSite):
            items.append(HintSite(hint=_renumber_hint(item.hint, renumber),
                                  enclosing=item.enclosing))
        elif isinstance(item, Loop):
            items.append(Loop(position=item.position, node=item.node, iterations=item.iterations,
                              iterations_from=item.iterations_from, header_cost=item.header_cost,
                              body=_renumber_seq(item.body, renumber), enclosing=item.enclosing))
        elif isinstance(item, Branch):
            items.append(Branch(position=item.position, node=item.node,
                                arms=tuple(_renumber_seq(a, renumber) for a in item.arms),
                                test_cost=item.test_cost, enclosing=item.enclosing))
        else:
            items.append(item)
    return Seq(items=tuple(items))


def _renumber_region(region: Region, renumber: dict[int, int]) -> Region:
    return Region(name=region.name, position=region.position, node=region.node,
                  body=_renumber_seq(region.body, renumber), params=region.params)
