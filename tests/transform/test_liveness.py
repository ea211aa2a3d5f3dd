"""Liveness: the fixture corpus (one program per construct) and a check against execution."""

from __future__ import annotations

import ast
import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transform.analysis import AnalysisSuccess, analyze

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "programs"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "expected-live.json").exists())


def test_corpus_is_not_empty() -> None:
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES)
def test_fixture_live_sets(case: str) -> None:
    source = (CORPUS / case / "input.py").read_text()
    expected = json.loads((CORPUS / case / "expected-live.json").read_text())
    result = analyze(source, f"{case}/input.py")
    assert isinstance(result, AnalysisSuccess), result
    assert {str(h): list(f.save) for h, f in result.live.items()} == expected["live"]
    assert {str(h): list(f.rebind) for h, f in result.live.items()} == expected["rebind"]


# ---------------------------------------------------------------- against execution

NAMES = ["a", "b", "c", "d"]


@st.composite
def statements(draw: st.DrawFn, depth: int = 0) -> list[str]:
    out: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["assign", "aug", "del", "hint", "if", "for", "tuple",
                                     "comp", "use"] if depth < 2 else
                                    ["assign", "aug", "del", "hint", "use"]))
        x, y, z = (draw(st.sampled_from(NAMES)) for _ in range(3))
        if kind == "assign":
            out.append(f"{x} = {y} + 1")
        elif kind == "aug":
            out.append(f"{x} += 1")
        elif kind == "del":
            out.append(f"del {x}")
        elif kind == "hint":
            out.append("_checkpoint()")
        elif kind == "tuple":
            out.append(f"{x}, {y} = {z}, 1")
        elif kind == "comp":
            out.append(f"{x} = [{y} + i for i in range(2)]")
        elif kind == "use":
            out.append(f"print({x})")
        else:
            body = draw(statements(depth + 1))
            head = f"if {x} > 1:" if kind == "if" else f"for {x} in range(2):"
            out.append(head)
            out.extend("    " + line for line in body)
    return out


class _Scope(dict[str, object]):
    """Module namespace that logs reads, writes and deletions of the program's names."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        super().__init__()
        self.log = log

    def __getitem__(self, key: str) -> object:
        if key in NAMES:
            self.log.append(("read", key))
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: object) -> None:
        if key in NAMES:
            self.log.append(("write", key))
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        if key in NAMES:
            self.log.append(("read", key))
            self.log.append(("del", key))
        super().__delitem__(key)


@given(statements())
def test_omitted_names_are_never_read_afterwards(lines: list[str]) -> None:
    lines = [f"{name} = {i}" for i, name in enumerate(NAMES)] + lines  # all bound at first
    hints = [i for i, line in enumerate(lines) if line.strip() == "_checkpoint()"]
    source = "\n".join(lines) + "\n"
    result = analyze(source, "gen.py")
    assert isinstance(result, AnalysisSuccess)
    by_line = {h.position.line: h.id for h in result.hints}
    log: list[tuple[str, str]] = []

    def _checkpoint() -> None:
        import sys

        log.append(("hint", str(sys._getframe(1).f_lineno)))

    scope = _Scope(log)
    glob = {"_checkpoint": _checkpoint, "print": lambda *a: None, "range": range,
            "__builtins__": {}}
    # The program may read an unbound name: what ran until then still counts.
    with contextlib.suppress(NameError, KeyError, TypeError, UnboundLocalError):
        exec(compile(source, "gen.py", "exec"), glob, scope)
    assert len(hints) == len(by_line)
    for k, (event, what) in enumerate(log):
        if event != "hint":
            continue
        live = set(result.live[by_line[int(what)]].save)
        written: set[str] = set()
        for later_event, name in log[k + 1:]:
            if later_event == "read" and name not in written:
                assert name in live or name not in scope_names_before(log, k), (
                    f"{name} read after hint at line {what} but omitted from {sorted(live)}")
            elif later_event in ("write", "del"):
                written.add(name)


def scope_names_before(log: list[tuple[str, str]], k: int) -> set[str]:
    """Names bound at log position ``k`` (a read of anything else fails at run time anyway)."""
    bound: set[str] = set()
    for event, name in log[:k]:
        if event == "write":
            bound.add(name)
        elif event == "del":
            bound.discard(name)
    return bound


# ---------------------------------------------------------------- saved detached

DETACH = """
import torch
from transform import _checkpoint

