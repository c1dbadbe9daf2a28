"""Balance metrics of a plan, as the OmniBal paper defines them, plus fill, a cost-model step efficiency and the
epoch cost against its ideal and its lower bound (:mod:`omnibal_kernels.balance.bound`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np

from ..lengths import Lengths
from .bound import ideal_and_bound
from .cost import CostModel
from .packs import Plan

__all__ = [
    "BOUND_NOTE_ABOVE",
    "MAX_BOUND_SAMPLES",
    "BalanceReport",
    "balance_report",
    "dist_ratio",
    "epoch_cost",
    "mean_over_max",
    "pack_costs",
    "pack_sums",
]

# The report names the samples that hold the bound up where it is above the ideal by more than this share
# (below it, rounding in the bound's levels and a few costly samples are all it shows).
BOUND_NOTE_ABOVE = 1e-3
MAX_BOUND_SAMPLES = 20


@dataclass(frozen=True)
class BalanceReport:
    """What a plan achieves.

    Attributes:
        num_samples: distinct samples scheduled.
        num_packs: distinct packs scheduled.
        num_steps: steps (each gives every rank one pack).
        ave_bs: mean samples per pack (over distinct scheduled packs).
        vit_fill, llm_fill: load in the scheduled packs over ``packs * capacity``, over the packs within the
            capacities (oversize singles are counted in ``oversize`` instead), so never above 1.
        vit_dist, llm_dist: the paper's Dist Ratio: per step ``sum(max - x_i) / (max * world_size)`` over
            the ranks' pack loads, averaged over steps (ViT: denominator at least 1, as the authors' code).
        step_efficiency: mean over steps of ``mean(cost_i) / max(cost_i)`` under the cost model: the share
            of the step the average rank spends working rather than waiting for the slowest.
        num_dropped: samples in no slot (oversize ``"drop"``, ``drop_last``; their ids are the plan's
            ``dropped_samples``).
        num_duplicated: sample slots that repeat a sample (reused packs of a ragged last step).
        seconds: planning time.
        num_oversize: scheduled samples over a capacity, each in a pack of its own (``oversize="single"``).
        duplicated_fraction: ``num_duplicated / num_samples``, the share of the epoch trained twice.
        epoch_cost: sum over steps of the slowest rank's pack cost (:func:`epoch_cost`), in the cost model's
            units: what data-parallel training waits for.
        epoch_ideal: the scheduled samples' costs plus ``per_pack`` for the fewest packs that can hold them,
            over ``world_size``: every rank busy every step.
        epoch_bound: :func:`~omnibal_kernels.balance.bound.epoch_bound` of the scheduled samples under the
            plan's capacities and world size: no plan of them goes below it (at least ``epoch_ideal``).
        epoch_over_ideal: ``epoch_cost / epoch_ideal`` (1 when both are 0).
        epoch_over_bound: ``epoch_cost / epoch_bound`` (1 when both are 0): how far the plan is from the best
            any plan could do, as far as the bound can tell.
        bound_over_ideal: ``epoch_bound / epoch_ideal`` (1 when both are 0): above 1 where no plan of these
            samples can keep every rank busy every step.
        bound_samples: where ``bound_over_ideal`` exceeds :data:`BOUND_NOTE_ABOVE`, the scheduled samples that
            each cost more than an average pack (``epoch_ideal / num_steps``), costliest first (at most
            :data:`MAX_BOUND_SAMPLES`): a step that holds one waits at least for it, and with few steps such
            samples hold most steps above their mean; else empty.
        bound_sample_count: how many scheduled samples cost more than an average pack (where
            ``bound_samples`` is filled; else 0).
        bound_note: where ``bound_samples`` is filled, one sentence saying so and what lowers the bound (more data
            per epoch, lower capacities with context parallelism for the longest samples); else "".
    """

    num_samples: int
    num_packs: int
    num_steps: int
    ave_bs: float
    vit_fill: float
    llm_fill: float
    vit_dist: float
    llm_dist: float
    step_efficiency: float
    num_dropped: int
    num_duplicated: int
    seconds: float
    num_oversize: int = 0
    duplicated_fraction: float = 0.0
    epoch_cost: float = 0.0
    epoch_ideal: float = 0.0
    epoch_bound: float = 0.0
    epoch_over_ideal: float = 1.0
    epoch_over_bound: float = 1.0
    bound_over_ideal: float = 1.0
    bound_samples: tuple[int, ...] = ()
    bound_sample_count: int = 0
    bound_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bound_samples"] = list(self.bound_samples)
        return out


def dist_ratio(step_loads: np.ndarray, min_denominator: float = 0.0) -> float:
    """Mean over steps of ``sum(max - x) / max(max * ranks, min_denominator)``; ``step_loads``: (steps, ranks)."""
    x = np.asarray(step_loads, dtype=np.float64)
    if x.size == 0:
        return 0.0
    peak = x.max(axis=1)
    denom = np.maximum(peak * x.shape[1], min_denominator)
    waste = (peak[:, None] - x).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(denom > 0, waste / np.where(denom > 0, denom, 1.0), 0.0)
    return float(per_step.mean())


def pack_sums(pack_offsets: np.ndarray, pack_samples: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(num_packs,) sum of ``values`` over each pack's samples (0 for an empty pack)."""
    sizes = np.diff(pack_offsets)
    out = np.zeros(sizes.shape[0], dtype=values.dtype)
    nonempty = sizes > 0
    if pack_samples.size:
        out[nonempty] = np.add.reduceat(values[pack_samples], pack_offsets[:-1][nonempty])
    return out


