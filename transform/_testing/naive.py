"""CheckHint's recurrence as the paper states it: the oracle for tests and the benchmark baseline.

``OPT(β, j) = min_{j' ∈ [β−1, j−1]} OPT(β−1, j') + cost(j'+1, j)``, ``O(m·n²)``, here in log space
(so it stays an oracle where block costs overflow) with the inner minimum vectorised by numpy —
the recurrence is unchanged, only the constant factor is smaller than pure Python's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transform.schedule import FlatSolution, evaluate, log_block_cost

__all__ = ["naive_budget", "naive_penalized"]


def naive_budget(times: Sequence[float] | np.ndarray, budget: int, a: float) -> FlatSolution:
    """Exactly ``min(budget, n−1)`` cuts minimising the expected recovery time."""
    t = np.asarray(times, dtype=float)
    n = t.size
    prefix = np.concatenate(([0.0], np.cumsum(t)))
    blocks = min(budget, n - 1) + 1
    opt = np.full((blocks + 1, n + 1), np.inf)
    arg = np.zeros((blocks + 1, n + 1), dtype=np.int64)
    opt[0, 0] = -np.inf  # log 0: no block yet
    for beta in range(1, blocks + 1):
        for j in range(beta, n + 1):
            cand = np.arange(beta - 1, j)
            vals = np.logaddexp(opt[beta - 1, cand], log_block_cost(prefix[j] - prefix[cand], a))
            k = int(np.argmin(vals))
            opt[beta, j], arg[beta, j] = vals[k], cand[k]
    cuts = []
    j = n
    for beta in range(blocks, 1, -1):
        j = int(arg[beta, j])
        cuts.append(j)
    cuts.reverse()
    value, log_value = evaluate(t, cuts, a)
    return FlatSolution(cuts=tuple(cuts), value=value, log_value=log_value, method="naive")


def naive_penalized(times: Sequence[float] | np.ndarray, cut_costs: Sequence[float],
                    a: float) -> FlatSolution:
    """``F(j) = min_i F(i) + cost(i+1, j) + c_j`` over all ``i`` (``O(n²)``)."""
    t = np.asarray(times, dtype=float)
    n = t.size
    prefix = np.concatenate(([0.0], np.cumsum(t)))
    pen = np.concatenate(([0.0], np.asarray(cut_costs, dtype=float), [0.0]))
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    arg = np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        d = prefix[j] - prefix[:j]
        with np.errstate(over="ignore", invalid="ignore"):
            vals = f[:j] + 0.5 * d * np.expm1(a * d)
        k = int(np.argmin(vals))
        f[j], arg[j] = vals[k] + pen[j], k
    cuts = []
    j = int(arg[n])
    while j > 0:
        cuts.append(j)
        j = int(arg[j])
    cuts.reverse()
    value, log_value = evaluate(t, cuts, a)
    return FlatSolution(cuts=tuple(cuts), value=value, log_value=log_value, method="naive")
