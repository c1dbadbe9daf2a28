"""Plan measures beyond the balance report: how far the packs are from the fewest possible, whether the load
drifts over the epoch, and how many packs come back in the next epoch."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from ..lengths import Lengths
from .cost import CostModel
from .packs import Plan
from .report import pack_sums

__all__ = ["PackBounds", "pack_lower_bounds", "load_trend", "repeated_pack_share"]


class PackBounds(NamedTuple):
    """Lower bounds on the number of packs of samples under two capacities.

    Attributes:
        volume: ``ceil(max(sum(vit) / vit_capacity, sum(llm) / llm_capacity))``: packs can hold no more.
        tight: the larger of ``volume`` and the number of samples above half of a capacity (no two of those
            share a pack), which is higher when large samples are common.
    """

    volume: int
    tight: int


def pack_lower_bounds(lengths: Lengths, vit_capacity: int, llm_capacity: int) -> PackBounds:
    """Lower bounds on the packs of ``lengths`` under the capacities (samples over a capacity count as one
    pack each, as with ``oversize="single"``)."""
    vit, llm = lengths.vit, lengths.llm
    if llm_capacity <= 0:
        raise ValueError(f"llm_capacity must be positive, got {llm_capacity}")
    volume = llm.sum() / llm_capacity
    if vit_capacity > 0:
        volume = max(volume, vit.sum() / vit_capacity)
    volume_bound = max(math.ceil(volume - 1e-9), 1)
    big_llm = int(np.count_nonzero(2 * llm > llm_capacity))
    big_vit = int(np.count_nonzero(2 * vit > vit_capacity)) if vit_capacity > 0 else 0
    return PackBounds(volume_bound, max(volume_bound, big_llm, big_vit))


# Step totals that vary less than this (coefficient of variation) have no trend worth measuring: their
# correlation with the step index is set by where the few ragged steps fall.
_MIN_TREND_VARIATION = 0.01


def load_trend(plan: Plan, lengths: Lengths, cost_model: Optional[CostModel] = None) -> float:
    """The largest ``|corr(step index, step total)|`` over the step totals of ViT load, LLM load and cost: a
    trend of the load over the epoch. Loads whose step totals are the same within 1% (coefficient of
    variation) are left out: packs at a binding capacity give every step the same load."""
    cost_model = cost_model or CostModel.internvl_7b()
    steps = np.arange(plan.num_steps, dtype=np.float64)
    if plan.num_steps < 3:
        return 0.0
    worst = 0.0
    for values in (lengths.vit, lengths.llm, cost_model.sample_costs(lengths.vit, lengths.llm)):
        per_pack = pack_sums(plan.pack_offsets, plan.pack_samples, np.asarray(values, dtype=np.float64))
        step_total = per_pack[plan.step_packs].sum(axis=1)
        mean = step_total.mean()
        if mean > 0 and step_total.std() > _MIN_TREND_VARIATION * mean:
            worst = max(worst, abs(float(np.corrcoef(steps, step_total)[0, 1])))
    return worst


def _pack_keys(plan: Plan) -> set[tuple[int, ...]]:
    return {tuple(np.sort(plan.pack(p)).tolist()) for p in range(plan.num_packs)}


def repeated_pack_share(plan: Plan, other: Plan) -> float:
    """Share of the packs of ``plan`` that ``other`` has too (the same samples): packs repeating between
    epochs train the same sample combinations again."""
    mine = _pack_keys(plan)
    return len(mine & _pack_keys(other)) / max(len(mine), 1)
