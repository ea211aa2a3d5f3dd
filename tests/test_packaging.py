"""``pip install ecrl`` without torch: the verifier and the transformer work, the rest says why not.

One fresh virtual environment per test session gets a plain ``pip install`` of a copy of the
project (its base dependencies resolved from pyproject.toml, no extra). In it: no torch and no
matplotlib got installed; ``ecrl-verify`` on every fixture run and ``ecrl-transform`` on every
fixture program give exactly what the development environment gives (one process in each, see
``bare_install_jobs.py``); and the torch-backed commands and names refuse with one line naming the
extra that installs what they need.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from bare_install_jobs import run_jobs

from ecrl.contract.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]


def _load_snapshots() -> Any:
    """tests/transform/snapshots.py, the transform fixtures' own pin (a test helper, no package)."""
    spec = importlib.util.spec_from_file_location("snapshots",
                                                  ROOT / "tests" / "transform" / "snapshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_snapshots = _load_snapshots()
SNAPSHOT, arguments, cases = _snapshots.SNAPSHOT, _snapshots.arguments, _snapshots.cases
RUNS = ROOT / "fixtures" / "runs"
PROJECT = ("pyproject.toml", "setup.py", "README.md", "ecrl", "verifier", "transform")
"""What ``pip install`` reads: copied, so that the build leaves nothing in the source tree."""
EXIT = {"PASS": 0, "FAIL": 1, "UNKNOWN": 2}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def _bare_env() -> dict[str, str]:
    # The tests run with PYTHONPATH at the source tree; the bare environment must not see it.
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _build(folder: Path) -> Path:
    src = folder / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in PROJECT:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", "build", "*.so"))  # the install builds its own
        else:
            shutil.copy2(ROOT / name, src / name)
    venv = folder / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_bare_env())
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", str(src)],
                          capture_output=True, text=True, env=_bare_env(), cwd=folder)
    if done.returncode != 0:
        pytest.fail(f"pip install of the project failed:\n{done.stdout}\n{done.stderr}")
    return venv / "bin"


@pytest.fixture(scope="session")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of an environment holding ``pip install ecrl`` and nothing more.

    Built once per session: under pytest-xdist the workers share one folder and a lock, so the
    first to ask builds it and the others wait for it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / "bare-install"
    folder.mkdir(exist_ok=True)
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "ready").exists():
            _build(folder)
            (folder / "ready").touch()
    return folder / "venv" / "bin"


def _run(bin_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True,
                          env=_bare_env(), cwd=cwd, timeout=120)


def test_base_install_has_no_torch(bare: Path, tmp_path: Path) -> None:
    listed = _run(bare, "python", "-m", "pip", "list", "--format", "json", cwd=tmp_path)
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "ecrl" in installed
    assert not installed & {"torch", "torchvision", "matplotlib"}
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {_name(d) for d in base} <= installed


def test_base_install_builds_the_compiled_kernels(bare: Path, tmp_path: Path) -> None:
    """setup.py's optional kernels are built by a plain ``pip install`` where a C compiler is
    (this machine, CI): the verifier users install runs the compiled fast path."""
    code = ("import ecrl.contract.semantics as s, verifier._scan as v\n"
            "print(s.native.__name__, v.native.__name__, v.native.__file__)")
    done = _run(bare, "python", "-I", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    semantics_kernel, scan_kernel, where = done.stdout.split()
    assert (semantics_kernel, scan_kernel) == ("ecrl.contract._native", "verifier._native")
    assert Path(where).is_relative_to(bare.parent), where


def _jobs(out: Path) -> list[dict[str, object]]:
    jobs: list[dict[str, object]] = []
    for case in sorted(p for p in RUNS.iterdir() if (p / "expected.json").is_file()):
        other = json.loads((case / "expected.json").read_text()).get("same_order")
        argv = [str(case), "--format", "json"]
        if other:
            argv += ["--same-order", str(RUNS / other)]
        jobs.append({"tool": "verify", "argv": argv, "output": None, "case": case.name})
    for case in cases():
        written = out / f"{case.name}.py"
        jobs.append({"tool": "transform", "output": str(written), "case": case.name,
                     "argv": [str(case / "input.py"), "-o", str(written), *arguments(case)]})
    return jobs


def test_verify_and_transform_match_the_full_install(bare: Path, tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    shutil.copy2(Path(__file__).with_name("bare_install_jobs.py"), tmp_path / "jobs.py")
    # -I: neither PYTHONPATH nor the script's folder, so the jobs load the installed ecrl.
    done = _run(bare, "python", "-I", "jobs.py", "jobs.json", "results.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / "results.json").read_text())
    assert not got["torch_imported"]
    assert Path(got["verifier_file"]).is_relative_to(bare.parent), got["verifier_file"]

    full = run_jobs(jobs)["results"]
    assert len(got["results"]) == len(full) == len(jobs)
    for job, bare_result, full_result in zip(jobs, got["results"], full, strict=True):
        where = f"{job['tool']} {job['case']}"
        assert bare_result == full_result, where
        if job["tool"] == "verify":
            expected = json.loads((RUNS / str(job["case"]) / "expected.json").read_text())
            assert bare_result["status"] == EXIT[expected["verdict"]], where
            assert json.loads(bare_result["stdout"])["verdict"] == expected["verdict"], where
        else:
            snapshot = ROOT / "fixtures" / "programs" / str(job["case"]) / SNAPSHOT
            assert bare_result["status"] == 0, where
            assert bare_result["written"] == snapshot.read_text(encoding="utf-8"), where


def _one_line(done: subprocess.CompletedProcess[str], extra: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"pip install 'ecrl[{extra}]'" in lines[0], lines[0]
    return lines[0]


def test_torch_commands_refuse_in_one_line(bare: Path, tmp_path: Path) -> None:
    helped = _run(bare, "ecrl", "run", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "usage: ecrl run" in helped.stdout, helped.stderr
    line = _one_line(_run(bare, "ecrl", "run", "--steps", "2", "--out", "r", cwd=tmp_path),
                     "train")
    assert line == "ecrl run: error: PyTorch is not installed: pip install 'ecrl[train]'"
    _one_line(_run(bare, "ecrl", "launch", "--out", "l", "--", "python", "x.py", cwd=tmp_path),
              "train")
    _one_line(_run(bare, "ecrl", "demo", "--out", "d", cwd=tmp_path), "train")
    _one_line(_run(bare, "ecrl", "bench", "sampler", "--quick", cwd=tmp_path), "train")
    report = _run(bare, "ecrl-verify", str(RUNS / "pass-single-attempt"), "--report", "rep",
                  cwd=tmp_path)
    assert _one_line(report, "plots").endswith(
        "--report needs matplotlib, which is not installed: pip install 'ecrl[plots]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "refused, yet something was made"
    assert _run(bare, "ecrl", "selfcheck", cwd=tmp_path).returncode == 0

    code = ("import ecrl\n"
            "try:\n    ecrl.Checkpointer\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    done = _run(bare, "python", "-c", code, cwd=tmp_path)
    assert done.stdout.strip() == ("MissingExtraError ecrl.Checkpointer needs PyTorch, which is "
                                   "not installed: pip install 'ecrl[train]'"), done.stderr


def test_extras_table_matches_pyproject() -> None:
    # EXTRAS names the extra each optional module comes with; pyproject must agree.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for module, (_, extra) in EXTRAS.items():
        assert module in {_name(r) for r in optional[extra]}, (module, extra)
        assert module not in {_name(r) for r in project["dependencies"]}, module
    assert "ecrl[plots]" in optional["train"] and "ecrl[train]" in optional["dev"]
