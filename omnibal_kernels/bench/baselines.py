"""The baselines the suite measures the planner against, written from their public descriptions.

They are yardsticks, not library features; each returns a :class:`~omnibal_kernels.balance.Plan`, so the
same ``balance_report`` and the same step-time simulation apply to every method.

* ``random_padded_plan``: what a plain ``DataLoader`` with ``DistributedSampler`` does: a seeded
  permutation, padded to a whole number of steps by repeating its first samples (as ``DistributedSampler``
  pads), cut into micro-batches of ``batch_size`` samples; rank ``r`` of step ``s`` gets micro-batch
  ``s * world_size + r``. Trained padded to the longest sample of each micro-batch.
* ``length_grouped_plan``: LLaVA's length-grouped sampling (``get_length_grouped_indices``): the same
  padded permutation cut into megabatches of ``world_size * batch_size`` samples, each sorted by LLM length,
  longest first, and dealt into ``world_size`` micro-batches of ``batch_size`` samples, every sample going
  to the micro-batch with the smallest total length so far; the megabatch holding the longest sample goes
  first. One megabatch is one step. Trained padded, like the random baseline.
* ``ffd_tokens_plan``: first-fit decreasing on LLM tokens only (the usual 1-D sequence packing): samples
  by decreasing token count, each into the first pack with room under ``llm_capacity``; ViT load is not
  looked at, so packs may exceed the ViT capacity (``over_vit_capacity`` counts them). Packs go to ranks in
  random order; a ragged last step reuses packs from the start of that order (reported as duplicated).
"""
from __future__ import annotations

import time

import numba
import numpy as np

from ..balance import Plan
from ..lengths import Lengths

__all__ = ["random_padded_plan", "length_grouped_plan", "ffd_tokens_plan", "over_vit_capacity", "warmup"]


def _check(lengths: Lengths, world_size: int, batch_size: int) -> None:
    if not isinstance(lengths, Lengths):
        raise TypeError(f"lengths must be a Lengths, got {type(lengths).__name__}")
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    for name, value in (("world_size", world_size), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _padded_permutation(n: int, multiple: int, seed: int) -> np.ndarray:
    """A seeded permutation of ``range(n)`` extended by its own first entries to a multiple of ``multiple``."""
    perm = np.random.default_rng(seed).permutation(n).astype(np.int64)
    extra = (-n) % multiple
    if extra:
        perm = np.concatenate([perm, np.resize(perm, extra)])
    return perm


def _uniform_plan(method: str, order: np.ndarray, repeated: np.ndarray, n: int, world_size: int,
                  batch_size: int, capacities: tuple[int, int], seed: int, start: float) -> Plan:
    """Packs of ``batch_size`` consecutive entries of ``order``; step ``s`` holds packs ``s*W .. s*W+W-1``.
    ``repeated`` marks the entries that repeat a sample (the padding of the permutation)."""
    num_packs = order.size // batch_size
    duplicated = int(repeated.reshape(num_packs, batch_size).any(axis=1).sum())
    return Plan(
        method=method,
        pack_offsets=np.arange(num_packs + 1, dtype=np.int64) * batch_size,
        pack_samples=order,
        step_packs=np.arange(num_packs, dtype=np.int64).reshape(-1, world_size),
        world_size=world_size,
        vit_capacity=int(capacities[0]),
        llm_capacity=int(capacities[1]),
        seed=seed,
        duplicated_slots=duplicated,
        num_input_samples=n,
        seconds=time.perf_counter() - start,
    )


def random_padded_plan(lengths: Lengths, *, world_size: int, batch_size: int,
                       capacities: tuple[int, int] = (0, 0), seed: int = 0) -> Plan:
    """Random micro-batches of ``batch_size`` samples (see the module docstring).

    Args:
        lengths: per-sample loads.
        world_size: data-parallel ranks.
        batch_size: samples per micro-batch.
        capacities: ``(vit, llm)`` recorded on the plan so fills compare with the packed methods.
        seed: seed of the permutation.
    """
    start = time.perf_counter()
    _check(lengths, world_size, batch_size)
    n = len(lengths)
    order = _padded_permutation(n, world_size * batch_size, seed)
    repeated = np.arange(order.size) >= n
    return _uniform_plan("random_padded", order, repeated, n, world_size, batch_size, capacities, seed, start)


def length_grouped_plan(lengths: Lengths, *, world_size: int, batch_size: int,
                        capacities: tuple[int, int] = (0, 0), seed: int = 0) -> Plan:
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
    return _uniform_plan("length_grouped", chunks[step_order].reshape(-1), chunk_repeated[step_order].reshape(-1),
                         n, world_size, batch_size, capacities, seed, start)


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
    """Compiles (or loads from numba's cache) the first-fit kernel, so timed calls do not pay for it."""
    _first_fit(np.ones(2, np.int64), 2)


def ffd_tokens_plan(lengths: Lengths, *, world_size: int, llm_capacity: int, vit_capacity: int = 0,
                    seed: int = 0) -> Plan:
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
        raise ValueError(f"sample {int(over[0])} has {int(lengths.llm[over[0]])} tokens, over llm_capacity "
                         f"{llm_capacity} ({over.size} such samples)")
    order = np.argsort(-lengths.llm, kind="stable").astype(np.int64)
    bins = _first_fit(np.ascontiguousarray(lengths.llm[order]), int(llm_capacity))
    by_bin = np.argsort(bins, kind="stable")
    samples = order[by_bin]
    num_packs = int(bins.max()) + 1
    offsets = np.zeros(num_packs + 1, np.int64)
    np.cumsum(np.bincount(bins, minlength=num_packs), out=offsets[1:])
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


def over_vit_capacity(plan: Plan, lengths: Lengths) -> float:
    """Share of the plan's distinct scheduled packs whose ViT load exceeds ``plan.vit_capacity``."""
    sizes = plan.pack_sizes()
    vit = np.zeros(plan.num_packs, np.int64)
    nonempty = sizes > 0
    vit[nonempty] = np.add.reduceat(lengths.vit[plan.pack_samples], plan.pack_offsets[:-1][nonempty])
    scheduled = np.unique(plan.step_packs)
    return float(np.mean(vit[scheduled] > plan.vit_capacity)) if scheduled.size else 0.0
