"""The adoption line counts docs/frameworks.md states, measured: each framework's plain script
(docs/examples/adoption/*_plain.py) against the same script adopting ECRL in each mode."""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADOPTION = ROOT / "docs" / "examples" / "adoption"


def _code(path: Path) -> list[str]:
    """The script's lines that are code: blank lines and the module docstring left out."""
    text = path.read_text()
    first = ast.parse(text).body[0]
    doc = range(first.lineno, (first.end_lineno or 0) + 1) if isinstance(first, ast.Expr) \
        else range(0)
    return [line.strip() for n, line in enumerate(text.splitlines(), 1)
            if n not in doc and line.strip()]


def adoption(framework: str, mode: str) -> tuple[int, int, int]:
    """(added, changed, removed) code lines from the plain script to the adopted one."""
    a, b = _code(ADOPTION / f"{framework}_plain.py"), _code(ADOPTION / f"{framework}_{mode}.py")
    added = changed = removed = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "insert":
            added += j2 - j1
        elif op == "delete":
            removed += i2 - i1
        elif op == "replace":
            changed += min(i2 - i1, j2 - j1)
            added += max(0, (j2 - j1) - (i2 - i1))
            removed += max(0, (i2 - i1) - (j2 - j1))
    return added, changed, removed


@pytest.mark.parametrize(("framework", "mode", "counts"), [
    ("lightning", "audit", (2, 1, 0)),
    ("lightning", "exact", (3, 2, 0)),
    ("accelerate", "audit", (2, 1, 0)),
    ("accelerate", "exact", (3, 2, 0)),
    ("transformers", "audit", (2, 0, 0)),
    ("transformers", "exact", (3, 0, 0)),
])
def test_the_adoption_counts_the_docs_state(framework: str, mode: str,
                                            counts: tuple[int, int, int]) -> None:
    assert adoption(framework, mode) == counts
    added, changed, removed = counts
    doc = (ROOT / "docs" / "frameworks.md").read_text()
    total = added + changed + removed
    row = f"| {framework} | {mode} | {added} | {changed} | {removed} | {total} |"
    assert row in doc, row
