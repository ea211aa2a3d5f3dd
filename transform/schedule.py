"""The checkpoint schedule: CheckHint's objective (seed ``001_…`` §2), solved exactly and fast.

Model. A timeline of ``n`` tasks with times ``t_1..t_n`` and a possible cut (a hint) between each
two consecutive tasks. Cuts split the timeline into blocks; a block of length ``T`` costs its
expected recovery time ``½·T·p_b/(1−p_b)`` with ``p_b = 1 − (1−p)^T``. Writing the hazard
``a = −log1p(−p)`` (``a = 1/MTBF`` for Poisson failures) this is ``f(T) = ½·T·expm1(a·T)``:
``f(0) = 0``, increasing and convex, so it is superadditive (a cut never makes things worse) and
the block cost ``w(i, j) = f(P_j − P_i)`` over prefix sums ``P`` obeys the quadrangle inequality
``w(i, j) + w(i', j') ≤ w(i', j) + w(i, j')`` for ``i ≤ i' ≤ j ≤ j'``. Everything fast below rests
on that inequality:

* **Penalised problem** (a cost per cut: the per-checkpoint variant, and the inner step of the
  budgeted one). ``F(j) = min_i F(i) + w(i, j) + c_j``. Merging two adjacent blocks of an optimal
  solution cannot help, so two adjacent blocks are together at least ``s*`` long, where
  ``f(s*) − 2·f(s*/2) = min c`` (the gain of a split is largest when it is balanced). Hence all
  ``F(j)`` with ``P_j`` inside a window of width ``s*`` depend only on ``F`` before the window and
  on one cut inside it: two row-minima problems on totally monotone matrices, solved by a
  divide-and-conquer that numpy vectorises one recursion level at a time. Work ``O(n log n)``.
* **Budgeted problem** (exactly ``ℓ`` cuts, CheckHint's ``OPT(ℓ+1, n)``). The optimum ``g(k)``
  over ``k`` cuts is convex in ``k`` (Monge ``k``-link paths), so Lagrangian relaxation is exact
  ("Aliens trick"): a penalty ``λ`` per cut picks a point of ``g``'s lower hull. ``λ`` is found by
  chord (Newton) steps between a solution with fewer and one with more cuts than ``ℓ``; when the
  chord turns out to support ``g`` (a tie: ``ℓ`` lies on a straight piece), the two solutions are
  spliced at a block of the denser one nested in a block of the sparser one — the quadrangle
  inequality makes the splice exactly as good, with exactly ``ℓ`` cuts.
* **Loops of identical iterations** (:func:`solve_run`). Blocks wholly inside such a loop are
  balanced (sizes ``q`` or ``q+1`` iterations: moving one iteration from a longer to a shorter
  block never hurts a convex cost), so a schedule is fixed by the first and the last cut and the
  count; both ends are found by nested binary searches on convex functions in ``O(log² N)``.

Objective values can overflow a float (``expm1(a·T)`` for a block hundreds of MTBFs long): the
fast path works in linear space and hands over to a log-space layered solver when the largest
block cost is not finite; reported values carry their natural logarithm as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from transform._firing import balanced_cuts, balanced_fires
from transform.errors import ScheduleError

__all__ = [
    "FlatSolution",
    "RunSolution",
    "hazard",
    "block_cost",
    "log_block_cost",
    "checkpoint_budget",
    "evaluate",
    "solve_budget",
    "solve_penalized",
    "solve_run",
    "solve_run_penalized",
    "balanced_cuts",
]

# A row-minima sub-problem at most this large is evaluated densely (one numpy pass); above it
# the level-by-level divide-and-conquer keeps the work near-linear.
_DENSE = 1 << 15
_MAX_CHORD_STEPS = 200


@dataclass(frozen=True, kw_only=True, slots=True)
class FlatSolution:
    """A schedule of a flat timeline: which cuts (after task ``k``, ``1 ≤ k < n``) are taken."""

    cuts: tuple[int, ...]
    """Sorted cut positions; cut ``k`` sits between task ``k`` and task ``k+1`` (1-based)."""
    value: float
    """Expected recovery time in seconds (``inf`` when it exceeds a float)."""
    log_value: float
    """Natural log of ``value`` (finite when ``value`` overflows; ``-inf`` when it is 0)."""
    method: str
    """Which solver produced it (``all``, ``none``, ``lagrangian``, ``splice``, ``layered``…)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSolution:
    """A schedule of ``count`` identical iterations, one hint each, solved without unrolling.

    The hint fires at occurrences ``first + floor(j·span/blocks)`` for ``j = 0..blocks``
    (1-based occurrence numbers) where ``span = last − first``: balanced blocks between the first
    and the last checkpoint. ``cuts == 0`` means it never fires.
    """

    count: int
    cuts: int
    first: int
    last: int
    value: float
    log_value: float

    @property
    def blocks(self) -> int:
        """Whole blocks between the first and the last checkpoint."""
        return max(self.cuts - 1, 0)

    def fires_at(self, occurrence: int) -> bool:
        """Whether the hint becomes a checkpoint on its ``occurrence``-th execution (1-based)."""
        return balanced_fires(occurrence, first=self.first, last=self.last, blocks=self.blocks,
                              cuts=self.cuts)

    def occurrences(self, limit: int | None = None) -> list[int]:
        """The firing occurrences in order (at most ``limit`` of them)."""
        return balanced_cuts(first=self.first, last=self.last, blocks=self.blocks,
                             cuts=self.cuts, limit=limit)