def mean_over_max(costs: np.ndarray) -> float:
    """Mean over rows of ``mean(row) / max(row)`` (1 for an all-zero row or no rows); ``costs``: (steps, ranks)."""
    if costs.shape[0] == 0:
        return 1.0
    peak = costs.max(axis=1)
    return float(np.mean(np.where(peak > 0, costs.mean(axis=1) / np.where(peak > 0, peak, 1.0), 1.0)))


def pack_costs(plan: Plan, sample_costs: np.ndarray, per_pack: float = 0.0) -> np.ndarray:
    """``(num_packs,)`` float64 cost of every pack of ``plan``: its samples' ``sample_costs`` plus ``per_pack``."""
    return pack_sums(plan.pack_offsets, plan.pack_samples, np.asarray(sample_costs, np.float64)) + per_pack


def epoch_cost(plan: Plan, lengths: Lengths, cost_model: Optional[CostModel] = None) -> float:
    """Sum over the steps of ``plan`` of the costliest pack in the step (the slowest rank's), under
    ``cost_model`` (``None``: ``CostModel.internvl_7b()``): a pack costs its samples'
    ``cost_model.sample_costs(lengths)`` plus ``per_pack``. In the cost model's units."""
    model = cost_model or CostModel.internvl_7b()
    return _slowest_sum(plan, pack_costs(plan, model.sample_costs(lengths), model.per_pack))


def _slowest_sum(plan: Plan, pack_cost: np.ndarray) -> float:
    return float(pack_cost[plan.step_packs].max(axis=1).sum()) if plan.num_steps else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a == 0 else float("inf"))


def _epoch_fields(
    plan: Plan,
    lengths: Lengths,
    cost_model: CostModel,
    sample_costs: np.ndarray,
    pack_cost: np.ndarray,
    scheduled: np.ndarray,
) -> dict[str, Any]:
    """The report's ``epoch_*`` and ``bound_*`` fields, the ideal and the bound over the samples ``plan``
    schedules."""
    cost = _slowest_sum(plan, pack_cost)
    in_slot = np.zeros(plan.num_packs, bool)
    in_slot[scheduled] = True
    samples = plan.pack_samples[np.repeat(in_slot, plan.pack_sizes())]
    vit, llm, costs = lengths.vit[samples], lengths.llm[samples], sample_costs[samples]
    ideal, bound = ideal_and_bound(
        costs,
        vit,
        llm,
        vit_capacity=plan.vit_capacity,
        llm_capacity=plan.llm_capacity,
        world_size=plan.world_size,
        per_pack=cost_model.per_pack,
    )
    fields: dict[str, Any] = dict(
        epoch_cost=cost,
        epoch_ideal=ideal,
        epoch_bound=bound,
        epoch_over_ideal=_ratio(cost, ideal),
        epoch_over_bound=_ratio(cost, bound),
        bound_over_ideal=_ratio(bound, ideal),
    )
    if fields["bound_over_ideal"] > 1 + BOUND_NOTE_ABOVE and plan.num_steps:
        fields.update(_bound_samples(plan, samples, costs, ideal, fields["bound_over_ideal"]))
    return fields


