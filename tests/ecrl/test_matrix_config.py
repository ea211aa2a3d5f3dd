"""`ecrl matrix` config: shipped configs, variants from the runtime, one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ecrl.apps.cli import main
from ecrl.apps.matrix import REFERENCE, load_matrix, resolve_config, shipped_config
from ecrl.contract.errors import ConfigError
from ecrl.runtime import runconfig

VALID = """\
[matrix]
seeds = 1

[run]
steps = 40
global-batch = 8
world-sizes = [2]
ckpt-every = 4

[datasets.fake]
dataset-size = 128

[models.tiny]
model = "tiny-cnn"

[models.big]
model = "resnet18"

[schedules.one]
fail-at = [9, 30]
"""

@pytest.fixture(autouse=True)
def _two_strategies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expected tables below were written for blocking and overlapped; a strategy the runtime
    gains later must not change them (test_variants_follow_the_runtimes_strategy_list checks that
    new strategies do appear)."""
    from ecrl.runtime import runconfig

    monkeypatch.setattr(runconfig, "BUILT_STRATEGIES", ("none", "blocking", "overlapped"))



def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def test_a_valid_config_gives_suites_and_units(tmp_path: Path) -> None:
    config = load_matrix(_write(tmp_path, VALID))
    assert [s.name for s in config.suites()] == ["fake-tiny-one", "fake-big-one"]
    assert config.variants == (REFERENCE, "blocking", "overlapped")
    units = config.units()
    assert [u.uid for u in units] == [
        "fake-tiny/reference-seed0", "fake-tiny-one/blocking-seed0",
        "fake-tiny-one/overlapped-seed0", "fake-big/reference-seed0",
        "fake-big-one/blocking-seed0", "fake-big-one/overlapped-seed0"]
    reference, blocking = units[0], units[1]
    assert reference.settings.get("fail_at") is None and reference.strategy == "none"
    assert blocking.settings["fail_at"] == [9, 30] and blocking.reference == reference.uid
    # constant global batch within a suite: every variant runs the same run settings
    keys = ("global_batch", "steps", "world_sizes", "model", "seed")
    assert {tuple(str(u.settings[k]) for k in keys) for u in units[:3]} == {
        ("8", "40", "[2]", "tiny-cnn", "0")}


def test_seeds_repeat_every_unit_and_change_the_digest(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    one, three = load_matrix(path), load_matrix(path, seeds=3)
    assert three.seeds == (0, 1, 2) and len(three.units()) == 3 * len(one.units())
    assert one.digest() != three.digest() and one.digest() == load_matrix(path).digest()


def test_variants_follow_the_runtimes_strategy_list(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runconfig, "BUILT_STRATEGIES", (*runconfig.BUILT_STRATEGIES, "sharded"))
    config = load_matrix(_write(tmp_path, VALID))
    assert config.variants == (REFERENCE, "blocking", "overlapped", "sharded")


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_shipped_configs_are_valid_and_found_by_name(name: str) -> None:
    path = shipped_config(name)
    assert path.name == f"matrix-{name}.toml" and path.exists()
    assert resolve_config(name) == path == resolve_config(f"matrix-{name}.toml")
    config = load_matrix(path)
    assert len(config.suites()) == 8
    assert {s.name for s in config.schedules} == {"base", "late"}
    assert set(config.strategies) == {"blocking", "overlapped"}
    steps = config.run["steps"]
    scale = steps / 1600  # the seed's (400, 1200) and (800, 1400) of a 1600-step run
    assert {tuple(s.settings["fail_at"]) for s in config.schedules} == {
        (round(400 * scale), round(1200 * scale)), (round(800 * scale), round(1400 * scale))}
    kinds = {d.settings["dataset"] for d in config.datasets}
    assert kinds == ({"fake", "cifar10"} if name == "cpu" else {"cifar10", "cifar100"})
    assert {m.settings["model"] for m in config.models} == (
        {"tiny-cnn", "resnet18"} if name == "cpu" else {"resnet18", "resnet50"})


ERRORS = [
    # (change to VALID, the line the error must point at, words the message must hold)
    (('model = "resnet18"', 'model = "resnet-18"'), 17, ["[models.big] model",
                                                        "'resnet-18'", "resnet18"]),
    (("fail-at = [9, 30]", "fail-at = [9, 40]"), 20, ["[schedules.one] fail-at", "step 40",
                                                      "0..39"]),
    (("global-batch = 8", "global-batch = 9"), 6, ["[run] global-batch", "9", "world size 2"]),
    (("[models.big]\n", "[models.big]\nglobal-batch = 6\nworld-sizes = [4]\n"), 17,
     ["[models.big] global-batch", "6", "world size 4"]),
    (("dataset-size = 128", "datset-size = 128"), 11, ["[datasets.fake] datset-size",
                                                       "unknown key; did you mean dataset-size?"]),
    (("steps = 40", "stepz = 40"), 5, ["[run] stepz", "unknown key"]),
    (("seeds = 1", "seedz = 1"), 2, ["[matrix] seedz", "unknown key"]),
    (("[matrix]", "[matrx]"), 1, ["[matrx]", "unknown table"]),
    (("seeds = 1", 'strategies = ["jit"]'), 2, ["[matrix] strategies", "'jit'",
                                                "not built yet"]),
    (("seeds = 1", 'strategies = ["fast"]'), 2, ["[matrix] strategies", "'fast'", "unknown"]),
    (("seeds = 1", 'reference = "quick"'), 2, ["[matrix] reference", "'quick'"]),
    (("ckpt-every = 4", 'strategy = "blocking"'), 8, ["[run] strategy", "set by the matrix"]),
    (("model = \"tiny-cnn\"", "model = \"tiny-cnn\"\nfail-at = [3]"), 15,
     ["[models.tiny] fail-at", "schedules"]),
    (("fail-at = [9, 30]", "fail-at = [9, 9]"), 20, ["[schedules.one] fail-at", "distinct"]),
    (("fail-at = [9, 30]", "fail-at = []"), 20, ["[schedules.one] fail-at", "empty"]),
    (("[schedules.one]\nfail-at = [9, 30]\n", ""), None, ["[schedules]", "at least one"]),
    (("dataset-size = 128", 'dataset = "cifar10"'), 10, ["[datasets.fake]", "data-dir",
                                                         "generate"]),
    (("dataset-size = 128", "dataset-size = 128\ngenerate = 10"), 12,
     ["[datasets.fake] generate", "cifar10"]),
    (("ckpt-every = 4", "ckpt-every = -1"), 8, ["[run] ckpt-every", "-1"]),
    (("world-sizes = [2]", "world-sizes = [2]\nlr = 0"), 8, ["[run] lr", "positive"]),
]


@pytest.mark.parametrize(("change", "line", "words"), ERRORS,
                         ids=[e[0][1].split("\n")[-1][:24] for e in ERRORS])
def test_config_errors_are_one_line_naming_file_line_and_key(
        tmp_path: Path, change: tuple[str, str], line: int | None, words: list[str]) -> None:
    old, new = change
    assert old in VALID
    path = _write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    message = str(info.value)
    assert "\n" not in message
    expected_where = f"{path}:{line}: " if line is not None else f"{path}"
    assert message.startswith(expected_where), message
    for word in words:
        assert word in message, (word, message)


def test_the_cli_refuses_a_bad_config_before_writing_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, VALID.replace('model = "resnet18"', 'model = "vgg"'))
    out = tmp_path / "results"
    assert main(["matrix", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.match(rf"ecrl matrix: error: {re.escape(str(path))}:17: \[models.big\] model", err)
    assert not out.exists()


def test_an_unknown_config_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "tpu"]) == 2
    err = capsys.readouterr().err
    assert "'tpu' is neither a file nor a shipped matrix config (cpu, gpu)" in err
    assert len(err.strip().splitlines()) == 1


