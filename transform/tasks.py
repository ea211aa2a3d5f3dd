"""The task tree: a program's hints, and the code between them, as data with source positions.

A *region* is what one schedule covers: the module's top level, or one function whose body holds
hints (directly: a nested function is its own region). Inside a region the statements become a
:class:`Seq` of items: :class:`Code` (statements that cannot cross a hint; a compound statement
without hints stays whole), :class:`HintSite`, and the structured tasks :class:`Loop` and
:class:`Branch` for loops and branches that contain hints. ``with`` bodies and ``try`` bodies are
spliced into the enclosing sequence (``Code`` items carry their enclosing statements, so code
generation can re-enter them); hints in ``except``/``else``/``finally`` clauses and loop ``else``
clauses are rejected. Every item keeps its libcst node(s) and 1-based positions: the generator
consumes the tree directly.

Costs are seconds. ``_cost: X`` as a statement of a code segment declares that segment's time;
otherwise a static estimate (:data:`STATEMENT_SECONDS` per simple statement, times the iterations
of enclosing hint-free loops, the dearest arm of a branch) stands in, and a profile can replace
both (see :mod:`transform.profile`).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from transform.errors import SourceError, SourceIssue

__all__ = [
    "STATEMENT_SECONDS",
    "HINT_NAME",
    "PARAMS_NAME",
    "Position",
    "Hint",
    "Code",
    "HintSite",
    "Loop",
    "Branch",
    "Seq",
    "Item",
    "RegionParams",
    "Region",
    "TaskTree",
    "build_task_tree",
]

STATEMENT_SECONDS = 1e-3
"""Static estimate of one simple statement (documented in docs/transform.md; crude on purpose:
declare ``_cost`` or profile when it matters)."""
HINT_NAME = "_checkpoint"
PARAMS_NAME = "checkpoint_params"
_PARAM_KEYS = ("overhead", "ckpt_cost", "failure_rate", "mtbf")
_UNSOUND_CALLS = {
    "exec": "exec() can bind and read any name",
    "eval": "eval() can read any name",
    "locals": "locals() exposes every name",
    "vars": "vars() exposes every name",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Position:
    """A source span: 1-based lines and columns, end exclusive (as editors show them)."""

    line: int
    column: int
    end_line: int
    end_column: int

    @staticmethod
    def of(code_range: CodeRange) -> Position:
        return Position(line=code_range.start.line, column=code_range.start.column + 1,
                        end_line=code_range.end.line, end_column=code_range.end.column + 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Hint:
    """One ``_checkpoint()`` statement. Ids are 1-based in source order over the whole file."""

    id: int
    position: Position
    region: str
    """Qualified name of the region (``<module>`` or ``train``, ``Trainer.fit``…)."""
    loops: tuple[int, ...]
    """Source lines of the enclosing loops of the region, outermost first."""
    statement: cst.SimpleStatementLine = field(compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Code:
    """Statements between hints (none of them holds a hint of this region)."""

    position: Position
    statements: tuple[cst.BaseStatement, ...] = field(compare=False, repr=False)
    cost: float
    """Seconds for one execution: declared (``_cost``) or estimated."""
    declared: bool
    """True when a ``_cost`` annotation gave ``cost``."""
    enclosing: tuple[cst.CSTNode, ...] = field(default=(), compare=False, repr=False)
    """``with``/``try`` statements spliced around this code (outermost first)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HintSite:
    hint: Hint
    enclosing: tuple[cst.CSTNode, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Loop:
    """A ``for``/``while`` loop whose body holds hints."""

    position: Position
    node: cst.For | cst.While = field(compare=False, repr=False)
    iterations: int
    iterations_from: str
    """``annotation`` (``_iterations: N``) or ``range`` (literal bounds)."""
    header_cost: float
    """Seconds per iteration outside the body's statements (the test or the iterator step)."""
    body: Seq
    enclosing: tuple[cst.CSTNode, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Branch:
    """An ``if``/``elif``/``else`` chain or a ``match`` whose arms hold hints.

    A missing ``else`` (or a match without a wildcard) is an empty arm. Arms are joined for the
    schedule as in CheckHint: position by position, the dearest arm's time.
    """

    position: Position
    node: cst.If | cst.Match = field(compare=False, repr=False)
    arms: tuple[Seq, ...]
    test_cost: float
    enclosing: tuple[cst.CSTNode, ...] = field(default=(), compare=False, repr=False)


Item = Code | HintSite | Loop | Branch


@dataclass(frozen=True, kw_only=True, slots=True)
class Seq:
    items: tuple[Item, ...]

    def hints(self) -> Iterator[Hint]:
        for item in self.items:
            if isinstance(item, HintSite):
                yield item.hint
            elif isinstance(item, Loop):
                yield from item.body.hints()
            elif isinstance(item, Branch):
                for arm in item.arms:
                    yield from arm.hints()


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionParams:
    """Schedule parameters declared in the source (``@checkpoint_params(...)``); None: unset."""

    overhead: float | None = None
    ckpt_cost: float | None = None
    failure_rate: float | None = None
    mtbf: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Region:
    name: str
    position: Position
    node: cst.Module | cst.FunctionDef = field(compare=False, repr=False)
    body: Seq
    params: RegionParams


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskTree:
    path: str
    module: cst.Module = field(compare=False, repr=False)
    regions: tuple[Region, ...]
    hints: tuple[Hint, ...]
    warnings: tuple[SourceIssue, ...]


# --------------------------------------------------------------------------- helpers


def _is_hint_call(node: cst.CSTNode) -> bool:
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Name):
        return func.value == HINT_NAME
    return isinstance(func, cst.Attribute) and func.attr.value == HINT_NAME


def _name_of_call(node: cst.Call) -> str | None:
    func = node.func
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


class _Finder(cst.CSTVisitor):
    """Collects hint calls, stopping at nested function and class definitions."""

    def __init__(self) -> None:
        self.found = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        if _is_hint_call(node):
            self.found = True
        return True


def _holds_hint(node: cst.CSTNode) -> bool:
    finder = _Finder()
    node.visit(finder)
    return finder.found


_ARITH = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult,
          ast.FloorDiv, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Mod)