def log():
    print(GLOBAL_READ)

loss = torch.ones(1)
for step in range(4):
    _iterations: 4
    for micro in range(2):
        _iterations: 2
        loss = torch.ones(1, requires_grad=True) * 2
        loss.backward()
        _checkpoint()
    LATER
    _checkpoint()
"""


@pytest.mark.parametrize(("later", "global_read", "detached"), [
    ("print(loss.item())", "1", True),  # nanoGPT: the loss logged after its micro-steps
    ("x = float(loss) + int(loss) + bool(loss)", "1", True),
    ("x = loss.detach().tolist()", "1", True),
    ("loss.backward()", "1", False),  # needs the graph
    ("x = loss * 2", "1", False),  # arithmetic outside no_grad keeps the graph
    ("x = loss", "1", False),  # an alias could be back-propagated later
    ("print(loss)", "1", False),  # the repr shows grad_fn
    ("print(f'loss {loss:.4f}')", "1", True),  # formats as loss.item()
    ("print(f'loss {loss}')", "1", False),  # no spec: a tensor of any shape prints its repr
    ("print(f'loss {loss!r:>20}')", "1", False),
    ("w = 8; print(f'loss {loss:{w}}')", "1", False),  # a spec only known at run time
    # arithmetic under no_grad records no graph: a running average of the loss
    ("with torch.no_grad():\n        avg = 0.9 * avg + 0.1 * loss", "1", True),
    ("with torch.no_grad():\n        if loss > 3:\n            avg = -loss", "1", True),
    ("with torch.inference_mode():\n        avg = loss * 2", "1", True),
    ("with torch.enable_grad():\n        avg = loss * 2", "1", False),
    ("with torch.no_grad():\n        avg = loss", "1", False),  # an alias, even there
    ("with torch.no_grad():\n        f = lambda: loss * 2", "1", False),  # runs later
    ("with torch.no_grad():\n        pass\n    avg = loss * 2", "1", False),
    ("loss += 1", "1", False),  # the new value carries the old one's graph
    ("f = lambda: loss.item()", "1", False),  # a closure reads it when it likes
    ("log(); print(loss.item())", "loss", False),  # a function reads it behind the call
])
def test_a_tensor_only_read_without_its_graph_is_saved_detached(
        later: str, global_read: str, detached: bool) -> None:
    source = DETACH.replace("LATER", later).replace("GLOBAL_READ", global_read)
    result = analyze(source, "detach.py")
    assert isinstance(result, AnalysisSuccess), result
    for facts in result.live.values():  # the micro-step hint and the outer one
        assert "loss" in facts.save
        assert ("loss" in facts.detach) is detached, (later, facts)


# A function of the program's own that reads its argument without the graph: pytorch/examples'
# word language model carries its LSTM state as ``hidden = repackage_hidden(hidden)``.
FUNCTIONS = """
import torch
from transform import _checkpoint

def repackage(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage(v) for v in h)

def total(h):
    s = 0.0
    for v in h:
        s += v.item() + len(v)
    return s

def grad_flag(h):
    return h.requires_grad

def given_back(h):
    return h

def backward_in(h):
    h.backward()

def reassigned(h):
    h = h * 2
    return h.item()

def ping(h, n):
    return pong(h, n - 1) if n else h.detach()

def pong(h, n):
    return ping(h, n)

def ping_bad(h, n):
    return pong_bad(h, n - 1) if n else h.detach()

def pong_bad(h, n):
    keep.append(h)
    return ping_bad(h, n)

def collects(h):
    for v in h:
        keep.append(v)

@staticmethod
def decorated(h):
    return h.detach()

def rebound(h):
    return h.detach()

rebound = given_back
keep = []
loss = (torch.ones(1), torch.ones(1))
for step in range(4):
    _iterations: 4
    loss = (torch.ones(1, requires_grad=True) * 2, torch.ones(1, requires_grad=True) * 3)
    _checkpoint()
    LATER
