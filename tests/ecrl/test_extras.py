"""A missing optional dependency is one line naming its extra (ecrl/contract/extras.py).

Here torch and matplotlib are installed, so their absence is simulated; tests/test_packaging.py
checks the same in an environment that truly lacks them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

import ecrl
from ecrl.apps.cli import main as ecrl_main
from ecrl.contract import extras
from ecrl.contract.errors import EcrlError
from ecrl.contract.extras import MissingExtraError, missing, require
from verifier.cli import main as verify_main

RUN = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "pass-single-attempt"


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Make ``find_spec`` report a module as absent (everything else as it is)."""
    real = importlib.util.find_spec

    def hide(name: str) -> None:
        monkeypatch.setattr(extras.importlib.util, "find_spec",
                            lambda module, *a: None if module == name else real(module, *a))

    return hide


def test_present_modules_pass() -> None:
    assert missing("torch") is None
    require("matplotlib", what="anything")


def test_missing_module_names_its_extra(without: Callable[[str], None]) -> None:
    without("torch")
    assert missing("torch") == "PyTorch is not installed: pip install 'ecrl[train]'"
    with pytest.raises(MissingExtraError) as caught:
        require("torch", what="ecrl.StepLog")
    assert str(caught.value) == ("ecrl.StepLog needs PyTorch, which is not installed: "
                                 "pip install 'ecrl[train]'")
    assert isinstance(caught.value, EcrlError) and isinstance(caught.value, ImportError)
    assert caught.value.name == "torch"


def test_library_names_refuse_without_torch(without: Callable[[str], None]) -> None:
    without("torch")
    # Call the module's __getattr__ itself: another test may have cached the real name.
    with pytest.raises(ImportError, match=r"ecrl\.Checkpointer needs PyTorch.*ecrl\[train\]"):
        ecrl.__getattr__("Checkpointer")
    with pytest.raises(AttributeError):
        ecrl.__getattr__("NoSuchName")


@pytest.mark.parametrize("argv", [
    ["run", "--steps", "2", "--out", "OUT"], ["launch", "--out", "OUT", "--", "python", "x.py"],
    ["demo", "--out", "OUT"], ["faults", "--out", "OUT"], ["matrix", "cpu", "--out", "OUT"],
    ["bench", "checkpoint"],
])
def test_torch_commands_refuse_before_any_work(argv: list[str], tmp_path: Path,
                                               without: Callable[[str], None],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    without("torch")
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert ecrl_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("PyTorch is not installed: pip install "
                                             "'ecrl[train]'"), err
    assert not (tmp_path / "out").exists()


def test_matrix_refuses_without_matplotlib(without: Callable[[str], None], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    without("matplotlib")
    assert ecrl_main(["matrix", "cpu", "--out", str(tmp_path / "m")]) == 2
    assert "pip install 'ecrl[plots]'" in capsys.readouterr().err


def test_verify_report_refuses_without_matplotlib(without: Callable[[str], None],
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    without("matplotlib")
    assert verify_main([str(RUN), "--report", str(tmp_path / "rep")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not (tmp_path / "rep").exists()
    assert captured.err == ("ecrl-verify: error: --report needs matplotlib, which is not "
                            "installed: pip install 'ecrl[plots]'\n")
    # Without --report matplotlib is not needed.
    assert verify_main([str(RUN), "--format", "json"]) == 0