def _literal_number(module: cst.Module, expr: cst.BaseExpression) -> float | None:
    """The value of a literal arithmetic expression (``10**9``, ``3_600 * 24``), else None."""
    source = module.code_for_node(expr)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        return None
    if not all(isinstance(n, _ARITH) for n in ast.walk(tree)):
        return None
    if any(isinstance(n, ast.Constant) and not isinstance(n.value, int | float)
           for n in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<literal>", "eval"), {"__builtins__": {}}, {})
    except (ArithmeticError, ValueError, OverflowError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if isinstance(value, float) else value


def _annotation_name(stmt: cst.BaseStatement) -> tuple[str, cst.AnnAssign] | None:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) \
            and small.value is None and small.target.value in ("_iterations", "_cost"):
        return small.target.value, small
    return None


# --------------------------------------------------------------------------- builder


class _Builder:
    def __init__(self, path: str, module: cst.Module, wrapper: MetadataWrapper) -> None:
        self.path = path
        self.module = module
        self.positions = wrapper.resolve(PositionProvider)
        self.hints: list[Hint] = []
        self.warnings: list[SourceIssue] = []
        self._hint_ids: dict[int, int] = {}

    # -- positions and issues
    def pos(self, node: cst.CSTNode) -> Position:
        return Position.of(self.positions[node])

    def issue(self, node: cst.CSTNode, kind: str, message: str) -> SourceIssue:
        p = self.pos(node)
        return SourceIssue(path=self.path, line=p.line, column=p.column, message=message,
                           kind=kind)

    def fail(self, node: cst.CSTNode, kind: str, message: str) -> SourceError:
        return SourceError(self.issue(node, kind, message))

    def warn(self, node: cst.CSTNode, kind: str, message: str) -> None:
        self.warnings.append(self.issue(node, kind, message))

    # -- static cost estimates
    def iterations(self, loop: cst.For | cst.While, *, required: bool) -> tuple[int, str]:
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
        first = body[0] if body else None
        found = _annotation_name(first) if first is not None else None
        if found and found[0] == "_iterations":
            ann = found[1].annotation.annotation
            value = _literal_number(self.module, ann)
            if value is None or value < 0 or value != math.floor(value):
                raise self.fail(ann, "bad-iterations",
                                "_iterations needs a non-negative integer literal (like 1000 or "
                                "10**6)")
            return int(value), "annotation"
        if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call) \
                and isinstance(loop.iter.func, cst.Name) and loop.iter.func.value == "range":
            values = [_literal_number(self.module, arg.value) for arg in loop.iter.args]
            if values and all(isinstance(v, int) for v in values) and len(values) <= 3 \
                    and all(arg.keyword is None and arg.star == "" for arg in loop.iter.args):
                ints = [int(v) for v in values if v is not None]
                return len(range(*ints)) if ints[-1] or len(ints) < 3 else 0, "range"
        if required:
            raise self.fail(loop, "unbounded-loop",
                            "this loop holds _checkpoint() hints but its iteration count is "
                            "unknown: add `_iterations: N` as the first statement of its body")
        self.warn(loop, "unbounded-loop",
                  "loop without `_iterations: N` or literal range(): its cost counts one "
                  "iteration")
        return 1, "default"

    def estimate(self, node: cst.CSTNode) -> float:
        """Seconds for one execution of ``node`` (see the module docstring)."""
        if isinstance(node, cst.SimpleStatementLine):
            return STATEMENT_SECONDS * sum(
                0 if isinstance(s, cst.AnnAssign) and isinstance(s.target, cst.Name)
                and s.target.value in ("_iterations", "_cost") and s.value is None else 1
                for s in node.body)
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            return STATEMENT_SECONDS
        if isinstance(node, cst.For | cst.While):
            n, _ = self.iterations(node, required=False)
            return STATEMENT_SECONDS + n * (STATEMENT_SECONDS + self.block_cost(node.body))
        if isinstance(node, cst.If):
            other = node.orelse
            alt = 0.0
            if isinstance(other, cst.If):
                alt = self.estimate(other)
            elif isinstance(other, cst.Else):
                alt = self.block_cost(other.body)
            return STATEMENT_SECONDS + max(self.block_cost(node.body), alt)
        if isinstance(node, cst.Match):
            return STATEMENT_SECONDS + max((self.block_cost(c.body) for c in node.cases),
                                           default=0.0)
        if isinstance(node, cst.With):
            return STATEMENT_SECONDS + self.block_cost(node.body)
        if isinstance(node, cst.Try | cst.TryStar):
            handlers = max((self.block_cost(h.body) for h in node.handlers), default=0.0)
            rest = sum(self.block_cost(part.body) for part in (node.orelse, node.finalbody)
                       if part is not None)
            return self.block_cost(node.body) + handlers + rest
        return STATEMENT_SECONDS

    def block_cost(self, block: cst.BaseSuite) -> float:
        if isinstance(block, cst.IndentedBlock):
            return sum(self.estimate(s) for s in block.body)
        if isinstance(block, cst.SimpleStatementSuite):
            return STATEMENT_SECONDS * len(block.body)
        return 0.0

    # -- the tree
    def hint_of(self, stmt: cst.SimpleStatementLine, region: str, loops: tuple[int, ...]) -> Hint:
        key = id(stmt)
        if key not in self._hint_ids:
            self._hint_ids[key] = len(self.hints) + 1
            self.hints.append(Hint(id=len(self.hints) + 1, position=self.pos(stmt),
                                   region=region, loops=loops, statement=stmt))
        return self.hints[self._hint_ids[key] - 1]

    def seq(self, statements: Sequence[cst.BaseStatement], region: str,
            loops: tuple[int, ...], enclosing: tuple[cst.CSTNode, ...]) -> Seq:
        items: list[Item] = []
        pending: list[cst.BaseStatement] = []
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
                items.append(Code(position=self._declared_at, statements=(), cost=declared,
                                  declared=True, enclosing=enclosing))
            pending.clear()
            declared = None

        for index, stmt in enumerate(statements):
            ann = _annotation_name(stmt)
            if ann is not None and ann[0] == "_iterations":
                if index != 0 or not loops:
                    raise self.fail(stmt, "misplaced-iterations",
                                    "`_iterations: N` must be the first statement of a loop body")
                continue
            if ann is not None and ann[0] == "_cost":
                value = _literal_number(self.module, ann[1].annotation.annotation)
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
            if isinstance(stmt, cst.SimpleStatementLine):
                hint_calls = [s for s in stmt.body if isinstance(s, cst.Expr)
                              and _is_hint_call(s.value)]
                if hint_calls:
                    call = hint_calls[0].value
                    assert isinstance(call, cst.Call)
                    if call.args:
                        raise self.fail(call, "hint-arguments",
                                        "_checkpoint() takes no arguments: parameters go in "
                                        "@checkpoint_params(...) or on the command line")
                    if len(stmt.body) != 1:
                        raise self.fail(call, "hint-not-alone",
                                        "put _checkpoint() on a line of its own")
                    flush()
                    items.append(HintSite(hint=self.hint_of(stmt, region, loops),
                                          enclosing=enclosing))
                    continue
                pending.append(stmt)
                continue
            if isinstance(stmt, cst.FunctionDef | cst.ClassDef) or not _holds_hint(stmt):
                pending.append(stmt)
                continue
            flush()
            items.extend(self.structured(stmt, region, loops, enclosing))
        flush()
        return Seq(items=tuple(items))

    def body_of(self, block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
        if isinstance(block, cst.IndentedBlock):
            return block.body
        if isinstance(block, cst.SimpleStatementSuite):
            return (cst.SimpleStatementLine(body=block.body),) if block.body else ()
        return ()

    def structured(self, stmt: cst.BaseStatement, region: str, loops: tuple[int, ...],
                   enclosing: tuple[cst.CSTNode, ...]) -> list[Item]:
        if isinstance(stmt, cst.For | cst.While):
            if stmt.orelse is not None and _holds_hint(stmt.orelse):
                raise self.fail(stmt.orelse, "unsupported-hint",
                                "hints in a loop's else clause are not supported: move the hint "
                                "after the loop")
            if isinstance(stmt, cst.For) and stmt.asynchronous is not None:
                raise self.fail(stmt, "async-hint", "hints inside `async for` are not supported")
            count, source = self.iterations(stmt, required=True)
            line = self.pos(stmt).line
            body = self.seq(self.body_of(stmt.body), region, (*loops, line), ())
            return [Loop(position=self.pos(stmt), node=stmt, iterations=count,
                         iterations_from=source, header_cost=STATEMENT_SECONDS, body=body,
                         enclosing=enclosing)]
        if isinstance(stmt, cst.If):
            arms: list[Seq] = []
            node: cst.If | cst.Else | None = stmt
            while isinstance(node, cst.If):
                arms.append(self.seq(self.body_of(node.body), region, loops, ()))
                node = node.orelse if isinstance(node.orelse, cst.If | cst.Else) else None
            arms.append(self.seq(self.body_of(node.body), region, loops, ())
                        if isinstance(node, cst.Else) else Seq(items=()))
            return [Branch(position=self.pos(stmt), node=stmt, arms=tuple(arms),
                           test_cost=STATEMENT_SECONDS, enclosing=enclosing)]
        if isinstance(stmt, cst.Match):
            arms = [self.seq(self.body_of(case.body), region, loops, ()) for case in stmt.cases]
            if not any(isinstance(c.pattern, cst.MatchAs) and c.pattern.pattern is None
                       and c.guard is None for c in stmt.cases):
                arms.append(Seq(items=()))
            return [Branch(position=self.pos(stmt), node=stmt, arms=tuple(arms),
                           test_cost=STATEMENT_SECONDS, enclosing=enclosing)]
        if isinstance(stmt, cst.With):
            if stmt.asynchronous is not None:
                raise self.fail(stmt, "async-hint", "hints inside `async with` are not supported")
            entry = Code(position=self.pos(stmt), statements=(), cost=STATEMENT_SECONDS,
                         declared=False, enclosing=enclosing)
            inner = self.seq(self.body_of(stmt.body), region, loops, (*enclosing, stmt))
            return [entry, *inner.items]
        if isinstance(stmt, cst.Try | cst.TryStar):
            for part in (*stmt.handlers, stmt.orelse, stmt.finalbody):
                if part is not None and _holds_hint(part):
                    raise self.fail(part, "unsupported-hint",
                                    "hints in except/else/finally clauses are not supported: "
                                    "keep hints in the try body or outside the try")
            return list(self.seq(self.body_of(stmt.body), region, loops,
                                 (*enclosing, stmt)).items)
        raise self.fail(stmt, "unsupported-hint",
                        f"hints inside `{type(stmt).__name__}` statements are not supported")


class _Checks(cst.CSTVisitor):
    """File-wide checks: hints outside statements, in comprehensions, lambdas, generators…"""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, builder: _Builder) -> None:
        self.b = builder
        self.stack: list[cst.CSTNode] = []
        self.problem: SourceError | None = None
        self.statement_hints: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.problem is not None:
            return False
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                if isinstance(small, cst.Expr) and _is_hint_call(small.value):
                    self.statement_hints.add(id(small.value))
        if isinstance(node, cst.Call) and _is_hint_call(node):
            self.check_hint(node)
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()

    def check_hint(self, call: cst.Call) -> None:
        for outer in reversed(self.stack):
            if isinstance(outer, cst.ListComp | cst.SetComp | cst.DictComp | cst.GeneratorExp):
                self.problem = self.b.fail(call, "hint-in-comprehension",
                                           "_checkpoint() inside a comprehension cannot be a "
                                           "checkpoint: write the loop as a for statement")
                return
            if isinstance(outer, cst.Lambda):
                self.problem = self.b.fail(call, "hint-in-lambda",
                                           "_checkpoint() inside a lambda cannot be a "
                                           "checkpoint: use a def")
                return
            if isinstance(outer, cst.FunctionDef):
                break
        if id(call) not in self.statement_hints:
            self.problem = self.b.fail(call, "hint-in-expression",
                                       "_checkpoint() must be a statement of its own, not part "
                                       "of an expression")


