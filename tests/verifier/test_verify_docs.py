"""docs/anomalies.md stays true: a section per kind, examples equal to what ecrl-verify prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from verifier import KINDS, render_text, verify

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "anomalies.md").read_text()
BLOCKS = re.findall(r"```text\n\$ ecrl-verify (\S+(?: --same-order \S+)?)\n(.*?)```", DOC,
                    re.S)


def test_every_kind_has_a_section() -> None:
    sections = re.findall(r"^## `(\w+)`$", DOC, re.M)
    assert sections == list(KINDS)


@pytest.mark.parametrize(("path", "shown"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_examples_are_real_output(path: str, shown: str, monkeypatch: pytest.MonkeyPatch
                                  ) -> None:
    monkeypatch.chdir(ROOT)
    run, _, other = path.partition(" --same-order ")
    text = render_text(verify(run, same_order=other or None))
    head = text.split("\n  metrics:")[0]
    assert shown.rstrip("\n") == head


def test_examples_cover_every_kind() -> None:
    shown = {k for _, block in BLOCKS for k in re.findall(r"✗ (\w+):", block)}
    assert shown == set(KINDS)
