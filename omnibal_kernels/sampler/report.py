"""What one epoch of a ``BalancedBatchSampler`` gives the ranks: loads per micro-step and ``SamplerReport``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..balance.report import BalanceReport, balance_report, dist_ratio, mean_over_max, pack_sums
from ..context_parallel.report import ContextParallelReport
from ..lengths import Lengths
from .epochs import EpochSchedule
from .groups import SamplerGroups

__all__ = ["SamplerReport", "make_report", "micro_step_loads"]


@dataclass(frozen=True)
class SamplerReport:
    """What one epoch of a :class:`BalancedBatchSampler` gives the ranks.

    Attributes:
        epoch: the epoch.
        world_size, micro_steps_per_step: ranks and micro-steps per optimizer step.
        num_micro_steps: batches each rank gets (``len(sampler)`` from the epoch start).
        num_steps: optimizer steps (``num_micro_steps / micro_steps_per_step``).
        num_samples: distinct samples scheduled over all ranks.
        micro_vit_dist, micro_llm_dist: the paper's Dist Ratio over the ranks' loads of every micro-step.
        step_vit_dist, step_llm_dist: the same over the ranks' loads summed over each optimizer step.
        micro_step_efficiency, step_efficiency: mean over (micro-)steps of ``mean(cost) / max(cost)`` over ranks.
        groups: the :class:`BalanceReport` of every group's plan (over ``world_size * micro_steps_per_step``
            virtual ranks).
        dropped_samples: sorted ids of samples in no batch (oversize ``"drop"``, ``drop_last``).
        duplicated_samples: sorted ids of the extra occurrences of samples in reused packs (a sample that
            appears three times is listed twice).
        duplicated_fraction: ``duplicated_samples.size / num_samples`` (above 5% the sampler warns).
        predicted_batch_sizes: every group's predicted mean samples per pack where its capacities were searched
            (None where they were given).
        capacities_raised: every group: its searched capacities were raised past those of its
            ``target_batch_size`` so that its largest sample fits (``search_capacity`` warns).
        epoch_cost: sum over optimizer steps of the slowest rank's cost summed over its micro-steps (what
            data-parallel training waits for), under the sampler's cost model.
        epoch_ideal: all scheduled cost over ``world_size``; ``epoch_over_ideal`` their ratio (1 for none).
        context_parallel: with context parallelism, every CP rank's predicted time for every micro-step
            (a :class:`~omnibal_kernels.context_parallel.ContextParallelReport` over ``(num_micro_steps,
            world_size, C)``, each pack priced as the collator shards it); None without.

    ``num_dropped`` and ``num_duplicated`` count :attr:`dropped_samples` and :attr:`duplicated_samples`, as
    :class:`~omnibal_kernels.balance.BalanceReport` does for a plan.
    """

    epoch: int
    world_size: int
    micro_steps_per_step: int
    num_micro_steps: int
    num_steps: int
    num_samples: int
    micro_vit_dist: float
    micro_llm_dist: float
    step_vit_dist: float
    step_llm_dist: float
    micro_step_efficiency: float
    step_efficiency: float
    groups: tuple[BalanceReport, ...]
    dropped_samples: np.ndarray
    duplicated_samples: np.ndarray
    duplicated_fraction: float = 0.0
    predicted_batch_sizes: tuple[Optional[float], ...] = ()
    capacities_raised: tuple[bool, ...] = ()
    epoch_cost: float = 0.0
    epoch_ideal: float = 0.0
    epoch_over_ideal: float = 1.0
    context_parallel: Optional[ContextParallelReport] = None

    @property
    def num_dropped(self) -> int:
        """Samples in no batch."""
        return int(self.dropped_samples.size)

    @property
    def num_duplicated(self) -> int:
        """Extra occurrences of samples in reused packs."""
        return int(self.duplicated_samples.size)

    def to_dict(self) -> dict[str, Any]:
        """Numbers only (group reports as dicts, sample id lists as counts)."""
        out = {
            k: getattr(self, k)
            for k in (
                "epoch",
                "world_size",
                "micro_steps_per_step",
                "num_micro_steps",
                "num_steps",
                "num_samples",
                "micro_vit_dist",
                "micro_llm_dist",
                "step_vit_dist",
                "step_llm_dist",
                "micro_step_efficiency",
                "step_efficiency",
                "epoch_cost",
                "epoch_ideal",
                "epoch_over_ideal",
            )
        }
        out["num_dropped"] = self.num_dropped
        out["num_duplicated"] = self.num_duplicated
        out["duplicated_fraction"] = self.duplicated_fraction
        out["predicted_batch_sizes"] = list(self.predicted_batch_sizes)
        out["capacities_raised"] = list(self.capacities_raised)
        out["groups"] = [g.to_dict() for g in self.groups]
        if self.context_parallel is not None:
            out["context_parallel"] = self.context_parallel.to_dict()
        return out


def micro_step_loads(
    schedule: EpochSchedule, lengths: Lengths, sample_costs: np.ndarray, per_pack: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(vit, llm, cost)``, each ``(num_micro_steps, world_size)``: every rank's load of every micro-step (a
    pack's cost: its samples' ``sample_costs`` plus ``per_pack``)."""
    vit, llm, cost = (
        pack_sums(schedule.pack_offsets, schedule.pack_samples, values)[schedule.micro_packs]
        for values in (lengths.vit, lengths.llm, sample_costs)
    )
    return vit, llm, cost + per_pack