class _FunctionFacts(cst.CSTVisitor):
    """Does a function body yield, await, or call exec/eval/locals/vars (not in nested defs)?"""

    def __init__(self) -> None:
        self.yields: cst.CSTNode | None = None
        self.unsound: tuple[cst.CSTNode, str] | None = None
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.depth += 1
        return self.depth == 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Yield(self, node: cst.Yield) -> None:
        if self.yields is None:
            self.yields = node

    def visit_Call(self, node: cst.Call) -> None:
        name = _name_of_call(node)
        if isinstance(node.func, cst.Name) and name in _UNSOUND_CALLS and self.unsound is None:
            if name == "vars" and node.args:
                return
            self.unsound = (node, _UNSOUND_CALLS[name])


def _module_facts(module: cst.Module) -> _FunctionFacts:
    facts = _FunctionFacts()
    facts.depth = 1  # the module level behaves like a function body that nested defs leave
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef | cst.ClassDef):
            stmt.visit(facts)
    return facts


def _params(builder: _Builder, calls: Sequence[cst.Call]) -> RegionParams:
    values: dict[str, float] = {}
    for call in calls:
        for arg in call.args:
            key = arg.keyword.value if arg.keyword is not None else None
            if key not in _PARAM_KEYS:
                raise builder.fail(arg, "bad-params",
                                   f"checkpoint_params takes keywords {', '.join(_PARAM_KEYS)}")
            assert key is not None
            value = _literal_number(builder.module, arg.value)
            if value is None:
                raise builder.fail(arg.value, "bad-params",
                                   f"checkpoint_params({key}=...) needs a number literal")
            values[key] = float(value)
    return RegionParams(**values)


