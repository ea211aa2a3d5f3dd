"""Deciding the generated code of a program: which statements the walk skips, which headers
steer, where values are restored, and the plan (:class:`~transform.planspec.Plan`) the program
carries. The result is data (:class:`~transform._codegen_model.Marked`);
:mod:`transform._codegen_emit` writes it.
"""

from __future__ import annotations

import ast
import hashlib
import pprint
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from transform._codegen_model import Marked, Marks, Step
from transform._hosting import hosted_under
from transform._tasks_build import is_elif, is_hint_statement
from transform.analysis import AnalysisSuccess
from transform.cfg import (
    free_names,
    generator_functions,
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

__all__ = ["mark_program", "never_guarded", "issue"]


# --------------------------------------------------------------------------- statements


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _is_definition(stmt: ast.stmt) -> bool:
    if isinstance(stmt, _DEFINITIONS):
        return True
    return (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Lambda)
            and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name))


def never_guarded(stmt: ast.stmt) -> bool:
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


def _unsaveable_kind(stmt: ast.stmt, generators: frozenset[str]) -> str | None:
    """What an assignment binds when it is obviously something no checkpoint can hold: a
    generator (its frame cannot be saved), from a generator expression or a call of one of the
    program's generator functions. Open files and iterators are saved as what re-opens or
    re-creates them (transform/runtime/_resources.py), or refused at the first save."""
    value = stmt.value if isinstance(stmt, ast.Assign) else None
    if isinstance(value, ast.GeneratorExp):
        return "a generator"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id in generators:
        return f"a generator (from {value.func.id}(), a generator function)"
    return None


# --------------------------------------------------------------------------- marks


def _site_for(marks: Marks, kind: str, node: ast.AST, hint: int) -> int:
    key = (kind, id(node))
    if key not in marks.site:
        marks.site[key] = len(marks.site) + 1
        marks.sites[marks.site[key]] = set()
    k = marks.site[key]
    marks.sites[k].add(hint)
    return k


def _mark_skip(marks: Marks, stmt: ast.stmt) -> None:
    if id(stmt) in marks.skip:
        return
    marks.skip.add(id(stmt))
    # A skipped try still runs its blocks (nothing raises), a skipped loop its else block.
    if isinstance(stmt, ast.Try | ast.TryStar):
        for block in (stmt.body, stmt.orelse, stmt.finalbody):
            for s in block:
                _mark_skip(marks, s)
    elif isinstance(stmt, ast.For | ast.While):
        for s in stmt.orelse:
            _mark_skip(marks, s)


