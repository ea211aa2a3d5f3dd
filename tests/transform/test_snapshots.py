"""The generated code of every fixture is pinned, and the user's lines survive it byte for byte.

Regenerate with ``python tests/transform/snapshots.py --update`` (then review the diff).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from genprograms import programs
from hypothesis import given
from hypothesis import strategies as st
from snapshots import SNAPSHOT, cases, generated_for, main

from transform.analysis import AnalysisSuccess, analyze
from transform.codegen import generate
from transform.strip import strip

CASES = {c.name: c for c in cases()}


def header_lines(source: str) -> set[int]:
    """Lines of compound-statement headers (``for``/``while``/``if``/``elif``/``with``/``match``/
    ``case``): the only original lines the generator may edit, inside their expressions."""
    out: set[int] = set()

    def span(start: int, body_line: int) -> None:
        out.update(range(start, max(body_line, start + 1)))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.For | ast.While | ast.If | ast.With):
            span(node.lineno, node.body[0].lineno)
        elif isinstance(node, ast.Match):
            span(node.lineno, node.cases[0].pattern.lineno)
            for case in node.cases:
                span(case.pattern.lineno, case.body[0].lineno)
    return out


def generated_span(code: str) -> set[int]:
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_ECRL"
                                                for t in node.targets):
            return set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return set()


def generated_statements(code: str) -> set[int]:
    """The lines of every simple statement the generator wrote (one that names ``_ecrl``), a
    long one wrapped over several lines included."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") \
                and "_ecrl" in (ast.get_source_segment(code, node) or ""):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def check_untouched(source: str, code: str) -> None:
    """Every input line appears in the output, in order, byte-identical — except compound
    headers, which keep their indentation and keyword; every other output line is generated."""
    headers = header_lines(source)
    out = code.splitlines(keepends=True)
    used: set[int] = set()
    j = 0
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        k = j
        while k < len(out) and out[k] != line:
            if number in headers and _same_header(line, out[k]):
                break
            k += 1
        assert k < len(out), f"input line {number} is missing or changed: {line!r}"
        used.add(k)
        j = k + 1
    generated = generated_span(code) | generated_statements(code)
    for k, line in enumerate(out):
        if k not in used and k + 1 not in generated:
            assert "_ecrl" in line, f"output line {k + 1} is neither the user's nor ours: {line!r}"


def _same_header(original: str, written: str) -> bool:
    """``written`` is ``original`` with generated code inserted (nothing of it removed)."""
    indent = original[:len(original) - len(original.lstrip())]
    words = original.split(maxsplit=1)
    if not words or not written.startswith(indent + words[0]) or "_ecrl" not in written:
        return False
    chars = iter(written)
    return all(c in chars for c in original)  # a subsequence: only insertions


@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot_is_current(name: str) -> None:
    case = CASES[name]
    expected = (case / SNAPSHOT).read_text()
    assert generated_for(case) == expected, (
        f"{name}/{SNAPSHOT} is stale: run `python tests/transform/snapshots.py --update`")


@pytest.mark.parametrize("name", sorted(CASES))
def test_untouched_lines_are_byte_identical(name: str) -> None:
    case = CASES[name]
    source = (case / "input.py").read_text()
    code = (case / SNAPSHOT).read_text()
    compile(code, f"{name}/{SNAPSHOT}", "exec")
    check_untouched(source, code)


def test_the_identity_check_can_fail() -> None:
    source = "x = 1  # keep me\nfor i in range(3):\n    x += i\n"
    with pytest.raises(AssertionError, match="missing or changed"):
        check_untouched(source, source.replace("# keep me", "# kept"))
    with pytest.raises(AssertionError, match="neither the user's nor ours"):
        check_untouched(source, source + "print(x)\n")


def test_update_rewrites_a_stale_snapshot(tmp_path: Path) -> None:
    case = tmp_path / "demo"
    case.mkdir()
    (case / "input.py").write_text(
        "from transform import _checkpoint\nfor i in range(3):\n    _checkpoint()\n")
    (case / SNAPSHOT).write_text("stale\n")
    assert main(["--corpus", str(tmp_path)]) == 1
    assert main(["--corpus", str(tmp_path), "--update"]) == 0
    assert main(["--corpus", str(tmp_path)]) == 0
    assert "_ecrl.loop(" in (case / SNAPSHOT).read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_strip_gives_back_the_original(name: str) -> None:
    case = CASES[name]
    assert strip((case / SNAPSHOT).read_text()) == (case / "input.py").read_text()


@given(programs(), st.booleans())
def test_generated_code_keeps_lines_and_strips_back(source: str, all_hints: bool) -> None:
    result = analyze(source, "gen.py")
    assert isinstance(result, AnalysisSuccess)
    code = generate(result, all_hints=all_hints).code
    compile(code, "gen.py", "exec")
    check_untouched(source, code)
    assert strip(code) == source
