"""The folders show the layers (ARCHITECTURE.md): each layer imports only the layers below it.

``ecrl.contract`` (torch-free) < ``ecrl.runtime`` < ``ecrl.apps``; ``verifier`` and ``transform``
build on the contract alone, and only ``ecrl.apps`` may import them.

Inside the runtime the rooms are layered too: the modules at its top (the settings and what a
rank and its supervisor share) < ``sampling`` < ``checkpoint`` < ``supervision`` < ``trainer``.
A file is judged by the most specific folder listed for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_RUNTIME_SHARED = ("ecrl.contract", "ecrl", "ecrl.runtime._attempt", "ecrl.runtime._proc",
                   "ecrl.runtime.deadlinetime",
                   "ecrl.runtime.endings", "ecrl.runtime.failure", "ecrl.runtime.launchenv",
                   "ecrl.runtime.manifest", "ecrl.runtime.meshplan", "ecrl.runtime.runlock",
                   "ecrl.runtime.runconfig", "ecrl.runtime.settings")
ALLOWED = {
    "ecrl/contract": ("ecrl.contract",),
    # The settings validate strategy names against the checkpoint registry (torch-free), which
    # plugins may extend at run time.
    "ecrl/runtime": (*_RUNTIME_SHARED, "ecrl.runtime.checkpoint.registry"),
    "ecrl/runtime/sampling": (*_RUNTIME_SHARED, "ecrl.runtime.sampling"),
    "ecrl/runtime/checkpoint": (*_RUNTIME_SHARED, "ecrl.runtime.sampling",
                                "ecrl.runtime.checkpoint"),
    # The supervisor reads the commit protocol's pointer, checks a data directory the way the
    # trainer will read it, and starts the trainer's torchrun (its agent) and finds its ranks.
    "ecrl/runtime/supervision": (*_RUNTIME_SHARED, "ecrl.runtime.checkpoint",
                                 "ecrl.runtime.supervision", "ecrl.runtime.trainer.datasets",
                                 "ecrl.runtime.trainer.agent"),
    "ecrl/runtime/trainer": (*_RUNTIME_SHARED, "ecrl.runtime"),
    # A framework's hooks drive the step log and record the framework's checkpoints.
    "ecrl/runtime/integrations": (*_RUNTIME_SHARED, "ecrl.runtime.sampling",
                                  "ecrl.runtime.integrations"),
    # The public path of the integrations (docs/library.md): a re-export, nothing more.
    "ecrl/integrations": ("ecrl.runtime.integrations",),
    "verifier": ("ecrl.contract", "ecrl", "verifier"),
    "transform": ("ecrl.contract", "ecrl", "transform"),
}
OURS = ("ecrl", "verifier", "transform")


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "ecrl":  # `from ecrl import x` names a module or a public name
                out += [(node.lineno, f"ecrl.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def _owner(path: Path) -> str:
    """The most specific folder of ALLOWED that holds ``path``."""
    rel = path.relative_to(ROOT).as_posix()
    return max((f for f in ALLOWED if rel.startswith(f + "/")), key=len)


def _violations(folder: str) -> list[str]:
    allowed = ALLOWED[folder]
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if _owner(path) != folder:
            continue
        for line, name in _imports(path):
            if name.split(".")[0] not in OURS:
                continue
            if name == "ecrl" or any(
                    name == a or name.startswith(a + ".") for a in allowed if a != "ecrl"):
                continue
            if "ecrl" in allowed and name.count(".") == 1 and name.startswith("ecrl.") and \
                    name.split(".")[1] in {"__version__", "ConfigError", "EcrlError",
                                           "RunFormatError", "SemanticsError"}:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_layer_imports_only_what_lies_below(folder: str) -> None:
    assert _violations(folder) == []


def test_the_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from ecrl.apps.cli import main\nimport verifier\n")
    assert [name for _, name in _imports(bad)] == ["ecrl.apps.cli", "verifier"]
    assert not any(n.startswith(a) for _, n in _imports(bad) for a in ALLOWED["ecrl/contract"])


def test_every_runtime_room_is_listed() -> None:
    rooms = {f"ecrl/runtime/{p.name}" for p in (ROOT / "ecrl/runtime").iterdir()
             if (p / "__init__.py").is_file()}
    assert rooms and rooms <= set(ALLOWED)