def _mark_region(marks: Marks, body: list[ast.stmt], chosen: dict[int, int],
                 hosted: dict[int, ast.FunctionDef]) -> None:
    """``hosted``: id of a call statement → the function it calls, whose body is part of the
    region (:mod:`transform._hosting`)."""
    chains: dict[int, list[Step]] = {}

    def visit(block: list[ast.stmt], chain: list[Step]) -> None:
        for i, s in enumerate(block):
            if id(s) in chosen:
                chains[chosen[id(s)]] = [*chain, Step(block, i, None)]
            elif isinstance(s, ast.For | ast.While):
                visit(s.body, [*chain, Step(block, i, ("loop", s))])
            elif isinstance(s, ast.If):
                node = s
                while True:
                    visit(node.body, [*chain, Step(block, i, ("arm", node))])
                    nxt = node.orelse
                    if len(nxt) == 1 and isinstance(nxt[0], ast.If) \
                            and is_elif(marks.lines, nxt[0]):
                        node = nxt[0]
                        continue
                    if nxt:
                        visit(nxt, [*chain, Step(block, i, ("else", node))])
                    break
            elif isinstance(s, ast.With):
                visit(s.body, [*chain, Step(block, i, ("with", s))])
            elif isinstance(s, ast.Try | ast.TryStar):
                visit(s.body, [*chain, Step(block, i, ("try", s))])
            elif isinstance(s, ast.Match):
                for case in s.cases:
                    visit(case.body, [*chain, Step(block, i, ("case", case))])
            elif id(s) in hosted:
                visit(hosted[id(s)].body, [*chain, Step(block, i, ("call", hosted[id(s)]))])

    visit(body, [])
    for hint, chain in sorted(chains.items()):
        marks.chains[hint] = chain
        marks.hint_loops[hint] = []
        marks.hint_subjects[hint] = []
        for step in chain:
            for s in step.block[:step.index]:
                _mark_skip(marks, s)
            stmt = step.block[step.index]
            if step.arm is None:
                continue
            kind, node = step.arm
            if kind == "loop":
                k = _site_for(marks, "loop", stmt, hint)
                if isinstance(stmt, ast.For):
                    marks.hint_loops[hint].append(k)
                    if _is_range_call(stmt.iter):
                        marks.ranges.add(k)
            elif kind in ("arm", "else"):
                _site_for(marks, kind, node, hint)
            elif kind == "with":
                _site_for(marks, "with", stmt, hint)
            elif kind == "case":
                marks.hint_subjects[hint].append(_site_for(marks, "match", stmt, hint))
                _site_for(marks, "case", node, hint)
            elif kind == "call":
                _site_for(marks, "call", stmt, hint)
        # One stretch of the way per function on the call stack: before the first statement
        # of each, the walk binds that function's saved values (level 0 the region's, None the
        # hint's own function).
        segments = _segments(chain)
        for level, segment in enumerate(segments):
            last = level == len(segments) - 1
            if last and len(segment) == 1:
                continue  # the hint itself binds them
            top = segment[0].block[segment[0].index]
            marks.restore_before.setdefault(id(top), []).append((hint, None if last else level))


def _segments(chain: list[Step]) -> list[list[Step]]:
    """The chain cut after each call into a hosted function: one part per function."""
    out: list[list[Step]] = [[]]
    for step in chain:
        out[-1].append(step)
        if step.arm is not None and step.arm[0] == "call":
            out.append([])
    return out


def _walk_executed(marks: Marks, hint: int, stmt: ast.stmt) -> bool:
    """Does ``stmt`` run again (unguarded) on the way to ``hint``'s saved point?"""
    for step in marks.chains[hint]:
        before = step.block[:step.index]
        if any(s is stmt for s in before):
            return never_guarded(stmt) and all(
                never_guarded(m) for m in _line_mates(step.block, stmt))
    return False


# --------------------------------------------------------------------------- the plan


def mark_program(result: AnalysisSuccess, chosen_ids: Sequence[int],
                 chosen_regions: Sequence[str], *, all_hints: bool,
                 ckpt_dir: str | None) -> Marked:
    """Decide what the generated code does at each statement of the chosen regions, and the plan
    the program carries (raises :class:`SourceError` for a live value it cannot save)."""
    tree = result.tree
    source = tree.source
    hints_by_id = {h.id: h for h in tree.hints}
    regions = {r.name: r for r in tree.regions}
    lines = source.splitlines()
    marks = Marks(lines, generators=generator_functions(tree.module))
    slot_of, rules = _slot_rules(result, all_hints)
    module_values = _module_values(tree.module)
    call_reads = module_call_reads(tree.module)
    plan_hints: dict[int, dict[str, Any]] = {}
    plan_regions: dict[str, dict[str, Any]] = {}
    region_names: dict[int, str] = {}
    path_chains: set[int] = set()
    hosted_calls = {id(h.call): h.callee for h in tree.hosted}
    qualified = {id(h.callee): h.callee_name for h in tree.hosted}
    qualified.update((id(h.caller), h.caller_name) for h in tree.hosted)
    hosted_names: dict[int, str] = {}
    for name in chosen_regions:
        region = regions[name]
        node = region.node
        chosen = {id(hints_by_id[h].statement): h for h in chosen_ids
                  if hints_by_id[h].region == name}
        marks.chosen.update(chosen)
        _mark_region(marks, node.body, chosen, hosted_calls)
        bindings = _bindings(node.body)
        info: dict[str, Any] = {}
        if isinstance(node, ast.FunctionDef):
            region_names[id(node)] = name
            declared = _declared_globals(node)
            local_names = set(bindings) | set(_params(node))
            reads = set(free_names(node)) | call_reads
            for callee in hosted_under(node, tree.hosted):
                reads |= set(free_names(callee))  # a hosted function's reads are the region's
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
                if step.arm is not None and step.arm[0] == "call":
                    hosted_names[id(step.arm[1])] = name
            plan_hints[hint] = _hint_plan(result, hint, chain, node, marks, slot_of,
                                          qualified)
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
    return Marked(marks=marks, plan=plan, hints=plan_hints, region_names=region_names,
                  path_chains=path_chains, hosted_names=hosted_names)


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



