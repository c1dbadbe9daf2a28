"""Random padded micro-batches as a :class:`~omnibal_kernels.balance.Plan`: what a plain ``DataLoader`` with
``DistributedSampler`` (and InternVL-Chat's loader) trains, the yardstick every balanced plan is measured against.

A seeded permutation, padded to a whole number of steps by repeating its first samples (as ``DistributedSampler``
pads), cut into micro-batches of ``batch_size`` samples; rank ``r`` of step ``s`` gets micro-batch
``s * world_size + r``. Such a micro-batch is trained padded to its longest sample (the collator pads the token
ids; the tiles are concatenated), which the plan leaves to whoever costs it.
"""

from __future__ import annotations

import time

import numpy as np

from ..lengths import Lengths
from .packs import Plan

__all__ = ["check_inputs", "fixed_size_plan", "padded_permutation", "random_padded_plan"]


def check_inputs(lengths: Lengths, world_size: int, batch_size: int) -> None:
    """``lengths`` is a non-empty ``Lengths``; ``world_size`` and ``batch_size`` are positive ints."""
    if not isinstance(lengths, Lengths):
        raise TypeError(f"lengths must be a Lengths, got {type(lengths).__name__}")
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    for name, value in (("world_size", world_size), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def padded_permutation(n: int, multiple: int, seed: int) -> np.ndarray:
    """A seeded permutation of ``range(n)`` extended by its own first entries to a multiple of ``multiple``."""
    perm = np.random.default_rng(seed).permutation(n).astype(np.int64)
    extra = (-n) % multiple
    if extra:
        perm = np.concatenate([perm, np.resize(perm, extra)])
    return perm


def fixed_size_plan(
    method: str,
    order: np.ndarray,
    repeated: np.ndarray,
    n: int,
    world_size: int,
    batch_size: int,
    capacities: tuple[int, int],
    seed: int,
    start: float,
) -> Plan:
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


def random_padded_plan(
    lengths: Lengths, *, world_size: int, batch_size: int, capacities: tuple[int, int] = (0, 0), seed: int = 0
) -> Plan:
    """Random micro-batches of ``batch_size`` samples (see the module docstring).

    Args:
        lengths: per-sample loads.
        world_size: data-parallel ranks.
        batch_size: samples per micro-batch.
        capacities: ``(vit, llm)`` recorded on the plan so fills compare with the packed methods.
        seed: seed of the permutation.
    """
    start = time.perf_counter()
    check_inputs(lengths, world_size, batch_size)
    n = len(lengths)
    order = padded_permutation(n, world_size * batch_size, seed)
    repeated = np.arange(order.size) >= n
    return fixed_size_plan("random_padded", order, repeated, n, world_size, batch_size, capacities, seed, start)
