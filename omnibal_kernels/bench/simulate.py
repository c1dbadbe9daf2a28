"""Simulated training time of a plan: each rank's step time from a ``CostModel``, each step as slow as its
slowest rank.

A packed method (``balanced``, ``isf``, ``random``, ``ffd_tokens``) trains each pack as one varlen batch, so
a rank's time is the sum of its samples' costs. A padded baseline (``random_padded``, ``length_grouped``)
pads every sample's tokens to the longest of its micro-batch, so a rank pays the LLM cost of
``samples * longest`` tokens; ViT tiles and patches are concatenated in every common implementation and are
not padded. Compute per step is all that is modelled: no communication, no kernel-launch or data-loading
time, which is what the measured DDP run adds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..balance import Plan
from ..balance.cost import CostModel
from ..lengths import Lengths

__all__ = ["PADDED_METHODS", "PackLoads", "pack_loads", "rank_costs", "epoch_time", "ideal_time", "padding_fraction"]

# Methods whose micro-batches are trained padded to their longest sample.
PADDED_METHODS = ("random_padded", "length_grouped")


class PackLoads(NamedTuple):
    """Per-pack sums (``(num_packs,)`` each): samples, ViT load, LLM tokens, longest sample's tokens, and
    the cost of the pack's samples unpadded and padded to the longest."""

    samples: np.ndarray
    vit: np.ndarray
    llm: np.ndarray
    longest: np.ndarray
    cost: np.ndarray
    padded_cost: np.ndarray


def _sums(plan: Plan, values: np.ndarray, reduce: np.ufunc = np.add) -> np.ndarray:
    sizes = plan.pack_sizes()
    out = np.zeros(plan.num_packs, dtype=values.dtype)
    nonempty = sizes > 0
    if plan.pack_samples.size:
        out[nonempty] = reduce.reduceat(values[plan.pack_samples], plan.pack_offsets[:-1][nonempty])
    return out


def pack_loads(plan: Plan, lengths: Lengths, cost_model: CostModel) -> PackLoads:
    """The loads and costs of every pack of ``plan`` (``lengths``: what it was planned from)."""
    if len(lengths) != plan.num_input_samples:
        raise ValueError(f"plan was made for {plan.num_input_samples} samples, lengths has {len(lengths)}")
    samples = plan.pack_sizes()
    longest = _sums(plan, lengths.llm, np.maximum)
    zeros = np.zeros(1, np.int64)
    vit_cost = _sums(plan, cost_model.sample_costs(lengths.vit, np.zeros_like(lengths.llm)))
    cost = _sums(plan, cost_model.sample_costs(lengths.vit, lengths.llm))
    padded = vit_cost + samples * cost_model.sample_costs(zeros, longest)
    return PackLoads(samples, _sums(plan, lengths.vit), _sums(plan, lengths.llm), longest, cost, padded)


def rank_costs(plan: Plan, lengths: Lengths, cost_model: CostModel, padded: bool | None = None) -> np.ndarray:
    """(num_steps, world_size) simulated time of every rank in every step, in the cost model's unit.

    ``padded`` (default: whether ``plan.method`` is one of :data:`PADDED_METHODS`) charges each pack the
    LLM cost of all its samples padded to its longest one.
    """
    loads = pack_loads(plan, lengths, cost_model)
    if padded is None:
        padded = plan.method in PADDED_METHODS
    return (loads.padded_cost if padded else loads.cost)[plan.step_packs]


def epoch_time(costs: np.ndarray) -> float:
    """Simulated epoch time: every step lasts as long as its slowest rank (``costs``: (steps, ranks))."""
    return float(costs.max(axis=1).sum()) if costs.size else 0.0


def ideal_time(lengths: Lengths, cost_model: CostModel, world_size: int) -> float:
    """The limit on this data: every sample once, no padding, every rank always busy."""
    return float(cost_model.sample_costs(lengths.vit, lengths.llm).sum() / world_size)


def padding_fraction(plan: Plan, lengths: Lengths) -> float:
    """Share of the scheduled LLM token positions that are padding (0 for a packed method)."""
    if plan.method not in PADDED_METHODS:
        return 0.0
    sizes = plan.pack_sizes()
    longest = _sums(plan, lengths.llm, np.maximum)
    slots = plan.step_packs.reshape(-1)
    positions = float((sizes[slots] * longest[slots]).sum())
    real = float(_sums(plan, lengths.llm)[slots].sum())
    return 1.0 - real / positions if positions else 0.0
