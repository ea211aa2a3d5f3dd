"""A program's bytes survive the transform: encoding declaration, BOM, CRLF line endings and a
missing final newline, byte for byte on every line the transform does not touch; the written
program runs, and resumes after a kill, in its own encoding (issue 30.6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import killresume as kr
import pytest

from transform.cli import main as transform
from transform.sourcetext import decode_source

# Latin-1 bytes (é is 0xE9) in a docstring, a comment and a string; CRLF on every line; no newline
# after the last one. A closure of the program's own is live at the checkpoint: its code is found
# by compiling the program's file, which must honour the declaration too.
LATIN1_CRLF = (
    b"# -*- coding: latin-1 -*-\r\n"
    b'"""Caf\xe9: a r\xe9sum\xe9 test."""\r\n'
    b"from transform import _checkpoint\r\n"
    b"\r\n"
    b"\r\n"
    b"def scale(k):\r\n"
    b"    return lambda v: v * k  # \xe9\r\n"
    b"\r\n"
    b"\r\n"
    b"double = scale(2)\r\n"
    b"total = 0\r\n"
    b"for i in range(12):  # _iterations: 12\r\n"
    b"    total += double(i)\r\n"
    b"    _checkpoint()\r\n"
    b'print(total, "caf\xe9")')


def _transform(tmp_path: Path, data: bytes, *args: str) -> bytes:
    (tmp_path / "in.py").write_bytes(data)
    assert transform([str(tmp_path / "in.py"), "-o", str(tmp_path / "out.py"), "--all-hints",
                      *args]) == 0
    return (tmp_path / "out.py").read_bytes()


def _run(program: Path, ckpt: Path,
         kill_at: str | None = None) -> subprocess.CompletedProcess[bytes]:
    env = kr.environment(ckpt)
    if kill_at is not None:
        env["ECRL_TRANSFORM_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, str(program)], env=env, capture_output=True,
                          timeout=60, check=False)


def test_latin1_crlf_program_keeps_its_bytes_and_resumes_after_a_kill(tmp_path: Path) -> None:
    out = _transform(tmp_path, LATIN1_CRLF)
    lines = out.split(b"\r\n")
    assert b"\n" not in out.replace(b"\r\n", b""), "a generated line ends with LF in a CRLF file"
    assert not out.endswith(b"\n"), "the source has no final newline"
    assert lines[0] == b"# -*- coding: latin-1 -*-"
    touched = {b"for i in range(12):  # _iterations: 12"}  # the loop the resume walks back into
    for line in LATIN1_CRLF.split(b"\r\n"):
        if line not in touched:
            assert line in lines, f"source line changed: {line!r}"

    original = _run(tmp_path / "in.py", tmp_path / "unused")
    assert original.returncode == 0, original.stderr
    killed = _run(tmp_path / "out.py", tmp_path / "ckpt", kill_at="5")
    assert killed.returncode == -9, killed.stderr
    resumed = _run(tmp_path / "out.py", tmp_path / "ckpt")
    assert resumed.returncode == 0, resumed.stderr.decode(errors="replace")
    assert resumed.stdout == original.stdout == "132 café\n".encode()
    assert not (tmp_path / "ckpt").exists()


def test_check_stdout_and_in_place_agree_byte_for_byte(tmp_path: Path,
                                                       capsysbinary: pytest.CaptureFixture[bytes]
                                                       ) -> None:
    written = _transform(tmp_path, LATIN1_CRLF)
    assert transform([str(tmp_path / "in.py"), "--check", "-o", str(tmp_path / "out.py"),
                      "--all-hints"]) == 0
    capsysbinary.readouterr()
    assert transform([str(tmp_path / "in.py"), "--all-hints"]) == 0
    assert capsysbinary.readouterr().out == written
    (tmp_path / "out.py").write_bytes(written.replace(b"\r\n", b"\n"))  # same text, LF
    assert transform([str(tmp_path / "in.py"), "--check", "-o", str(tmp_path / "out.py"),
                      "--all-hints"]) == 1
    assert transform([str(tmp_path / "in.py"), "--in-place", "--all-hints"]) == 0
    assert (tmp_path / "in.py").read_bytes() == written


def test_bom_and_mixed_line_endings_are_kept(tmp_path: Path) -> None:
    bom = _transform(tmp_path, b"\xef\xbb\xbffrom transform import _checkpoint\n"
                               b"x = 'na\xc3\xafve'\n"
                               b"for i in range(3):  # _iterations: 3\n"
                               b"    _checkpoint()\n"
                               b"print(x)\n")
    assert bom.startswith(b"\xef\xbb\xbf") and b"\r" not in bom and bom.endswith(b"print(x)\n")
    assert b"x = 'na\xc3\xafve'\n" in bom
    # A file that mixes endings: each source line keeps its own, generated lines are LF.
    mixed = _transform(tmp_path, b"from transform import _checkpoint\r\n"
                                 b"x = 1\n"
                                 b"y = 2\r\n"
                                 b"for i in range(3):  # _iterations: 3\n"
                                 b"    x += i\r\n"
                                 b"    _checkpoint()\n"
                                 b"print(x, y)\r\n")
    assert b"\ny = 2\r\n" in mixed and b"\n    x += i\r\n" in mixed
    assert mixed.endswith(b"print(x, y)\r\n")


def test_an_unknown_encoding_declaration_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.py").write_bytes(b"# -*- coding: no-such-codec -*-\nx = 1\n")
    assert transform([str(tmp_path / "in.py"), "-o", str(tmp_path / "out.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot read" in err and "no-such-codec" in err
    assert not (tmp_path / "out.py").exists()


def test_decode_source_reports_what_it_kept() -> None:
    text = decode_source(LATIN1_CRLF)
    assert text.encoding == "iso-8859-1" and text.crlf and "café" in text.text
    assert text.encode(text.text) == LATIN1_CRLF
    assert not decode_source(b"a = 1\r\nb = 2\n").crlf
