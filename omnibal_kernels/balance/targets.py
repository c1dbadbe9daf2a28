"""Plan measures beyond the balance report: how far the packs are from the fewest possible, whether the load
drifts over the epoch, and how many packs come back in the next epoch."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import numpy as np

from .._checks import check_positive_int
from ..lengths import Lengths
from .bound import min_packs, over_capacity
from .cost import CostModel
from .packs import Plan, as_lengths
from .report import pack_sums

__all__ = ["PackBounds", "pack_lower_bounds", "load_trend", "repeated_pack_share"]


class PackBounds(NamedTuple):
    """Lower bounds on the number of packs of samples under two capacities.

    Attributes:
        volume: ``ceil(max(sum(vit) / vit_capacity, sum(llm) / llm_capacity))`` over the samples within the
            capacities, plus one pack for each sample over a capacity: packs can hold no more.
        tight: :func:`~omnibal_kernels.balance.bound.min_packs`, the larger of ``volume`` and, in each load, the
            bin-packing bound L2 of Martello and Toth: the samples over half a capacity need a pack each, and
            the smaller ones fill at most the room those leave. It is above ``volume`` where large samples are
            common and cannot share a pack, or leave room the smaller ones do not fit (pages of 7 to 13 tiles
            under a 20-tile capacity), which ``volume`` counts only by their load.
    """

    volume: int
    tight: int


def pack_lower_bounds(lengths: Union[Lengths, tuple, np.ndarray], vit_capacity: int, llm_capacity: int) -> PackBounds:
    """Lower bounds on the packs of ``lengths`` (as :func:`~omnibal_kernels.plan_packs` takes them) under the
    capacities (samples over a capacity count as one pack each, as with ``oversize="single"``; ``vit_capacity``
    0: the ViT load is not bounded).

    Raises:
        TypeError: a capacity not an integer.
        ValueError: ``llm_capacity`` below 1 or ``vit_capacity`` below 0.
    """
    lengths = as_lengths(lengths)
    vit_capacity = check_positive_int("vit_capacity", vit_capacity, minimum=0)
    llm_capacity = check_positive_int("llm_capacity", llm_capacity, minimum=1)
    vit, llm = np.asarray(lengths.vit, np.int64), np.asarray(lengths.llm, np.int64)
    over = over_capacity(vit, llm, vit_capacity, llm_capacity)
    within = ~over
    volume = llm[within].sum() / llm_capacity
    if vit_capacity > 0:
        volume = max(volume, vit[within].sum() / vit_capacity)
    volume_bound = max(math.ceil(volume - 1e-9) + int(np.count_nonzero(over)), 1)
    return PackBounds(volume_bound, max(volume_bound, min_packs(vit, llm, vit_capacity, llm_capacity)))


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
