"""Hypothesis strategies for whole training-like programs with hints at varied depths.

Each program runs a step loop (``time.sleep`` per step stands for real work, so a program lasts
about a second without keeping the CPU busy) whose body is generated: nested ``for``/``while``
loops (``while True`` … ``break`` too, and ``continue``), ``if``/``else`` on random draws,
``with``, ``try``/``except``, ``match``, augmented
assignments, tuple unpacking, lists and dicts mutated in place, draws from ``random``, NumPy's
global state and a NumPy Generator, and ``_checkpoint()`` hints. The last line prints everything,
including the next random draws, so a resume that restored any state wrongly shows.
"""

from __future__ import annotations

from hypothesis import strategies as st

SIMPLE = [
    "a += {k}",
    "b = (a * {k} + b) % 1000003",
    "items.append(a % 97)",
    "table['{key}'] = table.get('{key}', 0) + a % 7",
    "a += random.randint(0, 9)",
    "b ^= int(np.random.randint(0, 100))",
    "a += int(gen.integers(0, 50))",
    "x, (y, z) = b, divmod(a, 5)\na, b = (x + z) % 10007, (y + b) % 10007",
    "if items: items[-1] = (items[-1] + b) % 101",
    "table.setdefault('n', []).append(len(items) % 5)",
]


@st.composite
def _block(draw: st.DrawFn, depth: int, loop: int) -> list[str]:
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["simple", "simple", "hint"]
        if depth < 3:
            kinds += ["if", "for", "while", "with", "try", "match", "while-true"]
        if loop:
            kinds.append("continue")
        kind = draw(st.sampled_from(kinds))
        if kind == "simple":
            text = draw(st.sampled_from(SIMPLE)).format(k=draw(st.integers(1, 9)),
                                                        key=draw(st.sampled_from("pqr")))
            lines += text.split("\n")
        elif kind == "hint":
            lines.append("_checkpoint()")
        elif kind == "continue":
            lines += ["if a % 5 == 0:", "    continue"]
        elif kind == "while-true":
            var, n = f"t{depth}", draw(st.integers(1, 3))
            lines += [f"{var} = 0", "while True:", f"    _iterations: {n}", f"    {var} += 1",
                      f"    if {var} > {n}:", "        break"]
            lines += _indent(draw(_block(depth + 1, 1)))
        elif kind == "if":
            p = draw(st.sampled_from(["0.3", "0.5", "0.8"]))
            lines.append(f"if random.random() < {p}:")
            lines += _indent(draw(_block(depth + 1, loop)))
            if draw(st.booleans()):
                lines.append("else:")
                lines += _indent(draw(_block(depth + 1, loop)))
        elif kind == "for":
            var = f"j{depth}"
            lines.append(f"for {var} in range({draw(st.integers(1, 3))}):")
            lines += _indent([f"a += {var}", *draw(_block(depth + 1, 1))])
        elif kind == "while":
            var, n = f"w{depth}", draw(st.integers(1, 3))
            lines += [f"{var} = 0", f"while {var} < {n}:",
                      f"    _iterations: {n}", f"    {var} += 1"]
            lines += _indent(draw(_block(depth + 1, 1)))
        elif kind == "with":
            lines.append("with contextlib.suppress(KeyError):")
            lines += _indent(draw(_block(depth + 1, loop)))
        elif kind == "try":
            lines.append("try:")
            lines += _indent(draw(_block(depth + 1, loop)))
            lines += _indent(["if a % 11 == 0:", "    raise ValueError(a)"])
            lines += ["except ValueError:", "    b += 1"]
        else:
            lines.append("match a % 3:")
            lines.append("    case 0:")
            lines += _indent(_indent(draw(_block(depth + 1, loop))))
            lines += ["    case 1:", "        b += 2", "    case _:", "        a += 1"]
    return lines


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


@st.composite
def programs(draw: st.DrawFn) -> str:
    """A complete program with at least one hint: at module level, inside ``main()``, in a
    function whose parameters (a list, a dict, a NumPy Generator) the caller builds, or in a
    function called per epoch from the module's loop (hosted: its checkpoints are the
    module's)."""
    seed = draw(st.integers(0, 2**16))
    steps = draw(st.integers(120, 200))
    body = draw(_block(1, 0))
    step_body = [*body, "time.sleep(0.004)", "_checkpoint()"]
    setup = [f"random.seed({seed})", f"np.random.seed({seed})",
             f"gen = np.random.default_rng({seed})", "a, b = 0, 1", "items = []", "table = {}"]
    loop = [f"for step in range({steps}):", *_indent(step_body)]
    result = ("print(a, b, items[-8:], sorted(table.items())[:4], random.random(), "
              "np.random.random(), gen.random())")
    head = ["import contextlib", "import random", "import time", "", "import numpy as np",
            "from transform import _checkpoint", ""]
    shape = draw(st.sampled_from(["module", "main", "params", "hosted"]))
    if shape == "module":
        return "\n".join([*head, *setup, *loop, result]) + "\n"
    if shape == "main":
        inner = _indent([*setup, *loop, result])
        return "\n".join([*head, "", "def main():", *inner, "", "", "main()"]) + "\n"
    if shape == "params":
        inner = _indent(["a, b = 0, 1", *loop, "return a, b"])
        outer = [*setup[:3], "items = []", "table = {}", "a, b = train(items, table, gen)",
                 result]
        return "\n".join([*head, "", "def train(items, table, gen):", *inner, "", "",
                          *outer]) + "\n"
    # Hosted by an epoch loop (the pytorch/examples shape), of the module or of main(): the
    # callee's own ``a`` and ``b`` shadow the caller's, and the caller's loop holds a hint after
    # the call. The callee is a function or a method.
    epochs = draw(st.integers(2, 4))
    per_epoch = [f"for step in range({steps // epochs}):", *_indent(step_body)]
    inner = _indent(["a, b = epoch, 1", *per_epoch, "return a, b"])
    method = draw(st.booleans())
    call = "runner.run_epoch" if method else "run_epoch"
    outer = [*setup, *(["runner = Runner()"] if method else []),
             f"for epoch in range({epochs}):", f"    _iterations: {epochs}",
             f"    ra, rb = {call}(epoch, items, table, gen)",
             "    a, b = (a + ra) % 10007, (b * 3 + rb) % 10007", "    _checkpoint()", result]
    callee = ["class Runner:", *_indent(["def run_epoch(self, epoch, items, table, gen):",
                                         *inner])] if method else \
        ["def run_epoch(epoch, items, table, gen):", *inner]
    if draw(st.booleans()):
        outer = ["def main():", *_indent(outer), "", "", "main()"]
    return "\n".join([*head, "", *callee, "", "", *outer]) + "\n"
