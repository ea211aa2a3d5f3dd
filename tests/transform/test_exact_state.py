"""State that plain serialization drops is saved, or the save is refused: never a wrong resume.

Real processes: programs are transformed, SIGKILLed by the runtime at a chosen save (``N`` or
``N:POINT``), and run again to completion; the output must be the original's.
"""

from __future__ import annotations

import pickle

import killresume as kr
import pytest
from test_runtime import original_output, prepare, resume_after

GRAD_ACCUM_IN_FUNCTION = """
import torch
from torch import nn
from transform import _checkpoint

torch.set_num_threads(1)

def train(model, opt, steps, accum):
    losses = []
    for step in range(steps):
        _iterations: 6
        for micro in range(accum):
            _iterations: 3
            x = torch.randn(8, 4)
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)) / accum
            loss.backward()
            losses.append(round(loss.item(), 6))
            _checkpoint()
        opt.step()
        opt.zero_grad()
    return losses

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
losses = train(model, opt, 6, 3)
print(losses[-3:], [round(v, 6) for p in model.parameters() for v in p.detach().flatten().tolist()])
"""


def test_gradients_accumulated_before_a_checkpoint_are_restored(tmp_path) -> None:
    # The model is the caller's (an anchor restored in place by load_state_dict, which has no
    # gradients): a save between backward() and step() must carry every parameter's .grad.
    # One chain of attempts (each a torch start-up): killed after save 5 (a micro-step of step 1,
    # gradients of two micro-steps accumulated); the next attempt resumes there and is killed
    # before the rename of its third save (save 8 of the run): the last attempt resumes from the
    # save before it (save 7, one micro-step of step 2 accumulated), written by a resumed attempt.
    original, program, env = prepare(tmp_path, GRAD_ACCUM_IN_FUNCTION, "--all-hints")
    killed = kr.inject(program, "5", cwd=tmp_path, env=env)
    assert killed.returncode == -9, killed.stderr
    assert (tmp_path / "ckpt" / "resume.ckpt").exists()
    assert resume_after(program, env, "3:before-rename") == original_output(original, env)


LIVE_GRAPH = """
import torch
from torch import nn
from transform import _checkpoint

model = nn.Linear(3, 1)
total = None
for i in range(5):
    out = model(torch.ones(2, 3) * i).sum()
    total = out if total is None else total + out
    _checkpoint()
total.backward()
print(model.weight.grad)
"""


