"""The semantics of a training run: which sample IDs each step and rank consume.

This module is the single definition both the runtime (which feeds data) and the verifier (which
checks the logs) rely on, so it must stay torch-free and exact. See ``docs/semantics.md``.

Geometry. A run over ``D`` samples with constant global batch ``B`` has ``S = D // B`` steps per
epoch and uses ``N = S * B`` samples per epoch; global step ``g`` is ``divmod(g, S)`` =
``(epoch, cursor_step)``. The trailing ``D - N`` positions of each epoch's order are never used.

Order. Epoch ``e`` visits the samples in the order of ``perm_e``, a keyed bijection on ``[0, D)``
derived from ``(seed, epoch)``. It is stateless with random access: ``perm_e(i)`` costs O(1) time
and memory for any position ``i``, so resuming at step 10^9 of an epoch of 10^10 samples is as
cheap as starting one. The construction is a generalised Feistel network on the ``k`` bits of the
smallest power of two ``2^k >= D`` (``k >= 2``), split into a high half of ``k - k//2`` bits and a
low half of ``k//2`` bits. Half-round ``i`` XORs ``mix64(other_half ^ key_i)`` (masked to the
width) into the high half for even ``i`` and into the low half for odd ``i``; each half-round is its
own inverse given the other half, so the network is a bijection on ``[0, 2^k)``. Positions that land
in ``[D, 2^k)`` are walked through the network again (cycle walking) until they land in ``[0, D)``;
because ``2^k < 2D`` this takes fewer than two passes on average, and it always terminates because
the walk follows the cycle of a permutation, which must return to ``[0, D)``.

Keys: ``epoch_key = mix64(mix64(seed) ^ epoch)`` and ``key_i = mix64((epoch_key + i) mod 2^64)``.

Windows and shards. Step ``s`` of epoch ``e`` consumes ``perm_e[s*B : (s+1)*B]``; rank ``r`` of a
world of ``W`` ranks takes the contiguous ``window[r*L : (r+1)*L]`` with ``L = B / W``. The window
does not depend on ``W``, which is what makes a resume at another world size exact.

Meshes. Under FSDP, HSDP or tensor parallelism the window is split over the *data-parallel*
ranks, not over all ranks: with a tensor-parallel degree ``TP`` the data-parallel degree is
``DP = W / TP`` (the product of the replicate and shard dimensions), ``L = B / DP``, data-parallel
rank ``d`` takes ``window[d*L : (d+1)*L]`` and the ``TP`` ranks that share ``d`` consume the
identical shard (:class:`MeshCoords`, :func:`mesh_shard`). DDP is ``TP = 1``, ``d = rank``.

Hash. ``hash(ids) = sum(mix64(i)) mod 2^64`` is order-independent and additive, so the shards of
any world size sum to the window's hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from ecrl.contract.errors import SemanticsError

try:  # the permutation and hash kernels compiled (an optional build, setup.py); else numpy's
    import ecrl.contract._native as native
except ImportError:  # pragma: no cover - a build without a C compiler
    native = None  # type: ignore[assignment]

__all__ = [
    "PERMUTATION_ALGORITHM",
    "PERMUTATION_VERSION",
    "MAX_DATASET_SIZE",
    "MAX_SEED",
    "Geometry",
    "local_batch",
    "EpochPermutation",
    "SamplerState",
    "mix64",
    "mix64_int",
    "epoch_permutation",
    "permuted_positions",
    "window",
    "shard",
    "shard_block",
    "shard_hashes",
    "ids_hash",
    "batch_ids_hash",
    "int_ids_hash",
    "ids_hashes",
    "format_hash",
    "parse_hash",
    "combine_hashes",
    "MeshCoords",
    "data_parallel_degree",
    "mesh_local_batch",
    "mesh_shard",
]

PERMUTATION_ALGORITHM = "feistel-cyclewalk-mix64"
"""Name recorded in ``run.json`` so a verifier never checks logs against another order."""
PERMUTATION_VERSION = 1
FEISTEL_HALF_ROUNDS = 8

MAX_DATASET_SIZE = 1 << 62
"""Sample IDs must fit in int64 with room to spare; 4.6e18 samples is not a practical limit."""
MAX_SEED = (1 << 63) - 1

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_CHUNK = 1 << 16  # positions per vectorised pass: keeps the temporaries in cache

IdArray = npt.NDArray[np.int64]


def mix64_int(z: int) -> int:
    """The splitmix64 finalizer on one Python integer (taken mod 2^64)."""
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)


_U_GOLDEN = np.uint64(_GOLDEN)
_U_MUL1 = np.uint64(_MUL1)
_U_MUL2 = np.uint64(_MUL2)
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix64_inplace(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z += _U_GOLDEN
    z ^= z >> _U30
    z *= _U_MUL1
    z ^= z >> _U27
    z *= _U_MUL2
    z ^= z >> _U31
    return z


def mix64(values: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """The splitmix64 finalizer, elementwise over an array (uint64 arithmetic wraps mod 2^64)."""
    return _mix64_inplace(np.asarray(values).astype(np.uint64, copy=True))


def _check_int(name: str, value: object, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SemanticsError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise SemanticsError(f"{name} must be in [{low}, {high}], got {value}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Geometry:
    """Epoch geometry of a run; constant across every restart and world-size change."""

    dataset_size: int
    """D: number of samples; IDs are 0..D-1."""
    global_batch: int
    """B: samples per step summed over all ranks."""

    def __post_init__(self) -> None:
        d = _check_int("dataset size", self.dataset_size, low=1, high=MAX_DATASET_SIZE)
        b = _check_int("global batch", self.global_batch, low=1, high=MAX_DATASET_SIZE)
        if b > d:
            raise SemanticsError(
                f"global batch {b} is larger than the dataset ({d} samples): an epoch would have "
                "no step; lower --global-batch or use a larger dataset"
            )
        object.__setattr__(self, "dataset_size", d)
        object.__setattr__(self, "global_batch", b)

    @property
    def steps_per_epoch(self) -> int:
        """S = floor(D / B)."""
        return self.dataset_size // self.global_batch

    @property
    def samples_per_epoch(self) -> int:
        """N = S * B; the last D - N positions of each epoch's order are not used."""
        return self.steps_per_epoch * self.global_batch

    def locate(self, global_step: int) -> tuple[int, int]:
        """``(epoch, cursor_step) = divmod(global_step, S)``."""
        g = _check_int("global step", global_step, low=0, high=_MASK64)
        epoch, cursor = divmod(g, self.steps_per_epoch)
        return epoch, cursor

    def global_step(self, epoch: int, cursor_step: int) -> int:
        """Inverse of :meth:`locate`."""
        e = _check_int("epoch", epoch, low=0, high=_MASK64)
        c = _check_int("cursor step", cursor_step, low=0, high=self.steps_per_epoch - 1)
        return e * self.steps_per_epoch + c

    def local_batch(self, world_size: int) -> int:
        """L = B / W, after checking that W divides B."""
        return local_batch(self.global_batch, world_size)

    def as_dict(self) -> dict[str, int]:
        return {
            "dataset_size": self.dataset_size,
            "global_batch": self.global_batch,
            "steps_per_epoch": self.steps_per_epoch,
        }