def _params_call(expr: cst.BaseExpression) -> cst.Call | None:
    if isinstance(expr, cst.Call) and _name_of_call(expr) == PARAMS_NAME:
        return expr
    return None


def _functions(module: cst.Module) -> Iterator[tuple[str, cst.FunctionDef]]:
    def walk(body: Sequence[cst.CSTNode], prefix: str) -> Iterator[tuple[str, cst.FunctionDef]]:
        for stmt in body:
            for node in _compound_children(stmt):
                if isinstance(node, cst.FunctionDef):
                    name = f"{prefix}{node.name.value}"
                    yield name, node
                    yield from walk(_statements(node.body), f"{name}.")
                elif isinstance(node, cst.ClassDef):
                    yield from walk(_statements(node.body), f"{prefix}{node.name.value}.")

    yield from walk(module.body, "")


def _statements(block: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return block.body if isinstance(block, cst.IndentedBlock) else ()


def _compound_children(stmt: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The statement itself, and statements nested in its blocks (not inside defs)."""
    yield stmt
    if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        return
    for child in stmt.children:
        if isinstance(child, cst.IndentedBlock):
            for inner in child.body:
                yield from _compound_children(inner)
        elif isinstance(child, cst.BaseSuite | cst.If | cst.Else | cst.ExceptHandler
                        | cst.ExceptStarHandler | cst.Finally | cst.MatchCase):
            yield from _compound_children(child)


def build_task_tree(source: str, path: str) -> TaskTree:
    """Parse ``source`` and build its task tree; raises :class:`SourceError` for bad input."""
    try:
        # CPython's own parser gives the exact position and wording of a syntax error.
        ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise SourceError(SourceIssue(path=path, line=exc.lineno or 1,
                                      column=max(exc.offset or 1, 1),
                                      message=f"syntax error: {exc.msg}",
                                      kind="syntax")) from None
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise SourceError(SourceIssue(path=path, line=exc.raw_line, column=exc.raw_column + 1,
                                      message=f"syntax error: {exc.message}",
                                      kind="syntax")) from None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    builder = _Builder(path, module, wrapper)
    checks = _Checks(builder)
    wrapper.visit(checks)
    if checks.problem is not None:
        raise checks.problem

    regions: list[Region] = []
    for name, func in _functions(module):
        if not any(_holds_hint(s) for s in _statements(func.body)):
            continue
        facts = _FunctionFacts()
        func.visit(facts)
        if func.asynchronous is not None:
            raise builder.fail(func, "hint-in-async",
                               f"{name} is async: hints in async functions are not supported")
        if facts.yields is not None:
            raise builder.fail(facts.yields, "hint-in-generator",
                               f"{name} is a generator (it yields): a checkpoint cannot resume "
                               "its caller's iteration; move the hints to the consuming loop")
        if facts.unsound is not None:
            node, why = facts.unsound
            raise builder.fail(node, "unsound-call",
                               f"{why}, so liveness cannot be sound in {name}, which holds "
                               "hints")
        calls = [c for d in func.decorators if (c := _params_call(d.decorator)) is not None]
        regions.append(Region(name=name, position=builder.pos(func), node=func,
                              body=builder.seq(_statements(func.body), name, (), ()),
                              params=_params(builder, calls)))

    top = [s for s in module.body]
    if any(not isinstance(s, cst.FunctionDef | cst.ClassDef) and _holds_hint(s) for s in top):
        facts = _module_facts(module)
        if facts.unsound is not None:
            node, why = facts.unsound
            raise builder.fail(node, "unsound-call",
                               f"{why}, so liveness cannot be sound at module level, which "
                               "holds hints")
        calls = [c for s in top if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                 and isinstance(s.body[0], cst.Expr)
                 and (c := _params_call(s.body[0].value)) is not None]
        regions.insert(0, Region(name="<module>", position=Position(line=1, column=1,
                                                                     end_line=1, end_column=1),
                                 node=module, body=builder.seq(top, "<module>", (), ()),
                                 params=_params(builder, calls)))
    hints = tuple(sorted(builder.hints, key=lambda h: (h.position.line, h.position.column)))
    renumber = {h.id: i + 1 for i, h in enumerate(hints)}
    if any(old != new for old, new in renumber.items()):
        regions = [_renumber_region(r, renumber) for r in regions]
        hints = tuple(_renumber_hint(h, renumber) for h in hints)
    return TaskTree(path=path, module=module, regions=tuple(regions), hints=hints,
                    warnings=tuple(builder.warnings))


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