def _settle_sites(seq: Seq, marks: Marks, slot_of: dict[int, int]) -> None:
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


def _hint_plan(result: AnalysisSuccess, hint: int, chain: list[Step],
               region_node: ast.Module | ast.FunctionDef, marks: Marks,
               slot_of: dict[int, int], qualified: dict[int, str]) -> dict[str, Any]:
    """What the hint's save holds: the names of its own function and, for a hint of a hosted
    function, those of every function on the call stack at the call that leads to it."""
    line = result.tree.hints[hint - 1].position.line
    segments = _segments(chain)
    frames: list[dict[str, Any]] = []
    function: ast.Module | ast.FunctionDef = region_node
    for level, segment in enumerate(segments):
        last = level == len(segments) - 1
        if last:
            facts = result.live[hint]
        else:
            call = segment[-1].block[segment[-1].index]
            facts = result.call_live[id(call)]
        save, maybe = _frame_names(result, hint, facts, segment, _bindings(function.body),
                                   marks, line)
        frame: dict[str, Any] = {"save": sorted(save - maybe), "maybe": sorted(maybe)}
        if last:
            frame["detach"] = sorted(set(facts.detach) & save)
        else:
            frame["function"] = qualified.get(id(function), getattr(function, "name", ""))
            callee = segment[-1].arm
            assert callee is not None and isinstance(callee[1], ast.FunctionDef)
            function = callee[1]
        frames.append(frame)
    own = frames[-1]
    plan: dict[str, Any] = {
        "region": result.tree.hints[hint - 1].region,
        "line": line,
        "slot": slot_of[hint],
        "save": own["save"],
        "maybe": own["maybe"],
        "loops": marks.hint_loops[hint],
        "subjects": marks.hint_subjects[hint],
        "detach": own["detach"],
    }
    if len(frames) > 1:
        plan["outer"] = frames[:-1]
    return plan


def _frame_names(result: AnalysisSuccess, hint: int, facts: Any, segment: list[Step],
                 bindings: dict[str, list[ast.stmt]], marks: Marks, line: int
                 ) -> tuple[set[str], set[str]]:
    """(save, maybe) of one function of the way to ``hint``: its live facts, less what the
    walk binds again by itself."""
    maybe = set(facts.maybe_unbound)
    save = set(facts.save)
    # Enclosing ``with … as x`` targets are bound afresh when the walk re-enters the block.
    for step in segment:
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
        if not stmts or not all(_walk_executed(marks, hint, s) for s in stmts):
            save.add(name)
            maybe.add(name)
    for name in sorted(save):
        stmts = bindings.get(name, [])
        kinds = [_unsaveable_kind(s, marks.generators) for s in stmts]
        if stmts and all(kinds):
            raise issue(result, stmts[0], "unsaveable",
                        f"`{name}` holds {kinds[0]} and is live at the checkpoint on line "
                        f"{line}, which cannot save it: create it after the checkpoint, or "
                        "move the hint to where it is not live")
    return save, maybe


def issue(result: AnalysisSuccess, node: ast.AST, kind: str, message: str) -> SourceError:
    return SourceError(SourceIssue(path=result.path, line=getattr(node, "lineno", 1),
                                   column=getattr(node, "col_offset", 0) + 1, message=message,
                                   kind=kind))
