"""A program's text as its file holds it: encoding (coding declaration or BOM) and line endings.

``Path.read_text`` would decode as UTF-8 and turn CRLF into LF, so a Windows-edited or Latin-1
program would come back with every line changed. The transformer reads the bytes, decodes them
with the encoding Python itself would use, keeps the line endings, and writes the generated
program back in the same encoding and, where the source ends every line with CRLF, with CRLF on
the generated lines too. Untouched lines are then byte-identical.
"""

from __future__ import annotations

import codecs
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SourceText", "decode_source", "read_source"]


@dataclass(frozen=True, slots=True)
class SourceText:
    text: str
    """The decoded text, line endings as in the file."""
    encoding: str
    """The codec Python uses for the file (``utf-8-sig`` when it starts with a BOM)."""

    @property
    def crlf(self) -> bool:
        """Every line ends with CRLF (a file mixing endings keeps its own, generated lines LF)."""
        lf = self.text.count("\n")
        return lf > 0 and self.text.count("\r\n") == lf

    def encode(self, code: str) -> bytes:
        """``code`` (the generated program) in this file's encoding and line endings."""
        if self.crlf:
            code = code.replace("\r\n", "\n").replace("\n", "\r\n")
        return code.encode(self.encoding)


def decode_source(data: bytes) -> SourceText:
    """Decode as Python would (PEP 263 declaration, BOM, else UTF-8), keeping line endings.

    Raises :class:`SyntaxError` for an unknown or contradictory declaration and
    :class:`UnicodeDecodeError` for bytes the encoding cannot decode.
    """
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    # detect_encoding names the BOM case "utf-8-sig"; decoding with it drops the BOM, encoding
    # with it writes the BOM back.
    return SourceText(codecs.decode(data, encoding), encoding)


def read_source(path: str | Path) -> SourceText:
    return decode_source(Path(path).read_bytes())