def local_batch(global_batch: int, world_size: int) -> int:
    """L = B / W: the one place that checks that W divides B, with the standard message."""
    b = _check_int("global batch", global_batch, low=1, high=MAX_DATASET_SIZE)
    w = _check_int("world size", world_size, low=1, high=b)
    if b % w:
        raise SemanticsError(
            f"global batch {b} is not divisible by world size {w}: choose a world size among "
            f"{_divisors(b)} or another global batch"
        )
    return b // w


def _divisors(n: int, limit: int = 8) -> str:
    found = [d for d in range(1, min(n, 4096) + 1) if n % d == 0][:limit]
    return ", ".join(map(str, found)) + (", …" if len(found) == limit else "")


class EpochPermutation:
    """``perm_e`` for one ``(seed, epoch, D)``: call it with positions to get sample IDs."""

    __slots__ = ("dataset_size", "seed", "epoch", "_keys", "_low_bits", "_low_mask", "_high_mask",
                 "_native_network")

    def __init__(self, *, dataset_size: int, seed: int, epoch: int) -> None:
        self.dataset_size = _check_int("dataset size", dataset_size, low=1, high=MAX_DATASET_SIZE)
        self.seed = _check_int("seed", seed, low=0, high=MAX_SEED)
        self.epoch = _check_int("epoch", epoch, low=0, high=_MASK64)
        bits = max(2, (self.dataset_size - 1).bit_length())
        low = bits // 2
        high = bits - low
        self._low_bits = np.uint64(low)
        self._low_mask = np.uint64((1 << low) - 1)
        self._high_mask = np.uint64((1 << high) - 1)
        epoch_key = mix64_int(mix64_int(self.seed) ^ self.epoch)
        self._keys = [
            np.uint64(mix64_int((epoch_key + i) & _MASK64)) for i in range(FEISTEL_HALF_ROUNDS)
        ]
        self._native_network = (np.array(self._keys, dtype=np.uint64), low, (1 << low) - 1,
                                (1 << high) - 1, self.dataset_size)

    def _network(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        # In-place ufuncs on one scratch buffer: allocation, not arithmetic, dominated the
        # straightforward version (7 vs 27 million IDs/s on one core).
        high = x >> self._low_bits
        low = x & self._low_mask
        scratch = np.empty_like(x)
        for i, key in enumerate(self._keys):
            source, target, mask = (low, high, self._high_mask) if i % 2 == 0 else (
                high, low, self._low_mask)
            np.bitwise_xor(source, key, out=scratch)
            _mix64_inplace(scratch)
            scratch &= mask
            target ^= scratch
        high <<= self._low_bits
        high |= low
        return high

    def _ids(self, flat: npt.NDArray[np.uint64], out: npt.NDArray[np.int64]) -> None:
        if native is not None and out.flags.c_contiguous:
            native.feistel(*self._native_network, np.ascontiguousarray(flat), out)
            return
        limit = np.uint64(self.dataset_size)
        for start in range(0, flat.size, _CHUNK):
            y = self._network(flat[start : start + _CHUNK])
            walking = np.flatnonzero(y >= limit)
            while walking.size:
                stepped = self._network(y[walking])
                y[walking] = stepped
                walking = walking[stepped >= limit]
            out[start : start + y.size] = y.view(np.int64)

    def __call__(self, positions: npt.ArrayLike) -> IdArray:
        """Sample IDs at ``positions`` (each in ``[0, D)``) of this epoch's order."""
        pos = np.asarray(positions)
        if pos.size and (pos.min() < 0 or pos.max() >= self.dataset_size):
            raise SemanticsError(
                f"positions must lie in [0, {self.dataset_size}), got "
                f"[{pos.min()}, {pos.max()}]"
            )
        out = np.empty(pos.size, dtype=np.int64)
        self._ids(pos.astype(np.uint64).ravel(), out)
        return out.reshape(pos.shape)

    def range(self, start: int, stop: int) -> IdArray:
        """IDs at positions ``start .. stop-1``, built one cache-sized chunk at a time."""
        if not 0 <= start <= stop <= self.dataset_size:
            raise SemanticsError(
                f"position range [{start}, {stop}) is not inside [0, {self.dataset_size})"
            )
        out = np.empty(stop - start, dtype=np.int64)
        for lo in range(start, stop, _CHUNK):
            hi = min(stop, lo + _CHUNK)
            self._ids(np.arange(lo, hi, dtype=np.uint64), out[lo - start : hi - start])
        return out


@lru_cache(maxsize=64)
def epoch_permutation(*, dataset_size: int, seed: int, epoch: int) -> EpochPermutation:
    """A cached :class:`EpochPermutation` (building one costs a few microseconds)."""
    return EpochPermutation(dataset_size=dataset_size, seed=seed, epoch=epoch)


def permuted_positions(
    geometry: Geometry, seed: int, epoch: int, start: int, stop: int
) -> IdArray:
    """IDs at positions ``[start, stop)`` of epoch ``epoch``'s order."""
    perm = epoch_permutation(dataset_size=geometry.dataset_size, seed=seed, epoch=epoch)
    return perm.range(start, stop)


def window(geometry: Geometry, seed: int, global_step: int) -> IdArray:
    """The B sample IDs global step ``global_step`` consumes, over all ranks."""
    epoch, cursor = geometry.locate(global_step)
    b = geometry.global_batch
    return permuted_positions(geometry, seed, epoch, cursor * b, (cursor + 1) * b)


def shard(
    geometry: Geometry, seed: int, global_step: int, rank: int, world_size: int
) -> IdArray:
    """The L = B/W IDs rank ``rank`` of ``world_size`` consumes at ``global_step``."""
    local = geometry.local_batch(world_size)
    r = _check_int("rank", rank, low=0, high=world_size - 1)
    epoch, cursor = geometry.locate(global_step)
    start = cursor * geometry.global_batch + r * local
    return permuted_positions(geometry, seed, epoch, start, start + local)


def shard_block(
    geometry: Geometry, seed: int, global_steps: npt.ArrayLike, rank: int, world_size: int
) -> IdArray:
    """Row ``i`` is the shard ``rank`` of ``world_size`` consumes at ``global_steps[i]``.

    The same IDs as :func:`shard` step by step, computed in one vectorised pass per epoch the
    steps touch: a checker that validates millions of steps cannot pay numpy's per-call
    overhead once per step. Steps may come in any order and repeat; shape is ``(n, B / W)``.
    """
    local = geometry.local_batch(world_size)
    r = _check_int("rank", rank, low=0, high=world_size - 1)
    steps = np.asarray(global_steps, dtype=np.int64).ravel()
    out = np.empty((steps.size, local), dtype=np.int64)
    if steps.size == 0:
        return out
    if steps.min() < 0:
        raise SemanticsError(f"global steps must be non-negative, got {int(steps.min())}")
    s = geometry.steps_per_epoch
    b = geometry.global_batch
    epochs = steps // s
    offsets = np.arange(local, dtype=np.int64) + r * local
    # Sorted input (the common case) is split into epoch runs without a sort.
    ordered = bool(np.all(epochs[1:] >= epochs[:-1]))
    order = None if ordered else np.argsort(epochs, kind="stable")
    sorted_epochs = epochs if order is None else epochs[order]
    bounds = np.flatnonzero(sorted_epochs[1:] != sorted_epochs[:-1]) + 1
    for lo, hi in zip([0, *bounds.tolist()], [*bounds.tolist(), steps.size], strict=True):
        epoch = int(sorted_epochs[lo])
        rows = slice(lo, hi) if order is None else order[lo:hi]
        cursors = steps[rows] - epoch * s
        perm = epoch_permutation(dataset_size=geometry.dataset_size, seed=seed, epoch=epoch)
        out[rows] = perm(cursors[:, None] * b + offsets[None, :])
    return out


def shard_hashes(
    geometry: Geometry, seed: int, global_steps: npt.ArrayLike, rank: int, world_size: int
) -> npt.NDArray[np.uint64]:
    """:func:`ids_hash` of each row of :func:`shard_block` (what a hash-only log must record)."""
    return ids_hashes(shard_block(geometry, seed, global_steps, rank, world_size))


def ids_hash(ids: npt.ArrayLike) -> int:
    """``sum(mix64(i) for i in ids) mod 2^64`` (order-independent, additive over shards)."""
    arr = np.asarray(ids)
    if arr.size == 0:
        return 0
    # np.sum over uint64 wraps mod 2^64, which is exactly the multiset hash's addition.
    return int(mix64(arr.astype(np.uint64)).sum(dtype=np.uint64))


SMALL_HASH = 96
"""Without the compiled kernel, up to this many IDs the Python loop of :func:`int_ids_hash` beats
:func:`ids_hash`: a step log hashes one rank's batch per step, right after the model's step, when
the first numpy call costs about 80 µs (cold caches) and a Python loop over a few dozen integers a
third of that."""


def batch_ids_hash(ids: list[int]) -> int:
    """:func:`ids_hash` of one batch's IDs as a step log holds them (Python ints that fit int64),
    the fastest way here: the compiled kernel at any length where it was built, else the Python
    loop for a few dozen IDs and numpy beyond."""
    if native is not None or len(ids) <= SMALL_HASH:
        return int_ids_hash(ids)
    return ids_hash(np.asarray(ids, dtype=np.int64))


def int_ids_hash(ids: Sequence[int]) -> int:
    """:func:`ids_hash` of Python integers (the same value: a property test holds them equal),
    compiled where the kernels were built, else in plain Python."""
    if native is not None and type(ids) in (list, tuple):
        digest = native.list_hash(ids)  # type: ignore[arg-type]
        if digest is not None:
            return digest
    total = 0
    for z in ids:  # mix64_int, inlined: this loop is the step log's hot path
        z = (z + _GOLDEN) & _MASK64
        z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
        z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
        total += z ^ (z >> 31)
    return total & _MASK64


def ids_hashes(rows: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """:func:`ids_hash` of each row of a 2-D array of IDs, in one vectorised pass."""
    arr = np.asarray(rows)
    if arr.ndim != 2:
        raise SemanticsError(f"ids_hashes takes a 2-D array of IDs, got shape {arr.shape}")
    if arr.shape[1] == 0:
        return np.zeros(arr.shape[0], dtype=np.uint64)
    if native is not None and arr.dtype == np.int64:
        out = np.empty(arr.shape[0], dtype=np.uint64)
        native.row_hashes(np.ascontiguousarray(arr), out)
        return out
    return mix64(arr).sum(axis=1, dtype=np.uint64)


def format_hash(value: int) -> str:
    """16 lowercase hex digits, as logged."""
    return f"{value & _MASK64:016x}"


def parse_hash(text: str) -> int:
    """Inverse of :func:`format_hash`; rejects anything that is not 16 lowercase hex digits."""
    if len(text) != 16 or text.strip("0123456789abcdef"):
        raise SemanticsError(f"a sample-ID hash is 16 lowercase hex digits, got {text!r}")
    return int(text, 16)


def combine_hashes(hashes: Iterable[int]) -> int:
    """Hash of the union of disjoint shards: the sum of their hashes mod 2^64."""
    return sum(hashes) & _MASK64


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplerState:
    """What a checkpoint stores to resume the data order exactly: the next step to run."""

    epoch: int
    """Epoch of the next step."""
    cursor_step: int
    """Step within that epoch of the next step (0 <= cursor_step < S)."""
    seed: int
    """Permutation seed of the run."""
    geometry: Geometry
    """Geometry the state was built with; a resume must use the same one."""

    def __post_init__(self) -> None:
        _check_int("seed", self.seed, low=0, high=MAX_SEED)
        _check_int("epoch", self.epoch, low=0, high=_MASK64)
        _check_int("cursor step", self.cursor_step, low=0, high=self.geometry.steps_per_epoch - 1)

    @classmethod
    def at_step(cls, geometry: Geometry, seed: int, global_step: int) -> SamplerState:
        """The state whose next step is ``global_step``."""
        epoch, cursor = geometry.locate(global_step)
        return cls(epoch=epoch, cursor_step=cursor, seed=seed, geometry=geometry)

    @property
    def global_step(self) -> int:
        return self.geometry.global_step(self.epoch, self.cursor_step)

    def advanced(self) -> SamplerState:
        """The state after one more step."""
        return SamplerState.at_step(self.geometry, self.seed, self.global_step + 1)

    def shard(self, rank: int, world_size: int) -> IdArray:
        """IDs this state's step gives ``rank`` of ``world_size``."""
        return shard(self.geometry, self.seed, self.global_step, rank, world_size)

    def iter_shard_blocks(self, rank: int, world_size: int, *, ahead: int = 64
                          ) -> Iterator[tuple[int, IdArray]]:
        """``(first_global_step, block)`` from this state on, forever: row ``i`` of ``block`` is
        the shard of step ``first_global_step + i``; a block never crosses an epoch.

        Shards are computed ``ahead`` steps at a time in one vectorised call: per-call numpy
        overhead, not arithmetic, dominates a single 1,000-ID shard.
        """
        geometry = self.geometry
        local = geometry.local_batch(world_size)
        r = _check_int("rank", rank, low=0, high=world_size - 1)
        offsets = np.arange(local, dtype=np.uint64)
        step = self.global_step
        while True:
            epoch, cursor = geometry.locate(step)
            n = min(ahead, geometry.steps_per_epoch - cursor)
            starts = (np.arange(cursor, cursor + n, dtype=np.uint64)
                      * np.uint64(geometry.global_batch) + np.uint64(r * local))
            perm = epoch_permutation(dataset_size=geometry.dataset_size, seed=self.seed,
                                     epoch=epoch)
            yield step, perm(starts[:, None] + offsets[None, :])
            step += n

    def iter_shards(self, rank: int, world_size: int, *, ahead: int = 64
                    ) -> Iterator[tuple[int, IdArray]]:
        """``(global_step, shard)`` from this state on, forever (:meth:`iter_shard_blocks`)."""
        for first, block in self.iter_shard_blocks(rank, world_size, ahead=ahead):
            for i in range(block.shape[0]):
                yield first + i, block[i]

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor_step": self.cursor_step,
            "seed": self.seed,
            "geometry": self.geometry.as_dict(),
            "permutation": {"algorithm": PERMUTATION_ALGORITHM, "version": PERMUTATION_VERSION},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplerState:
        """Rebuild and validate a state written by :meth:`to_dict`."""
        try:
            geo = data["geometry"]
            perm = data["permutation"]
            geometry = Geometry(dataset_size=geo["dataset_size"], global_batch=geo["global_batch"])
            state = cls(
                epoch=data["epoch"],
                cursor_step=data["cursor_step"],
                seed=data["seed"],
                geometry=geometry,
            )
        except (KeyError, TypeError) as exc:
            raise SemanticsError(f"sampler state is missing or malformed: {exc!r}") from None
        if (perm.get("algorithm"), perm.get("version")) != (
            PERMUTATION_ALGORITHM,
            PERMUTATION_VERSION,
        ):
            raise SemanticsError(
                f"sampler state uses permutation {perm!r}, this ECRL implements "
                f"{PERMUTATION_ALGORITHM} v{PERMUTATION_VERSION}: resume with the ECRL version "
                "that wrote it"
            )
        if geo.get("steps_per_epoch", geometry.steps_per_epoch) != geometry.steps_per_epoch:
            raise SemanticsError("sampler state's steps_per_epoch disagrees with its dataset size")
        return state


@dataclass(frozen=True, kw_only=True, slots=True)
class MeshCoords:
    """Where one rank sits in a (data-parallel × tensor-parallel) mesh: which shard it consumes.

    The data-parallel coordinate covers every dimension that splits the batch (HSDP's replicate
    and shard dimensions flattened, replicate outermost, as ``DeviceMesh._flatten`` numbers
    them); the tensor-parallel coordinate every dimension whose ranks share a batch.
    """

    dp_rank: int
    """d: which contiguous slice of the window this rank consumes."""
    dp_size: int
    """DP: data-parallel degree (slices per window)."""
    tp_rank: int = 0
    """This rank's place among the ranks that consume the same slice."""
    tp_size: int = 1
    """TP: ranks that consume each slice (1 without tensor parallelism)."""

    def __post_init__(self) -> None:
        dp = _check_int("data-parallel size", self.dp_size, low=1, high=MAX_DATASET_SIZE)
        tp = _check_int("tensor-parallel size", self.tp_size, low=1, high=MAX_DATASET_SIZE)
        object.__setattr__(self, "dp_size", dp)
        object.__setattr__(self, "tp_size", tp)
        object.__setattr__(self, "dp_rank",
                           _check_int("data-parallel rank", self.dp_rank, low=0, high=dp - 1))
        object.__setattr__(self, "tp_rank",
                           _check_int("tensor-parallel rank", self.tp_rank, low=0, high=tp - 1))

    @property
    def world_size(self) -> int:
        """W = DP × TP."""
        return self.dp_size * self.tp_size

    @classmethod
    def ddp(cls, rank: int, world_size: int) -> MeshCoords:
        """Plain data parallelism: every rank is a data-parallel rank (``TP = 1``)."""
        return cls(dp_rank=rank, dp_size=world_size)

    @classmethod
    def of_rank(cls, rank: int, world_size: int, *, tp_size: int = 1) -> MeshCoords:
        """The coordinates of global ``rank`` in a ``(DP, TP)`` mesh laid out as
        ``init_device_mesh(..., (DP, TP), mesh_dim_names=("dp", "tp"))`` lays it out:
        tensor-parallel peers are consecutive ranks (``rank = d * TP + t``)."""
        dp = data_parallel_degree(world_size, tp_size)
        r = _check_int("rank", rank, low=0, high=world_size - 1)
        return cls(dp_rank=r // tp_size, dp_size=dp, tp_rank=r % tp_size, tp_size=tp_size)

    def as_fields(self) -> dict[str, int]:
        """The step record's mesh fields (``docs/run-format.md``)."""
        return {"dp_rank": self.dp_rank, "dp_size": self.dp_size, "tp_rank": self.tp_rank,
                "tp_size": self.tp_size}


def data_parallel_degree(world_size: int, tp_size: int) -> int:
    """DP = W / TP, after checking that the tensor-parallel degree divides the world size."""
    w = _check_int("world size", world_size, low=1, high=MAX_DATASET_SIZE)
    tp = _check_int("tensor-parallel size", tp_size, low=1, high=MAX_DATASET_SIZE)
    if w % tp:
        raise SemanticsError(
            f"world size {w} is not divisible by the tensor-parallel size {tp}: a mesh needs "
            f"W = DP x TP; choose a tensor-parallel size among {_divisors(w)}")
    return w // tp


def mesh_local_batch(global_batch: int, dp_size: int) -> int:
    """L = B / DP: the samples each data-parallel rank (and each of its tensor-parallel peers)
    consumes per step, after checking that DP divides B."""
    b = _check_int("global batch", global_batch, low=1, high=MAX_DATASET_SIZE)
    dp = _check_int("data-parallel size", dp_size, low=1, high=MAX_DATASET_SIZE)
    if b % dp:
        raise SemanticsError(
            f"global batch {b} is not divisible by the data-parallel size {dp}: choose a "
            f"data-parallel size among {_divisors(b)} (DP = world size / tensor-parallel size) "
            "or another global batch")
    return b // dp


def mesh_shard(geometry: Geometry, seed: int, global_step: int, coords: MeshCoords) -> IdArray:
    """The ``B / DP`` IDs the rank at ``coords`` consumes at ``global_step``: data-parallel
    slice ``coords.dp_rank`` of the window, whatever its tensor-parallel coordinate."""
    mesh_local_batch(geometry.global_batch, coords.dp_size)
    return shard(geometry, seed, global_step, coords.dp_rank, coords.dp_size)