def _bound_samples(
    plan: Plan, samples: np.ndarray, costs: np.ndarray, ideal: float, bound_over_ideal: float
) -> dict[str, Any]:
    """The report's ``bound_*`` fields where the bound is above the ideal: the samples costlier than an average
    pack and the note that says why the bound rose and what lowers it."""
    average_pack = ideal / plan.num_steps
    above = np.flatnonzero(costs > average_pack)
    above = above[np.lexsort((samples[above], -costs[above]))]
    ids = tuple(int(i) for i in samples[above[:MAX_BOUND_SAMPLES]])
    largest = (
        f"; the costliest, sample {ids[0]}, costs {costs[above[0]] / average_pack:.2f}x an average pack" if ids else ""
    )
    note = (
        f"the epoch bound is {bound_over_ideal:.4f}x the ideal: {plan.num_steps} steps of {plan.world_size} ranks, "
        f"and {above.size} samples each cost more than an average pack{largest}. A step that holds such a sample "
        "waits for it; more data per epoch (more steps to spread them over) or lower capacities, with context "
        "parallelism for the longest samples, lower the bound"
    )
    return dict(bound_samples=ids, bound_sample_count=int(above.size), bound_note=note)


def balance_report(plan: Plan, lengths: Lengths, cost_model: Optional[CostModel] = None) -> BalanceReport:
    """Metrics of ``plan`` over ``lengths`` (the loads it was planned from) under ``cost_model`` (``None``:
    ``CostModel.internvl_7b()``, the planner's default); see :class:`BalanceReport`."""
    if len(lengths) != plan.num_input_samples:
        raise ValueError(f"plan was made for {plan.num_input_samples} samples, lengths has {len(lengths)}")
    cost_model = cost_model or CostModel.internvl_7b()
    if not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    sizes = plan.pack_sizes()
    pack_vit = pack_sums(plan.pack_offsets, plan.pack_samples, lengths.vit)
    pack_llm = pack_sums(plan.pack_offsets, plan.pack_samples, lengths.llm)
    sample_costs = cost_model.sample_costs(lengths)
    pack_cost = pack_costs(plan, sample_costs, cost_model.per_pack)

    slots = plan.step_packs
    scheduled = np.unique(slots)
    num_packs = int(scheduled.size)
    num_samples = int(sizes[scheduled].sum())
    counts = np.bincount(slots.reshape(-1), minlength=plan.num_packs)
    duplicated = int(((counts - 1).clip(min=0) * sizes).sum())

    # Oversize singles exceed a capacity by definition: they are reported on their own, not in the fills.
    within = scheduled[(pack_vit[scheduled] <= plan.vit_capacity) & (pack_llm[scheduled] <= plan.llm_capacity)]
    oversize = int(sizes[np.setdiff1d(scheduled, within, assume_unique=True)].sum())

    def fill(pack_load: np.ndarray, capacity: int) -> float:
        return float(pack_load[within].sum() / (within.size * capacity)) if capacity > 0 and within.size else 0.0

    return BalanceReport(
        num_samples=num_samples,
        num_packs=num_packs,
        num_steps=plan.num_steps,
        ave_bs=num_samples / num_packs if num_packs else 0.0,
        vit_fill=fill(pack_vit, plan.vit_capacity),
        llm_fill=fill(pack_llm, plan.llm_capacity),
        vit_dist=dist_ratio(pack_vit[slots], min_denominator=1.0),
        llm_dist=dist_ratio(pack_llm[slots]),
        step_efficiency=mean_over_max(pack_cost[slots]),
        num_dropped=int(plan.dropped_samples.size),
        num_duplicated=duplicated,
        seconds=float(plan.seconds),
        num_oversize=oversize,
        duplicated_fraction=duplicated / num_samples if num_samples else 0.0,
        **_epoch_fields(plan, lengths, cost_model, sample_costs, pack_cost, scheduled),
    )