def make_report(
    schedule: EpochSchedule,
    groups: SamplerGroups,
    micro_steps: int,
    loads: tuple[np.ndarray, np.ndarray, np.ndarray],
    context_parallel: Optional[ContextParallelReport] = None,
) -> SamplerReport:
    """The report of ``schedule``; ``loads``: its :func:`micro_step_loads`; ``context_parallel``: its CP ranks'
    times where the sampler shards packs."""
    vit, llm, cost = loads
    m, world = micro_steps, vit.shape[1]
    steps = vit.shape[0] // m
    step_vit, step_llm, step_cost = (x.reshape(steps, m, world).sum(axis=1) for x in (vit, llm, cost))

    dropped, duplicated = [], []
    for ids, plan in zip(groups.ids, schedule.plans):
        dropped.append(ids[plan.dropped_samples])
        counts = np.bincount(plan.step_packs.reshape(-1), minlength=plan.num_packs)
        for p in np.flatnonzero(counts > 1):
            duplicated.append(np.repeat(ids[plan.pack(int(p))], counts[p] - 1))
    cost_model = groups.options[0].cost_model
    group_reports = tuple(balance_report(plan, part, cost_model) for plan, part in zip(schedule.plans, groups.lengths))
    num_samples = int(sum(r.num_samples for r in group_reports))
    duplicated_samples = np.sort(np.concatenate(duplicated)) if duplicated else np.zeros(0, np.int64)
    searched = groups.searched or (None,) * len(groups)
    epoch_cost = float(step_cost.max(axis=1).sum()) if steps else 0.0
    epoch_ideal = float(step_cost.sum()) / world
    return SamplerReport(
        epoch=schedule.epoch,
        world_size=world,
        micro_steps_per_step=m,
        num_micro_steps=int(vit.shape[0]),
        num_steps=int(steps),
        num_samples=num_samples,
        micro_vit_dist=dist_ratio(vit, min_denominator=1.0),
        micro_llm_dist=dist_ratio(llm),
        step_vit_dist=dist_ratio(step_vit, min_denominator=1.0),
        step_llm_dist=dist_ratio(step_llm),
        micro_step_efficiency=mean_over_max(cost),
        step_efficiency=mean_over_max(step_cost),
        groups=group_reports,
        dropped_samples=np.sort(np.concatenate(dropped)) if dropped else np.zeros(0, np.int64),
        duplicated_samples=duplicated_samples,
        duplicated_fraction=duplicated_samples.size / num_samples if num_samples else 0.0,
        predicted_batch_sizes=tuple(None if c is None else float(c.predicted_batch_size) for c in searched),
        capacities_raised=tuple(c is not None and bool(c.raised) for c in searched),
        epoch_cost=epoch_cost,
        epoch_ideal=epoch_ideal,
        epoch_over_ideal=epoch_cost / epoch_ideal if epoch_ideal > 0 else 1.0,
        context_parallel=context_parallel,
    )