def test_the_cli_surface_of_matrix_and_advise(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flags in ((["matrix", "--help"], ["CONFIG", "--out", "--seeds"]),
                        (["advise", "--help"], ["--from-run", "--from-matrix", "--ckpt-cost"])):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        text = capsys.readouterr().out
        for flag in flags:
            assert flag in text, (argv, flag)


def test_a_shipped_name_wins_over_a_folder_of_that_name(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: `ecrl matrix cpu --out cpu`, rerun from the same folder, read the folder.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu").mkdir()
    assert resolve_config("cpu") == shipped_config("cpu")
    (tmp_path / "mine.toml").write_text(VALID)
    assert resolve_config("mine.toml") == Path("mine.toml")
    assert resolve_config("other.toml") == Path("other.toml")  # load_matrix says: no such file


def test_the_config_shown_in_the_docs_is_valid(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "experiments.md"
    block = docs.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    config = load_matrix(_write(tmp_path, block))
    assert [s.name for s in config.suites()] == ["fake-resnet18-base", "cifar10-mini-resnet18-base"]
    assert config.units()[0].settings["global_batch"] == 16  # the model's override wins


def test_the_matrix_driver_never_imports_torch() -> None:
    # ecrl matrix only launches `ecrl run` processes: it starts fast and stays small.
    import subprocess
    import sys

    code = ("import sys, ecrl.apps.matrix, ecrl.apps.matrix._runner, ecrl.apps.matrix._advice; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_a_data_dir_without_the_data_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    path = _write(tmp_path, VALID.replace("dataset-size = 128",
                                          'dataset = "cifar10"\ndata-dir = "empty"'))
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    message = str(info.value)
    assert message.startswith(f"{path}:12: [datasets.fake] data-dir: {tmp_path / 'empty'}")
    assert "cifar-10-batches-py" in message and "\n" not in message


def _matrix_fifo(directory: Path) -> Path:
    import os

    os.mkfifo(directory / "pipe.toml")
    return directory / "pipe.toml"


def _matrix_binary(directory: Path) -> Path:
    (directory / "bin.toml").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    return directory / "bin.toml"


def _matrix_dir(directory: Path) -> Path:
    (directory / "dir.toml").mkdir()
    return directory / "dir.toml"


@pytest.mark.parametrize(("make", "why"), [
    (_matrix_fifo, "is not a regular file"),
    (_matrix_binary, "is not text"),
    (_matrix_dir, "is a directory"),
])
def test_a_matrix_config_that_is_not_a_toml_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, why: str) -> None:
    # The reader of ecrl run --config: a binary file printed a traceback, a FIFO blocked for good.
    import threading

    config = make(tmp_path)  # type: ignore[operator]
    out = tmp_path / "out"
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(
        main(["matrix", str(config), "--out", str(out)])), daemon=True)
    worker.start()
    worker.join(30)  # the test's timeout: a reader that blocks on the FIFO fails here
    assert codes == [2], codes or "ecrl matrix blocked on its config"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ecrl matrix: error: {config}: {why}"), err
    assert not out.exists()