def test_a_live_autograd_graph_is_refused_at_the_first_save(tmp_path) -> None:
    _, program, env = prepare(tmp_path, LIVE_GRAPH, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "original.py:11: cannot save `total` (a Tensor)" in done.stderr
    assert not (tmp_path / "ckpt" / "resume.ckpt").exists()


# minGPT's Trainer keeps the step's loss on itself (``self.loss``) for its callbacks. The trainer
# is restored in place, so the graph is in its attributes, not in a live name: the refusal named
# no value ("cannot save the live values"); it names the attribute.
TRAINER_LOSS = """
import torch
from torch import nn
from transform import _checkpoint

class Trainer:
    def __init__(self):
        self.model = nn.Linear(3, 1)
        self.loss = None

    def run(self):
        for i in range(4):
            self.loss = self.model(torch.ones(2, 3) * i).sum()
            self.loss.backward()
            _checkpoint()
        print(self.loss.item())

Trainer().run()
"""


def test_a_graph_in_an_attribute_of_an_object_restored_in_place_is_named(tmp_path) -> None:
    _, program, env = prepare(tmp_path, TRAINER_LOSS, "--all-hints")
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "original.py:15: cannot save `self.loss` (a Tensor)" in done.stderr
    assert not (tmp_path / "ckpt" / "resume.ckpt").exists()


# pytorch/examples' word language model: the LSTM state is carried across batches and cut from
# the graph by a function of the program's own, at the top of the next batch. Live at the
# checkpoint, still holding the last batch's graph, it was refused at the first save; the
# analysis now sees that repackage_hidden only detaches its argument (transform/graphfree.py),
# so the tuple is saved with its tensors detached.
LSTM_STATE = """
import torch
from torch import nn
from transform import _checkpoint

torch.set_num_threads(1)

def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)

def total(h):
    return [round(v, 6) for t in h for v in t.flatten().tolist()]

torch.manual_seed(0)
rnn = nn.LSTM(3, 5)
head = nn.Linear(5, 1)
params = list(rnn.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.1)
stream = torch.randn(60, 2, 3)
hidden = (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5))
for i in range(0, 60, 6):
    _iterations: 10
    hidden = repackage_hidden(hidden)
    out, hidden = rnn(stream[i:i + 6], hidden)
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    _checkpoint()
print([round(v, 6) for p in params for v in p.detach().flatten().tolist()])
print(total(repackage_hidden(hidden)))
"""


def test_an_lstm_state_detached_by_the_programs_own_function_resumes_exactly(tmp_path) -> None:
    original, program, env = prepare(tmp_path, LSTM_STATE, "--all-hints")
    assert resume_after(program, env, "4") == original_output(original, env)


# A data set kept as row views of one array (a real MNIST load makes 70,000 of them): saved as
# their owner once and their offsets (each as its own copy before: a check that compared every
# pair of them took minutes per save at this size). tests/transform/test_arrays.py has the rest.
ROW_VIEWS = """
import numpy as np
from transform import _checkpoint

data = np.arange(40_000 * 4, dtype=np.float64).reshape(40_000, 4)
rows = [data[i] for i in range(len(data))]
del data
w = np.zeros(4)
for step in range(6):
    _iterations: 6
    w += rows[step * 997] * 0.5
    _checkpoint()
print(w.tolist(), sum(float(r[0]) for r in rows[::4_000]))
"""


def test_tens_of_thousands_of_row_views_are_saved_and_resume_exactly(tmp_path) -> None:
    original, program, env = prepare(tmp_path, ROW_VIEWS, "--all-hints")
    assert resume_after(program, env, "3") == original_output(original, env)


def _round_trip(payload: object) -> object:
    from transform.runtime._pickling import dumps, loads

    dumped = dumps(payload, {})
    return loads(dumped.data, {}, dumped.globals, dumped.blobs.__getitem__)


def test_a_module_state_saved_without_attributes_is_refused() -> None:
    import torch

    from transform.runtime._exit import CheckpointError
    from transform.runtime._inplace import anchor_state, apply_anchor

    model = torch.nn.Linear(2, 1)
    weights, flags, grads, _ = anchor_state("module", model)
    with pytest.raises(CheckpointError, match="lacks its attributes"):
        apply_anchor("module", model, (weights, flags, grads), "model")


def test_an_optimizer_is_rebuilt_on_the_restored_parameters_with_its_whole_state() -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=2, history_size=3)
    adam = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(2):
        lbfgs.step(closure)
        adam.step()
    back = _round_trip({"model": model, "lbfgs": lbfgs, "adam": adam})
    assert isinstance(back, dict)
    params = list(back["model"].parameters())
    for name, saved in (("lbfgs", lbfgs), ("adam", adam)):
        rebuilt = back[name]
        assert type(rebuilt) is type(saved)
        # the rebuilt optimizer steps the restored parameters, not copies of them
        assert all(a is b for a, b in zip(rebuilt.param_groups[0]["params"], params, strict=True))
        assert rebuilt.defaults == saved.defaults
        assert str(rebuilt.state_dict()) == str(saved.state_dict())
    assert back["lbfgs"]._params == params  # what pickling the object would have dropped


def test_an_optimizer_that_cannot_be_rebuilt_is_refused_at_the_save() -> None:
    import torch

    class Scaled(torch.optim.SGD):  # a required argument its defaults do not record
        def __init__(self, params: object, scale: float, lr: float = 0.1) -> None:
            super().__init__(params, lr=lr * scale)

    model = torch.nn.Linear(2, 1)
    with pytest.raises(pickle.PicklingError,
                       match=r"optimizer \(.*Scaled\) that cannot be rebuilt"):
        _round_trip({"opt": Scaled(model.parameters(), 2.0)})
    class Tempered(torch.optim.SGD):  # an attribute its constructor sets, not in its state
        def __init__(self, params: object, lr: float = 0.1, temperature: float = 1.0) -> None:
            super().__init__(params, lr=lr)
            self.temperature = temperature

    with pytest.raises(pickle.PicklingError, match=r"attributes of its own \(temperature\)"):
        _round_trip({"opt": Tempered(model.parameters(), temperature=0.5)})
    hooked = torch.optim.SGD(model.parameters(), lr=0.1)
    hooked.register_step_post_hook(lambda *_: None)
    with pytest.raises(pickle.PicklingError, match="with step hooks"):
        _round_trip({"opt": hooked})


# A module-level policy that main() trains: a resume rebuilds it and restores it in place. Its
# plain attribute `losses` is state; `log_probs` holds autograd graphs while an episode runs.
MODULE_ATTRIBUTES = """
import torch
from transform import _checkpoint

torch.manual_seed(0)


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.losses = []
        self.log_probs = []


policy = Policy()


def main(keep_graph):
    for step in range(6):
        _iterations: 6
        out = policy.layer(torch.ones(2)).sum()
        if keep_graph:
            policy.log_probs.append(out)
        policy.losses.append(round(out.item() + step, 4))
        _checkpoint()
    print(policy.losses)


main(KEEP_GRAPH)
"""


