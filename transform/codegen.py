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

The modules: :mod:`transform._codegen_model` (the data: names, marks, :class:`Generated`),
:mod:`transform._codegen_marks` (the decisions and the plan), :mod:`transform._codegen_emit`
(the libcst emitter); this module checks what cannot be generated and ties them together.
"""

from __future__ import annotations

import ast
import pprint
import textwrap

import libcst as cst

from transform._codegen_emit import LINES_PLACEHOLDER, Emitter, with_line_map
from transform._codegen_marks import issue, mark_program
from transform._codegen_model import (
    ACTIVATION,
    MARKER,
    PROGRAM,
    RESERVED,
    RUNTIME,
    WIDTH,
    Generated,
)
from transform.analysis import AnalysisSuccess
from transform.calls import check_single_entry
from transform.errors import SourceError, SourceIssue

__all__ = ["Generated", "generate", "already_transformed", "ACTIVATION", "PROGRAM", "RUNTIME",
           "MARKER"]


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
        if name in RESERVED:
            raise issue(result, node, "reserved-name",
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
    if tree.hosting_issue is not None:
        raise SourceError(tree.hosting_issue)
    functions = {name: node for name in chosen_regions
                 if isinstance(node := regions[name].node, ast.FunctionDef)}
    entry = check_single_entry(tree.module, functions)
    if entry is not None:
        raise SourceError(entry.issue(result.path))

    marked = mark_program(result, chosen_ids, chosen_regions, all_hints=all_hints,
                          ckpt_dir=ckpt_dir)
    plan_literal = marked.plan.to_literal()
    literal = textwrap.indent(pprint.pformat(plan_literal, width=WIDTH - 4, sort_dicts=False,
                                             compact=True), "    ")
    prologue = [f"{MARKER}  # ecrl-transform: resumable checkpoints (docs/transform.md)\n",
                f"{PROGRAM} = {RUNTIME}.Program(\n    __file__,\n{literal},\n"
                f"    lines={LINES_PLACEHOLDER})\n"]
    if "<module>" in chosen_regions:
        prologue.append(f"{ACTIVATION} = {PROGRAM}.enter('<module>')\n")

    module = cst.parse_module(source)
    code = Emitter(module, tree.module, marked.marks, marked.hints, prologue,
                   marked.region_names, marked.path_chains,
                   marked.hosted_names).module_code()
    return Generated(code=with_line_map(code, source), changed=True,
                     checkpoints=tuple(chosen_ids), plan=plan_literal)