# --------------------------------------------------------------------------- cost function


def hazard(*, failure_rate: float | None = None, mtbf: float | None = None) -> float:
    """The hazard ``a`` (per second) from the paper's ``p`` or from an MTBF.

    ``failure_rate`` is CheckHint's ``p``: the probability of a failure in each second, so the
    survival of ``T`` seconds is ``(1−p)^T = exp(−a·T)`` with ``a = −log1p(−p)``. An MTBF ``M``
    means Poisson failures with rate ``1/M``.
    """
    if (failure_rate is None) == (mtbf is None):
        raise ScheduleError("give exactly one of failure_rate and mtbf")
    if failure_rate is not None:
        if not 0.0 < failure_rate < 1.0:
            raise ScheduleError(f"failure rate must be in (0, 1) per second, got {failure_rate}")
        return -math.log1p(-failure_rate)
    assert mtbf is not None
    if not mtbf > 0.0 or math.isinf(mtbf):
        raise ScheduleError(f"MTBF must be a positive number of seconds, got {mtbf}")
    return 1.0 / mtbf


def block_cost(length: np.ndarray | float, a: float) -> np.ndarray | float:
    """Expected recovery time of a block: ``½·T·expm1(a·T)`` (``inf`` on overflow)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return 0.5 * np.asarray(length) * np.expm1(a * np.asarray(length))


def _f(length: float, a: float) -> float:
    x = a * length
    return 0.5 * length * math.expm1(x) if x < 709.0 else math.inf


def _logf(length: float, a: float) -> float:
    """``log f(T)`` without overflow: ``log(T/2) + log(expm1(a·T))``."""
    if length <= 0.0:
        return -math.inf
    x = a * length
    log_em1 = x + math.log1p(-math.exp(-x)) if x > 30.0 else math.log(math.expm1(x))
    return math.log(0.5 * length) + log_em1


def log_block_cost(length: np.ndarray, a: float) -> np.ndarray:
    """Vectorised :func:`_logf` (``-inf`` for empty blocks)."""
    t = np.asarray(length, dtype=float)
    x = a * t
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        big = x > 30.0
        safe = np.where(big, 1.0, x)
        log_em1 = np.where(big, x + np.log1p(-np.exp(-np.where(big, x, 31.0))),
                           np.log(np.expm1(safe)))
        out = np.log(0.5 * t) + log_em1
    return np.where(t > 0.0, out, -np.inf)


def checkpoint_budget(*, total_time: float, overhead: float, ckpt_cost: float) -> int:
    """CheckHint's budget ``ℓ = ⌈o·Σt / t_c⌉``."""
    if not overhead >= 0.0:
        raise ScheduleError(f"overhead must be a non-negative fraction, got {overhead}")
    if not ckpt_cost > 0.0:
        raise ScheduleError(f"checkpoint cost must be positive seconds, got {ckpt_cost}")
    return math.ceil(overhead * total_time / ckpt_cost)


