"""The baselines the suite measures the planner against, written from their public descriptions.

They are yardsticks, not library features; each returns a :class:`~omnibal_kernels.balance.Plan`, so the
same ``balance_report`` and the same step-time simulation apply to every method.

* ``random_padded_plan``: what a plain ``DataLoader`` with ``DistributedSampler`` does: a seeded
  permutation, padded to a whole number of steps by repeating its first samples (as ``DistributedSampler``
  pads), cut into micro-batches of ``batch_size`` samples; rank ``r`` of step ``s`` gets micro-batch
  ``s * world_size + r``. Trained padded to the longest sample of each micro-batch. It lives in
  :mod:`omnibal_kernels.balance.padded`, below the whole-run comparison of :mod:`omnibal_kernels.omniverse`.
* ``length_grouped_plan``: LLaVA's length-grouped sampling (``get_length_grouped_indices``): the same
  padded permutation cut into megabatches of ``world_size * batch_size`` samples, each sorted by LLM length,
  longest first, and dealt into ``world_size`` micro-batches of ``batch_size`` samples, every sample going
  to the micro-batch with the smallest total length so far; the megabatch holding the longest sample goes
  first. One megabatch is one step. Trained padded, like the random baseline.
* ``ffd_tokens_plan``: first-fit decreasing on LLM tokens only (the usual 1-D sequence packing): samples
  by decreasing token count, each into the first pack with room under ``llm_capacity``; ViT load is not
  looked at, so packs may exceed the ViT capacity (``over_vit_capacity`` counts them). Packs go to ranks in
  random order; a ragged last step reuses packs from the start of that order (reported as duplicated).
* ``karmarkar_karp_plan``: the cost balancer veRL and slime ship (``balance_batch`` / ``balance_data``, then
  dynamic micro-batches): the same padded permutation cut into global batches of ``world_size * batch_size``
  samples; each global batch is split into ``world_size`` parts of ``batch_size`` samples by the largest
  differencing method (Karmarkar-Karp) on per-sample cost; every rank then cuts its part into ``m`` micro-batches,
  ``m`` = the largest ``ceil(tokens / llm_capacity)`` over the ranks of the batch (the ranks agree on it, as
  veRL's all-reduce of the count does; at most ``batch_size``), again by Karmarkar-Karp on cost. The token cap
  only sets ``m``: a micro-batch may exceed it, and the ViT load is not looked at (``over_vit_capacity``,
  ``over_llm_capacity`` count such packs). Micro-batch ``j`` of every rank is plan step ``j`` of its global
  batch (heaviest first); a rank's time in a global batch is the sum of its micro-batches
  (:func:`accumulated_step_costs`).
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import numba
import numpy as np

from .._csr import offsets_from_counts
from ..balance import Plan
from ..balance.padded import check_inputs as _check
from ..balance.padded import fixed_size_plan as _uniform_plan
from ..balance.padded import padded_permutation as _padded_permutation
from ..balance.padded import random_padded_plan
from ..lengths import Lengths

__all__ = [
    "random_padded_plan",
    "length_grouped_plan",
    "ffd_tokens_plan",
    "karmarkar_karp_plan",
    "KarmarkarKarpPlan",
    "accumulated_step_costs",
    "verl_workload",
    "over_vit_capacity",
    "over_llm_capacity",
    "warmup",
]


def length_grouped_plan(
    lengths: Lengths, *, world_size: int, batch_size: int, capacities: tuple[int, int] = (0, 0), seed: int = 0
) -> Plan:
    """LLaVA-style length-grouped micro-batches of ``batch_size`` samples (see the module docstring).

    Args: as :func:`random_padded_plan`.
    """
    start = time.perf_counter()
    _check(lengths, world_size, batch_size)
    n = len(lengths)
    mega = world_size * batch_size
    order = _padded_permutation(n, mega, seed).reshape(-1, mega)
    repeated = (np.arange(order.size) >= n).reshape(order.shape)
    tokens = lengths.llm[order]
    # longest first within each megabatch (stable, so ties keep the permutation's order)
    by_length = np.argsort(-tokens, axis=1, kind="stable")
    order = np.take_along_axis(order, by_length, axis=1)
    repeated = np.take_along_axis(repeated, by_length, axis=1)
    tokens = np.take_along_axis(tokens, by_length, axis=1)
    # Deal every megabatch at once: sample j goes to the open micro-batch (fewer than batch_size samples)
    # with the smallest token total so far, the lowest index on ties.
    num_mega = order.shape[0]
    totals = np.zeros((num_mega, world_size), np.int64)
    counts = np.zeros((num_mega, world_size), np.int64)
    chunks = np.empty((num_mega, world_size, batch_size), np.int64)
    chunk_repeated = np.empty((num_mega, world_size, batch_size), bool)
    rows = np.arange(num_mega)
    big = np.iinfo(np.int64).max
    for j in range(mega):
        target = np.argmin(np.where(counts < batch_size, totals, big), axis=1)
        chunks[rows, target, counts[rows, target]] = order[:, j]
        chunk_repeated[rows, target, counts[rows, target]] = repeated[:, j]
        totals[rows, target] += tokens[:, j]
        counts[rows, target] += 1
    # the megabatch with the longest sample goes first (its position 0 is its longest)
    first = int(np.argmax(tokens[:, 0]))
    step_order = np.concatenate([[first], np.delete(np.arange(num_mega), first)])
    return _uniform_plan(
        "length_grouped",
        chunks[step_order].reshape(-1),
        chunk_repeated[step_order].reshape(-1),
        n,
        world_size,
        batch_size,
        capacities,
        seed,
        start,
    )


@numba.njit(cache=True)
def _first_fit(sizes: np.ndarray, capacity: int) -> np.ndarray:  # pragma: no cover - compiled
    """Pack index of each item, first fit in the given order; a max-tree over the bins' free room finds the
    leftmost bin with room in O(log bins)."""
    n = sizes.shape[0]
    leaves = 1
    while leaves < n:
        leaves *= 2
    tree = np.full(2 * leaves, capacity, np.int64)  # every bin (up to n of them) starts empty
    out = np.empty(n, np.int64)
    used = 0
    for i in range(n):
        size = sizes[i]
        node = 1
        while node < leaves:
            node = 2 * node if tree[2 * node] >= size else 2 * node + 1
        b = node - leaves
        out[i] = b
        if b >= used:
            used = b + 1
        tree[node] -= size
        node //= 2
        while node >= 1:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return out


def warmup() -> None:
    """Compiles (or loads from numba's cache) the kernels, so timed calls do not pay for it."""
    _first_fit(np.ones(2, np.int64), 2)
    _kk_global_batches(np.ones(4), np.ones(4, np.int64), 2, 2, 1)


def ffd_tokens_plan(
    lengths: Lengths, *, world_size: int, llm_capacity: int, vit_capacity: int = 0, seed: int = 0
) -> Plan:
    """First-fit decreasing on tokens only (see the module docstring).

    Args:
        lengths: per-sample loads; every sample must fit ``llm_capacity``.
        world_size: data-parallel ranks.
        llm_capacity: tokens per pack.
        vit_capacity: recorded on the plan (not enforced: that is the point of this baseline).
        seed: seed of the pack order.

    Raises:
        ValueError: a sample alone exceeds ``llm_capacity`` (naming it), or bad sizes.
    """
    start = time.perf_counter()
    _check(lengths, world_size, 1)
    if int(llm_capacity) < 1:
        raise ValueError(f"llm_capacity must be >= 1, got {llm_capacity!r}")
    n = len(lengths)
    over = np.flatnonzero(lengths.llm > llm_capacity)
    if over.size:
        raise ValueError(
            f"sample {int(over[0])} has {int(lengths.llm[over[0]])} tokens, over llm_capacity "
            f"{llm_capacity} ({over.size} such samples)"
        )
    order = np.argsort(-lengths.llm, kind="stable").astype(np.int64)
    bins = _first_fit(np.ascontiguousarray(lengths.llm[order]), int(llm_capacity))
    by_bin = np.argsort(bins, kind="stable")
    samples = order[by_bin]
    num_packs = int(bins.max()) + 1
    offsets = offsets_from_counts(np.bincount(bins, minlength=num_packs))
    pack_order = np.random.default_rng(seed).permutation(num_packs).astype(np.int64)
    extra = (-num_packs) % world_size
    slots = np.concatenate([pack_order, np.resize(pack_order, extra)]) if extra else pack_order
    return Plan(
        method="ffd_tokens",
        pack_offsets=offsets,
        pack_samples=samples,
        step_packs=slots.reshape(-1, world_size),
        world_size=world_size,
        vit_capacity=int(vit_capacity),
        llm_capacity=int(llm_capacity),
        seed=seed,
        duplicated_slots=int(extra),
        num_input_samples=n,
        seconds=time.perf_counter() - start,
    )


@numba.njit(cache=True)
def _kk_before(spread: np.ndarray, top: np.ndarray, a: int, b: int) -> bool:  # pragma: no cover - compiled
    """Whether state ``a`` is merged before state ``b``: larger spread, then larger largest set, then lower id."""
    if spread[a] != spread[b]:
        return spread[a] > spread[b]
    if top[a] != top[b]:
        return top[a] > top[b]
    return a < b


@numba.njit(cache=True)
def _kk_sift_down(
    heap: np.ndarray, size: int, pos: int, spread: np.ndarray, top: np.ndarray
) -> None:  # pragma: no cover - compiled
    while True:
        first = pos
        for child in (2 * pos + 1, 2 * pos + 2):
            if child < size and _kk_before(spread, top, heap[child], heap[first]):
                first = child
        if first == pos:
            return
        heap[pos], heap[first] = heap[first], heap[pos]
        pos = first


@numba.njit(cache=True)
def _kk_parts(costs: np.ndarray, k: int, equal_size: bool, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """The largest differencing method into ``k`` parts: ``out[i]`` is item ``i``'s part, part 0 the heaviest.

    A state is ``k`` sets, heaviest first. ``equal_size``: the items by increasing cost, ``k`` at a time, make
    the first states (every part then gets ``n / k`` items); else every item is a state of its own beside
    ``k - 1`` empty sets. The state of largest spread (largest minus smallest set) is merged with the next
    one, largest set with smallest, until one state is left. A set is a linked list of items, so a merge
    costs ``O(k log k)``.
    """
    n = costs.shape[0]
    order = np.argsort(costs, kind="mergesort")
    num_states = n // k if equal_size else n
    states = np.full((num_states, k), -1, np.int64)  # set ids (the id of a set's first item), -1: empty
    set_sum = costs.astype(np.float64)
    tail = np.arange(n)
    nxt = np.full(n, -1, np.int64)
    spread = np.zeros(num_states)
    top = np.zeros(num_states)
    for r in range(num_states):
        if equal_size:
            for j in range(k):
                states[r, j] = order[r * k + k - 1 - j]
        else:
            states[r, 0] = order[r]
        top[r] = set_sum[states[r, 0]]
        last = states[r, k - 1]
        spread[r] = top[r] - (set_sum[last] if last >= 0 else 0.0)
    heap = np.arange(num_states)
    for pos in range(num_states // 2 - 1, -1, -1):
        _kk_sift_down(heap, num_states, pos, spread, top)
    size = num_states
    sums = np.empty(k)
    while size > 1:
        s0 = heap[0]
        heap[0] = heap[size - 1]
        size -= 1
        _kk_sift_down(heap, size, 0, spread, top)
        s1 = heap[0]
        for j in range(k):
            a, b = states[s0, j], states[s1, k - 1 - j]
            if b < 0:
                continue
            if a < 0:
                states[s0, j] = b
                continue
            nxt[tail[a]] = b
            tail[a] = tail[b]
            set_sum[a] += set_sum[b]
        for j in range(k):
            sums[j] = -set_sum[states[s0, j]] if states[s0, j] >= 0 else 0.0
        states[s0] = states[s0][np.argsort(sums, kind="mergesort")]
        top[s0] = set_sum[states[s0, 0]]
        last = states[s0, k - 1]
        spread[s0] = top[s0] - (set_sum[last] if last >= 0 else 0.0)
        heap[0] = s0  # s1 is merged into s0: s0 takes its place
        _kk_sift_down(heap, size, 0, spread, top)
    final = heap[0]
    for j in range(k):
        i = states[final, j]
        while i >= 0:
            out[i] = j
            i = nxt[i]


@numba.njit(cache=True)
def _kk_global_batches(
    costs: np.ndarray, llm: np.ndarray, world_size: int, batch_size: int, llm_capacity: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """Rank and micro-batch of every sample (global batch after global batch), and each batch's micro-batches."""
    group = world_size * batch_size
    batches = costs.shape[0] // group
    rank = np.empty(costs.shape[0], np.int64)
    micro = np.zeros(costs.shape[0], np.int64)
    micro_count = np.empty(batches, np.int64)
    part = np.empty(group, np.int64)
    sub = np.empty(batch_size, np.int64)
    for g in range(batches):
        lo = g * group
        _kk_parts(costs[lo : lo + group], world_size, True, part)
        tokens = np.zeros(world_size, np.int64)
        for i in range(group):
            rank[lo + i] = part[i]
            tokens[part[i]] += llm[lo + i]
        m = 1
        for r in range(world_size):
            m = max(m, (tokens[r] + llm_capacity - 1) // llm_capacity)
        m = min(m, batch_size)
        micro_count[g] = m
        if m == 1:
            continue
        for r in range(world_size):
            members = lo + np.flatnonzero(part == r)
            _kk_parts(costs[members], m, False, sub)
            micro[members] = sub
    return rank, micro, micro_count


def verl_workload(llm: np.ndarray) -> np.ndarray:
    """(N,) float64: veRL's default workload of a sequence of ``t`` tokens, ``24576 * t + t**2`` (the FLOPs of a
    hidden-4096 dense transformer up to a factor)."""
    t = np.asarray(llm, dtype=np.float64)
    return 24576.0 * t + t * t


class KarmarkarKarpPlan(NamedTuple):
    """A :func:`karmarkar_karp_plan`: the plan, and the micro-steps of every global batch.

    Attributes:
        plan: micro-batch ``j`` of the ranks of global batch ``g`` is plan step ``micro_offsets[g] + j``.
        micro_offsets: ``(num_global_batches + 1,)`` int64, from 0: the plan steps of each global batch.
    """

    plan: Plan
    micro_offsets: np.ndarray


def karmarkar_karp_plan(
    lengths: Lengths,
    *,
    world_size: int,
    batch_size: int,
    llm_capacity: int,
    vit_capacity: int = 0,
    costs: Optional[np.ndarray] = None,
    seed: int = 0,
) -> KarmarkarKarpPlan:
    """veRL's and slime's cost balancing: Karmarkar-Karp per global batch, then micro-batches under a token
    cap (see the module docstring).

    Args:
        lengths: per-sample loads.
        world_size: data-parallel ranks.
        batch_size: samples per rank per global batch.
        llm_capacity: the token cap per micro-batch (it sets the number of micro-batches).
        vit_capacity: recorded on the plan (not enforced).
        costs: ``(N,)`` per-sample cost to balance (default :func:`verl_workload` of the tokens).
        seed: seed of the permutation.

    Raises:
        ValueError: a sample alone over ``llm_capacity`` (naming it), bad sizes, or ``costs`` not ``(N,)``
            finite and non-negative.
    """
    start = time.perf_counter()
    _check(lengths, world_size, batch_size)
    if isinstance(llm_capacity, bool) or not isinstance(llm_capacity, (int, np.integer)) or llm_capacity < 1:
        raise ValueError(f"llm_capacity must be a positive int, got {llm_capacity!r}")
    n = len(lengths)
    over = np.flatnonzero(lengths.llm > llm_capacity)
    if over.size:  # veRL requires the cap to hold the longest sequence
        raise ValueError(
            f"sample {int(over[0])} has {int(lengths.llm[over[0]])} tokens, over llm_capacity "
            f"{llm_capacity} ({over.size} such samples)"
        )
    costs = verl_workload(lengths.llm) if costs is None else np.asarray(costs, dtype=np.float64)
    if costs.shape != (n,) or not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError(f"costs must be ({n},) finite and non-negative, got shape {costs.shape}")
    group = world_size * batch_size
    order = _padded_permutation(n, group, seed)
    rank, micro, micro_count = _kk_global_batches(
        np.ascontiguousarray(costs[order]),
        np.ascontiguousarray(lengths.llm[order]),
        world_size,
        batch_size,
        int(llm_capacity),
    )
    steps = offsets_from_counts(micro_count)
    batch = np.arange(order.size) // group
    pack = (steps[batch] + micro) * world_size + rank  # micro-step j of rank r: pack (step, r)
    by_pack = np.argsort(pack, kind="stable")
    num_packs = int(steps[-1]) * world_size
    offsets = offsets_from_counts(np.bincount(pack, minlength=num_packs))
    repeated = np.zeros(num_packs, bool)
    repeated[pack[n:]] = True
    plan = Plan(
        method="karmarkar_karp",
        pack_offsets=offsets,
        pack_samples=order[by_pack],
        step_packs=np.arange(num_packs, dtype=np.int64).reshape(-1, world_size),
        world_size=world_size,
        vit_capacity=int(vit_capacity),
        llm_capacity=int(llm_capacity),
        seed=seed,
        duplicated_slots=int(repeated.sum()),
        num_input_samples=n,
        seconds=time.perf_counter() - start,
    )
    return KarmarkarKarpPlan(plan, steps)


def accumulated_step_costs(result: KarmarkarKarpPlan, pack_costs: np.ndarray) -> np.ndarray:
    """(num_global_batches, world_size): each rank's time in each global batch, the sum of its micro-batches'
    ``pack_costs`` (``(num_packs,)``); the epoch is the sum over global batches of the slowest rank."""
    per_step = np.asarray(pack_costs, dtype=np.float64)[result.plan.step_packs]
    return np.add.reduceat(per_step, result.micro_offsets[:-1], axis=0)


def _over_capacity(plan: Plan, loads: np.ndarray, capacity: int) -> float:
    sizes = plan.pack_sizes()
    totals = np.zeros(plan.num_packs, np.int64)
    nonempty = sizes > 0
    totals[nonempty] = np.add.reduceat(loads[plan.pack_samples], plan.pack_offsets[:-1][nonempty])
    scheduled = np.unique(plan.step_packs)
    return float(np.mean(totals[scheduled] > capacity)) if scheduled.size else 0.0


def over_vit_capacity(plan: Plan, lengths: Lengths) -> float:
    """Share of the plan's distinct scheduled packs whose ViT load exceeds ``plan.vit_capacity``."""
    return _over_capacity(plan, lengths.vit, plan.vit_capacity)


def over_llm_capacity(plan: Plan, lengths: Lengths) -> float:
    """Share of the plan's distinct scheduled packs whose LLM load exceeds ``plan.llm_capacity``."""
    return _over_capacity(plan, lengths.llm, plan.llm_capacity)