"""


@pytest.mark.parametrize(("later", "detached"), [
    ("loss = repackage(loss)", True),  # the word language model's hidden state
    ("print(total(loss))", True),
    ("x = ping(loss, 3)", True),  # graph-free through mutual recursion
    ("x = grad_flag(loss)", False),  # requires_grad differs once detached
    ("x = given_back(loss)", False),  # the caller gets the graph back
    ("backward_in(loss)", False),
    ("x = reassigned(loss)", False),
    ("x = ping_bad(loss, 3)", False),  # one function of the cycle keeps it
    ("collects(loss)", False),  # its elements kept
    ("x = decorated(loss)", False),  # a decorator may return anything
    ("x = rebound(loss)", False),  # the name is bound to another function too
    ("x = repackage(h=loss)", False),  # by keyword: not followed
    ("x = repackage(*loss)", False),
    ("x = repackage(loss, loss.grad_fn)", False),
])
def test_a_tensor_passed_to_a_function_that_only_detaches_it_is_saved_detached(
        later: str, detached: bool) -> None:
    result = analyze(FUNCTIONS.replace("LATER", later), "functions.py")
    assert isinstance(result, AnalysisSuccess), result
    (facts,) = result.live.values()
    assert "loss" in facts.save
    assert ("loss" in facts.detach) is detached, (later, facts)


def test_a_local_that_shadows_a_graph_free_function_is_not_called() -> None:
    source = FUNCTIONS.replace("LATER", "pass").replace(
        "loss = (torch.ones(1), torch.ones(1))\n", "") + """
def main(repackage):
    hidden = (torch.ones(1, requires_grad=True) * 2,)
    for step in range(3):
        _iterations: 3
        _checkpoint()
        hidden = repackage(hidden)
"""
    result = analyze(source, "shadow.py")
    assert isinstance(result, AnalysisSuccess), result
    facts = [f for f in result.live.values() if "hidden" in f.save]
    assert facts and all("hidden" not in f.detach for f in facts)


def test_generator_functions_are_the_plain_ones_with_a_yield_of_their_own() -> None:
    from transform.cfg import generator_functions

    module = ast.parse("""
import contextlib

def batches(n):
    while True:
        yield n

def delegates():
    yield from batches(2)

def makes_one():
    def inner():
        yield 1
    return inner()  # a generator, but not from a yield of its own: not recognised

@contextlib.contextmanager
def opened():
    yield 1

def rebound():
    yield 1

rebound = list
lam = lambda: (yield)
""")
    assert generator_functions(module) == {"batches", "delegates"}


AMP_STEP = """
import contextlib
import torch
from transform import _checkpoint

model = torch.nn.Linear(2, 1)
loss = None
for step in range(4):
    _iterations: 4
    with CONTEXT:
        out = model(torch.ones(1, 2))
        loss = out.sum()
    loss.backward()
    _checkpoint()
"""


@pytest.mark.parametrize(("context", "live"), [
    ("torch.autocast('cpu', dtype=torch.bfloat16)", False),  # the AMP recipe
    ("torch.cuda.amp.autocast()", False),
    ("torch.no_grad()", False),
    ("open('log.txt', 'a') as log", False),
    ("contextlib.suppress(RuntimeError)", True),  # may leave the body with the old loss
    ("torch.autocast('cpu'), contextlib.suppress(RuntimeError)", True),
    ("make_context()", True),  # unknown: may swallow an exception
])
def test_a_with_body_that_cannot_be_left_half_way_assigns_for_sure(context: str,
                                                                   live: bool) -> None:
    """A name the body of ``with torch.autocast(…)`` assigns is dead before it: the block runs to
    its end or raises. Under a context manager that may swallow an exception it stays live, and
    the previous step's ``loss`` (its graph with it) would be saved at the hint."""
    result = analyze(AMP_STEP.replace("CONTEXT", context), "amp.py")
    assert isinstance(result, AnalysisSuccess), result
    (facts,) = result.live.values()
    assert ("loss" in facts.save) is live, facts
