"""The verifier's modules import each other without a cycle: results are data below the layers
that judge and render them (STYLE.md), so no module needs one above it, not even lazily inside a
function. Imports under ``if TYPE_CHECKING:`` are annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import verifier

PACKAGE = Path(verifier.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The verifier modules ``path`` imports anywhere (top level or in a function)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for node in ast.walk(block)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from verifier import goodput` imports the module verifier.goodput; the package's
            # own names (`from verifier import verify`) mean the package.
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
    return found & modules


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_no_import_cycle_among_verifier_modules() -> None:
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    assert "verifier.explain" in graph["verifier.report"]  # the walk sees imports at all
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