@pytest.mark.parametrize("keep_graph", [False, True])
def test_a_modules_plain_attributes_are_restored_or_the_save_refused(tmp_path,
                                                                    keep_graph: bool) -> None:
    source = MODULE_ATTRIBUTES.replace("KEEP_GRAPH", str(keep_graph))
    original, program, env = prepare(tmp_path, source, "--all-hints")
    if not keep_graph:
        assert resume_after(program, env, "3") == original_output(original, env)
        return
    done = kr.finish(program, cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "original.py:26: cannot save" in done.stderr and "autograd graph" in done.stderr


# micrograd's shape: an autograd engine the program imports, whose nodes hold closures made in
# the engine's own module (each operation's `_backward`, a leaf's `lambda: None`). The engine is
# the `Value` class of the micrograd-lambdas fixture, moved into a module of its own.
def _engine_module() -> str:
    import ast
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "programs" / "micrograd-lambdas"
    source = (fixture / "input.py").read_text()
    value = next(node for node in ast.parse(source).body
                 if isinstance(node, ast.ClassDef) and node.name == "Value")
    segment = ast.get_source_segment(source, value)
    assert segment is not None
    return "import math\n\n\n" + segment + "\n"


USES_ENGINE = """
from engine import Value
from transform import _checkpoint

w, b = Value(0.3), Value(-0.1)
points = [(-1.0, -0.5), (0.0, 0.1), (1.0, 0.6), (2.0, 0.9)]
last = None
for step in range(8):
    _iterations: 8
    loss = Value(0.0)
    for x, y in points:
        d = (w * x + b).tanh() + (-y)
        loss = loss + d * d
    w.grad = b.grad = 0.0
    loss.backward()
    w.data -= 0.1 * w.grad
    b.data -= 0.1 * b.grad
    last = loss  # a graph of the engine's closures, live at the checkpoint
    _checkpoint()
print(round(w.data, 12), round(b.data, 12), round(last.data, 12), len(last._prev))
"""


def test_closures_made_in_an_imported_library_are_saved_and_resume_exactly(tmp_path) -> None:
    (tmp_path / "engine.py").write_text(_engine_module())
    original, program, env = prepare(tmp_path, USES_ENGINE, "--all-hints")
    assert resume_after(program, env, "4") == original_output(original, env)


def test_a_library_closure_wrapped_by_another_modules_decorator_is_saved() -> None:
    """torch's ``get_ema_multi_avg_fn`` returns its closure wrapped by ``torch.no_grad()``: the
    wrapper's code and globals are ``torch.utils._contextlib``'s, its ``__module__`` the
    closure's (copied by ``functools.wraps``). Looked for under ``__module__``, its code was not
    found, and an ``AveragedModel`` (an EMA of the model, as pytorch/examples' imagenet keeps
    one) was refused at the first save."""
    import torch
    from torch.optim.swa_utils import get_ema_multi_avg_fn

    update = get_ema_multi_avg_fn(0.75)
    back = _round_trip(update)
    assert back is not update and back.__wrapped__ is not update.__wrapped__
    ema, model = [torch.ones(3)], [torch.full((3,), 5.0)]
    back(ema, model, torch.tensor(1))
    assert ema[0].tolist() == [2.0, 2.0, 2.0]  # 0.75 * 1 + 0.25 * 5, under no_grad


def _code_args(code: object) -> list[object]:
    """``types.CodeType``'s positional arguments (Python 3.11) for ``code``."""
    return [getattr(code, "co_" + name) for name in (
        "argcount", "posonlyargcount", "kwonlyargcount", "nlocals", "stacksize", "flags", "code",
        "consts", "names", "varnames", "filename", "name", "qualname", "firstlineno",
        "linetable", "exceptiontable", "freevars", "cellvars")]


def test_a_state_cannot_bring_code_that_no_imported_module_has() -> None:
    import types

    from transform.runtime._pickling import _checked_code

    # killresume is imported and not rewritten by pytest: its compiled source is its code
    code = kr.assert_same_result.__code__
    assert isinstance(_checked_code(*_code_args(code)), types.CodeType)
    forged = code.replace(co_consts=(*code.co_consts, "a constant of its own"))
    with pytest.raises(pickle.UnpicklingError, match="not part of the program or of a module"):
        _checked_code(*_code_args(forged))  # same file, same name: other code


# A loop over a DataLoader resumes by walking through the saved iteration again. It used to
# iterate the restored loader for that: the loader's own torch.Generator, restored at its state
# of the save (after the epoch's draws), shuffled anew, and loading the batches passed over
# advanced the restored dataset's own numpy generator. Both gave another result with exit 0.
# Now the loop's iterator is re-created from the random states it was made from (enumerate of a
# loader, a tqdm bar over one; without workers the sampler alone is advanced and the saved
# iteration's batch loaded from a copy of the dataset; with workers the batches are loaded in
# them again). The bar, live at the checkpoint, is saved and counts as in one run.
LOADER_LOOPS = """
import random
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm
from transform import _checkpoint

torch.set_num_threads(1)

class Noisy(Dataset):
    def __init__(self, seed, n):
        self.rng = np.random.default_rng(seed)
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        x = np.sin(np.arange(6) * (i + 1)) + 0.1 * self.rng.standard_normal(6)
        return torch.tensor(x, dtype=torch.float32), torch.tensor(float(i % 2))

def step(x, y):
    loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

torch.manual_seed(2)
own = DataLoader(Noisy(9, 40), batch_size=8, shuffle=True,
                 generator=torch.Generator().manual_seed(5))
workers = DataLoader(Noisy(3, 48), batch_size=8, shuffle=True, num_workers=2,
                     generator=torch.Generator().manual_seed(6))
model = nn.Linear(6, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    _iterations: 2
    for i, (x, y) in enumerate(own, 1):
        _iterations: 5
        step(x, y)
        _checkpoint()
for epoch in range(2):
    _iterations: 2
    bar = tqdm(workers, mininterval=0, initial=1)
    for x, y in bar:
        _iterations: 6
        step(x, y)
        _checkpoint()
    print("bar", epoch, bar.n)

class Buckets(Sampler):
    def __init__(self, size, seed):
        self.batches = [list(range(k, k + 8)) for k in range(0, size, 8)]
        self.rng = random.Random(seed)
    def __iter__(self):
        order = list(self.batches)
        self.rng.shuffle(order)
        return iter(order)
    def __len__(self):
        return len(self.batches)

def as_float(*loaders):
    for batches in zip(*loaders):
        yield [(x.float(), y.float()) for x, y in batches]

buckets = DataLoader(Noisy(4, 40), batch_sampler=Buckets(40, 8))
for epoch in range(2):
    _iterations: 2
    for (x, y), (x2, y2) in as_float(own, buckets):
        _iterations: 5
        step(torch.cat([x, x2]), torch.cat([y, y2]))
        _checkpoint()
print([round(v, 6) for v in model.weight.flatten().tolist()], i, bar.n)
"""


def test_loops_over_loaders_with_their_own_random_state_resume_exactly(tmp_path) -> None:
    original, program, env = prepare(tmp_path, LOADER_LOOPS, "--all-hints")
    # save 3: the enumerate loop's first epoch; 10 saves later (save 13) the bar loop's third
    # batch, then its fifth (its prefetching draws from the loader's generator while the resume
    # walks: put back at the checkpoint, else its next epoch shuffles differently); then 8 saves
    # later (save 23) the first batch of zip(own, buckets) through a generator of the program's
    printed = ""
    for kill_at in ("3", "10", "2", "8"):
        killed = kr.inject(program, kill_at, cwd=program.parent, env=env)
        assert killed.returncode == -9, killed.stderr
        printed = killed.stdout
    # the last killed attempt finished both bar epochs, the first resumed: each counted 1 + 6
    assert printed == "bar 0 7\nbar 1 7\n", printed
    done = kr.finish(program, cwd=program.parent, env=env)
    assert done.returncode == 0, done.stderr
    expected = original_output(original, env)
    assert done.stdout.count("\n") == 1 and expected.endswith(printed + done.stdout), (
        done.stdout, expected)


# The loaders a loop makes as it begins are re-created from their saved states in the order the
# resumed program makes them: made in another order (here the order depends on the environment,
# which changed between the attempts), a saved state would reach the wrong loader. Refused.
LOADERS_IN_ANOTHER_ORDER = """
import os
import torch
from torch.utils.data import DataLoader, TensorDataset
from transform import _checkpoint

a = DataLoader(TensorDataset(torch.arange(24.0)), batch_size=4, shuffle=True,
               generator=torch.Generator().manual_seed(1))
b = DataLoader(TensorDataset(torch.arange(32.0)), batch_size=4, shuffle=True,
               generator=torch.Generator().manual_seed(2))
total = 0.0
for (x,), (y,) in zip(*((b, a) if os.environ.get("FLIP") else (a, b))):
    _iterations: 6
    total += float(x.sum() - y.sum())
    _checkpoint()
print(total)
"""


def test_loaders_made_again_in_another_order_are_refused(tmp_path) -> None:
    _, program, env = prepare(tmp_path, LOADERS_IN_ANOTHER_ORDER, "--all-hints")
    killed = kr.inject(program, "3", cwd=program.parent, env=env)
    assert killed.returncode == -9, killed.stderr
    done = kr.finish(program, cwd=program.parent, env={**env, "FLIP": "1"})
    assert done.returncode == 1
    assert "makes its DataLoader iterators in another order" in done.stderr, done.stderr