def _logsumexp(values: np.ndarray) -> float:
    if values.size == 0:
        return -math.inf
    top = float(values.max())
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.exp(values - top).sum()))


def evaluate(times: Sequence[float] | np.ndarray, cuts: Sequence[int], a: float) -> tuple[float,
                                                                                           float]:
    """``(value, log_value)`` of a schedule: the sum of its blocks' costs."""
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(times, dtype=float))))
    bounds = np.concatenate(([0], np.asarray(cuts, dtype=np.int64), [len(prefix) - 1]))
    lengths = np.diff(prefix[bounds])
    value = float(np.sum(block_cost(lengths, a)))
    return value, _logsumexp(log_block_cost(lengths, a))


def _solution(times: np.ndarray, cuts: Sequence[int], a: float, method: str) -> FlatSolution:
    value, log_value = evaluate(times, cuts, a)
    return FlatSolution(cuts=tuple(int(c) for c in cuts), value=value, log_value=log_value,
                        method=method)


# --------------------------------------------------------------------------- row minima

# combine(base_values_at_cols, row_indices, col_indices) -> matrix entries (same shape)
_Combine = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _linear_combine(prefix: np.ndarray, a: float) -> _Combine:
    def combine(base: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            d = prefix[rows] - prefix[cols]
            return base + 0.5 * d * np.expm1(a * d)

    return combine


def _log_combine(prefix: np.ndarray, a: float) -> _Combine:
    def combine(base: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return np.logaddexp(base, log_block_cost(prefix[rows] - prefix[cols], a))

    return combine


def _row_minima(base: np.ndarray, combine: _Combine, r0: int, r1: int, c0: int, c1: int,
                strict: bool) -> tuple[np.ndarray, np.ndarray]:
    """Minima of rows ``r0..r1-1`` over columns ``c0..c1-1`` (and ``col < row`` if ``strict``).

    Entry ``(j, i)`` is ``combine(base[i], j, i)``; the matrix is totally monotone, so the
    largest minimising column never decreases with the row. Returns (values, largest argmins);
    a row without any column gets ``inf`` and column ``c0``.
    """
    nrows = r1 - r0
    vals = np.full(nrows, np.inf)
    args = np.full(nrows, c0, dtype=np.int64)
    if nrows <= 0 or c1 <= c0:
        return vals, args
    if nrows * (c1 - c0) <= _DENSE:
        rows = np.arange(r0, r1)
        cols = np.arange(c0, c1)
        mat = combine(base[cols][None, :], rows[:, None], cols[None, :])
        if strict:
            mat = np.where(cols[None, :] < rows[:, None], mat, np.inf)
        rev = mat[:, ::-1]
        pick = (c1 - c0 - 1) - np.argmin(rev, axis=1)
        vals[:] = mat[np.arange(nrows), pick]
        has = rows > c0 if strict else np.ones(nrows, dtype=bool)
        args[:] = np.where(has, cols[pick], c0)
        return vals, args
    # Level-by-level divide and conquer: every pending row interval contributes its middle row.
    rl = np.array([r0], dtype=np.int64)
    rh = np.array([r1 - 1], dtype=np.int64)
    cl = np.array([c0], dtype=np.int64)
    ch = np.array([c1 - 1], dtype=np.int64)
    while rl.size:
        mid = (rl + rh) // 2
        hi = np.minimum(ch, mid - 1) if strict else ch
        lengths = np.maximum(hi - cl + 1, 0)
        opt = cl.copy()
        best = np.full(mid.size, np.inf)
        live = lengths > 0
        if live.any():
            lens = lengths[live]
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            total = int(lens.sum())
            owner = np.repeat(np.arange(lens.size), lens)
            cols = np.arange(total, dtype=np.int64) - np.repeat(starts - cl[live], lens)
            rows = mid[live][owner]
            entries = combine(base[cols], rows, cols)
            mins = np.minimum.reduceat(entries, starts)
            marked = np.where(entries == mins[owner], cols, -1)
            last = np.maximum.reduceat(marked, starts)
            best[live] = mins
            opt[live] = np.where(last >= 0, last, cl[live])
        vals[mid - r0] = best
        args[mid - r0] = opt
        left = mid - 1 >= rl
        right = mid + 1 <= rh
        rl, rh, cl, ch = (
            np.concatenate((rl[left], mid[right] + 1)),
            np.concatenate((mid[left] - 1, rh[right])),
            np.concatenate((cl[left], opt[right])),
            np.concatenate((opt[left], ch[right])),
        )
    return vals, args


# --------------------------------------------------------------------------- penalised problem


def _pair_bound(min_cost: float, a: float, total: float) -> float:
    """A length ``s`` such that two adjacent optimal blocks are together longer than ``s``.

    The best split of a block of length ``L`` gains at most ``h(L) = f(L) − 2f(L/2) =
    ½·L·exp(a·L/2)·expm1(a·L/2)``; an optimal solution never merges two blocks whose union
    would gain more than the cut's cost, so their union has ``h ≥ min_cost``. Bisection keeps
    ``h(lo) < min_cost``; the margin absorbs rounding in ``h``.
    """
    if min_cost <= 0.0 or total <= 0.0:
        return 0.0

    def h(s: float) -> float:
        x = a * s / 2.0
        return 0.5 * s * math.exp(x) * math.expm1(x) if x < 350.0 else math.inf

    if h(total) < min_cost:
        return total * (1.0 - 1e-9)
    lo, hi = 0.0, total
    for _ in range(100):
        midpoint = 0.5 * (lo + hi)
        if h(midpoint) < min_cost:
            lo = midpoint
        else:
            hi = midpoint
        if hi - lo <= 1e-12 * hi:
            break
    return lo * (1.0 - 1e-9)


def _penalized_path(prefix: np.ndarray, penalty: np.ndarray, a: float) -> tuple[float, list[int]]:
    """Solve ``F(j) = min_i F(i) + w(i, j) + penalty[j]`` and return (``F(n)``, cuts).

    ``penalty[n]`` must be 0 (the end of the program is not a cut); ``penalty[1..n-1]`` ≥ 0.
    """
    n = prefix.size - 1
    values = np.empty(n + 1)
    values[0] = 0.0
    parent = np.zeros(n + 1, dtype=np.int64)
    min_cost = float(penalty[1:n].min()) if n > 1 else 0.0
    width = _pair_bound(min_cost, a, float(prefix[-1]))
    combine = _linear_combine(prefix, a)
    lo = 0
    j0 = 1
    while j0 <= n:
        j1 = int(np.searchsorted(prefix, prefix[j0] + width, side="left"))
        j1 = min(max(j1, j0 + 1), n + 1)
        # Paths whose last cut lies before the window.
        entry, entry_arg = _row_minima(values, combine, j0, j1, lo, j0, strict=False)
        entry = entry + penalty[j0:j1]
        best, best_arg = entry, entry_arg
        if j1 - j0 > 1:
            # ... or whose last cut lies in the window: that cut's own last block starts
            # before the window (pair bound), so ``entry`` is its exact value.
            window = np.empty(n + 1)
            window[j0:j1] = entry
            inner, inner_arg = _row_minima(window, combine, j0, j1, j0, j1, strict=True)
            inner = inner + penalty[j0:j1]
            take = inner < best
            best = np.where(take, inner, best)
            best_arg = np.where(take, inner_arg, best_arg)
        values[j0:j1] = best
        parent[j0:j1] = best_arg
        lo = int(parent[j1 - 1])
        j0 = j1
    cuts = []
    j = int(parent[n])
    while j > 0:
        cuts.append(j)
        j = int(parent[j])
    cuts.reverse()
    return float(values[n]), cuts


def _prefix(times: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(times, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ScheduleError("a timeline needs at least one task")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ScheduleError("task times must be finite and non-negative")
    return arr, np.concatenate(([0.0], np.cumsum(arr)))


def solve_penalized(times: Sequence[float] | np.ndarray, cut_costs: Sequence[float] | np.ndarray,
                    a: float) -> FlatSolution:
    """Minimise expected recovery plus the cost of the cuts taken (no budget).

    ``cut_costs[k-1]`` is the cost (seconds) of a checkpoint at cut ``k``; ``len(cut_costs) ==
    len(times) - 1``. Exact; ``O(n log n)`` numpy work.
    """
    arr, prefix = _prefix(times)
    n = arr.size
    costs = np.asarray(cut_costs, dtype=float)
    if costs.shape != (n - 1,) or np.any(costs < 0) or not np.all(np.isfinite(costs)):
        raise ScheduleError("need one finite non-negative cost per cut (len(times) - 1)")
    if n == 1:
        return _solution(arr, (), a, "none")
    if not math.isfinite(_f(float(prefix[-1]), a)):
        # Cutting everywhere bounds the optimum: if even that overflows, say so in log space.
        pass
    penalty = np.concatenate(([0.0], costs, [0.0]))
    _, cuts = _penalized_path(prefix, penalty, a)
    return _solution(arr, cuts, a, "penalized")


# --------------------------------------------------------------------------- budgeted problem


@dataclass(frozen=True, slots=True)
class _Point:
    cuts: tuple[int, ...]
    value: float

    @property
    def k(self) -> int:
        return len(self.cuts)


def _splice(fewer: Sequence[int], more: Sequence[int], target: int, n: int) -> list[int]:
    """A solution with ``target`` cuts from two solutions optimal for the same penalty.

    Find the first block ``[b_r, b_{r+1}]`` of the denser solution ``B`` with no cut of the
    sparser ``A`` in ``(b_r, b_{r+1}]`` at which ``r − #A(≤ b_r) = target − |A|``; keep ``B`` up to
    ``b_r`` and ``A`` after it. The quadrangle inequality makes the two splices (this one and its
    mirror) together no worse than ``A`` and ``B``, so each is optimal too.
    """
    a_arr = np.asarray(fewer, dtype=np.int64)
    b_ext = np.concatenate(([0], np.asarray(more, dtype=np.int64), [n]))
    before = np.searchsorted(a_arr, b_ext[:-1], side="right")
    through = np.searchsorted(a_arr, b_ext[1:], side="right")
    excess = np.arange(b_ext.size - 1) - before
    hit = np.flatnonzero((through == before) & (excess == target - a_arr.size))
    if hit.size == 0:
        raise ScheduleError("internal: no splice point (please report this schedule)")
    r = int(hit[0])
    return [*(int(c) for c in more[:r]), *(int(c) for c in a_arr[before[r]:])]


def solve_budget(times: Sequence[float] | np.ndarray, budget: int, a: float) -> FlatSolution:
    """The CheckHint optimum with exactly ``min(budget, n-1)`` cuts (``OPT(ℓ+1, n)``).

    Because ``f`` is superadditive, exactly ``ℓ`` cuts is never worse than fewer, so this is also
    the optimum under "at most ``ℓ``". Exact (see the module docstring); near ``O(n log n)``
    numpy work per chord step, a handful of steps in practice.
    """
    arr, prefix = _prefix(times)
    n = arr.size
    if budget < 0:
        raise ScheduleError(f"budget must be non-negative, got {budget}")
    if budget >= n - 1:
        return _solution(arr, range(1, n), a, "all")
    if budget == 0:
        return _solution(arr, (), a, "none")
    whole = _f(float(prefix[-1]), a)
    if not math.isfinite(whole):
        return _layered(arr, prefix, budget, a, log_space=True)
    sparse = _Point((), whole)
    everything = tuple(range(1, n))
    dense = _Point(everything, float(np.sum(block_cost(arr, a))))

    def relaxed(penalty_per_cut: float) -> _Point:
        penalty = np.full(n + 1, penalty_per_cut)
        penalty[0] = penalty[n] = 0.0
        _, cuts = _penalized_path(prefix, penalty, a)
        value = float(np.sum(block_cost(np.diff(prefix[[0, *cuts, n]]), a)))
        return _Point(tuple(cuts), value)

    # Warm start: for blocks of length L the marginal value of one more cut is about
    # L·f'(L) − f(L) = ½·a·L²·e^(a·L), and L scales like 1/(cuts + 1). Two or three guesses
    # usually bracket ℓ tightly; chord steps finish the job (and keep it exact).
    guess = float(prefix[-1]) / (budget + 1)
    slope = 0.5 * a * guess * guess * math.exp(min(a * guess, 700.0))
    for _ in range(4):
        if not (math.isfinite(slope) and slope > 0.0):
            break
        point = relaxed(slope)
        if point.k == budget:
            return _solution(arr, point.cuts, a, "lagrangian")
        if point.k < budget and point.k > sparse.k:
            sparse = point
        elif point.k > budget and point.k < dense.k:
            dense = point
        if sparse.k > 0 and dense.k < n - 1:
            break
        slope *= ((point.k + 1) / (budget + 1)) ** 2
    for _ in range(_MAX_CHORD_STEPS):
        slope = (sparse.value - dense.value) / (dense.k - sparse.k)
        if not slope > 0.0:
            # g is flat between the two: every count in between is as good.
            return _solution(arr, _splice(sparse.cuts, dense.cuts, budget, n), a, "splice")
        point = relaxed(slope)
        if point.k == budget:
            return _solution(arr, point.cuts, a, "lagrangian")
        chord = sparse.value + slope * sparse.k
        penalised = point.value + slope * point.k
        supporting = penalised >= chord - 1e-12 * abs(chord)
        if supporting or not sparse.k < point.k < dense.k:
            return _solution(arr, _splice(sparse.cuts, dense.cuts, budget, n), a, "splice")
        if point.k < budget:
            sparse = point
        else:
            dense = point
    return _layered(arr, prefix, budget, a, log_space=False)


def _layered(arr: np.ndarray, prefix: np.ndarray, budget: int, a: float, *,
             log_space: bool) -> FlatSolution:
    """CheckHint's recurrence layer by layer, each layer by monotone row minima.

    ``O(ℓ·n log n)``; used where Lagrangian relaxation cannot be (block costs overflow a float,
    so penalties are meaningless) — in log space there, since then blocks are long and few.
    """
    n = arr.size
    combine = _log_combine(prefix, a) if log_space else _linear_combine(prefix, a)
    zero = -np.inf if log_space else 0.0
    layer = np.full(n + 1, np.inf)
    layer[0] = zero
    parents = []
    for blocks in range(1, budget + 2):
        last = blocks == budget + 1
        r0, r1 = (n, n + 1) if last else (blocks, n)
        vals, args = _row_minima(layer, combine, r0, r1, blocks - 1, r1 - 1 if not last else n,
                                 strict=True)
        nxt = np.full(n + 1, np.inf)
        nxt[r0:r1] = vals
        par = np.zeros(n + 1, dtype=np.int64)
        par[r0:r1] = args
        parents.append(par)
        layer = nxt
    cuts = []
    j = n
    for par in reversed(parents[1:]):
        j = int(par[j])
        cuts.append(j)
    cuts.reverse()
    return _solution(arr, cuts, a, "layered-log" if log_space else "layered")


# --------------------------------------------------------------------------- identical iterations


def _log_add(*terms: float) -> float:
    top = max(terms)
    if top == -math.inf or top == math.inf:
        return top
    return top + math.log(sum(math.exp(t - top) for t in terms))


def _log_balanced(total: int, blocks: int, period: float, a: float) -> float:
    """log of the cost of ``total`` iterations split into ``blocks`` balanced blocks."""
    if blocks == 0:
        return -math.inf if total == 0 else math.inf
    q, r = divmod(total, blocks)
    terms = []
    if r:
        terms.append(math.log(r) + _logf((q + 1) * period, a))
    if blocks - r and q:
        terms.append(math.log(blocks - r) + _logf(q * period, a))
    return _log_add(*terms) if terms else -math.inf


def _argmin_convex(lo: int, hi: int, fn: Callable[[int], float]) -> int:
    """Smallest minimiser of a convex function on the integers ``lo..hi``."""
    while lo < hi:
        mid = (lo + hi) // 2
        if fn(mid + 1) < fn(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _check_run(pre: float, period: float, count: int, post: float) -> None:
    if count < 1:
        raise ScheduleError(f"a loop needs at least one iteration, got {count}")
    for name, value in (("pre", pre), ("period", period), ("post", post)):
        if not (math.isfinite(value) and value >= 0.0):
            raise ScheduleError(f"{name} time must be finite and non-negative, got {value}")


def solve_run(*, pre: float, period: float, count: int, post: float, budget: int,
              a: float) -> RunSolution:
    """Exactly ``min(budget, count)`` checkpoints among ``count`` identical hint occurrences.

    The timeline is ``pre`` seconds up to the first occurrence, ``period`` seconds between
    consecutive occurrences, ``post`` seconds after the last: the tasks ``[pre, period ×
    (count−1), post]`` of the unrolled loop. ``O(log² count)`` float work whatever ``count``.
    """
    _check_run(pre, period, count, post)
    cuts = max(0, min(budget, count))
    if cuts == 0:
        log_value = _logf(pre + (count - 1) * period + post, a)
        return _run_solution(count, 0, 0, 0, log_value)
    spare = count - cuts  # iterations not forced by "every block has at least one"
    inner_blocks = cuts - 1

    def log_cost(head: int, tail: int) -> float:
        middle = spare - head - tail
        if inner_blocks == 0 and middle:
            return math.inf
        return _log_add(_logf(pre + head * period, a),
                        _log_balanced(inner_blocks + middle, inner_blocks, period, a),
                        _logf(post + tail * period, a))

    def best_tail(head: int) -> int:
        if inner_blocks == 0:
            return spare - head
        return _argmin_convex(0, spare - head, lambda tail: log_cost(head, tail))

    head = _argmin_convex(0, spare, lambda h: log_cost(h, best_tail(h)))
    tail = best_tail(head)
    return _run_solution(count, cuts, head + 1, count - tail, log_cost(head, tail))


def _run_solution(count: int, cuts: int, first: int, last: int, log_value: float) -> RunSolution:
    value = math.exp(log_value) if log_value < 709.0 else math.inf
    return RunSolution(count=count, cuts=cuts, first=first, last=last, value=value,
                       log_value=log_value)


def solve_run_penalized(*, pre: float, period: float, count: int, post: float, ckpt_cost: float,
                        a: float) -> RunSolution:
    """Expected recovery plus ``ckpt_cost`` per checkpoint, minimised over the count too.

    The optimum over exactly ``c`` checkpoints is convex in ``c``, so a binary search on ``c``
    over :func:`solve_run` is exact: ``O(log³ count)``.
    """
    _check_run(pre, period, count, post)
    if ckpt_cost < 0 or not math.isfinite(ckpt_cost):
        raise ScheduleError(f"checkpoint cost must be finite and non-negative, got {ckpt_cost}")
    cache: dict[int, RunSolution] = {}

    def solved(c: int) -> RunSolution:
        if c not in cache:
            cache[c] = solve_run(pre=pre, period=period, count=count, post=post, budget=c, a=a)
        return cache[c]

    def total(c: int) -> float:
        spent = math.log(c * ckpt_cost) if c and ckpt_cost else -math.inf
        return _log_add(solved(c).log_value, spent)

    # Start from the continuous optimum (blocks of length L with ½·a·L²·e^(a·L) = ckpt_cost)
    # and gallop outwards to a bracket, so huge counts need a few solves, not log₂(count).
    span = pre + (count - 1) * period + post
    guess = count // 2
    if ckpt_cost > 0 and span > 0:
        lo_len, hi_len = 0.0, span
        for _ in range(200):
            mid = 0.5 * (lo_len + hi_len)
            if 0.5 * a * mid * mid * math.exp(min(a * mid, 700.0)) < ckpt_cost:
                lo_len = mid
            else:
                hi_len = mid
        guess = min(count, max(0, round(span / max(hi_len, 1e-300))))
    lo, hi = guess, guess
    step = 1
    while lo > 0 and total(lo - 1) <= total(lo):
        lo, step = max(0, lo - step), step * 2
    step = 1
    while hi < count and total(hi + 1) < total(hi):
        hi, step = min(count, hi + step), step * 2
    return solved(_argmin_convex(lo, hi, total))
