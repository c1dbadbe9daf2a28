"""One epoch of a pipeline plan on a data choice: every optimizer step of every pipeline simulated with each
micro-batch at its own cost.

Each pipeline (data-parallel rank) runs its micro-batches of a step through the plan's split and recompute
choice (:func:`~omnibal_kernels.pipeline.stage_times` scales every layer by its kind's cost of the micro-batch
over the mean micro-batch of the data, which the profile describes), under the plan's schedule
(:func:`~omnibal_kernels.pipeline.simulate`); the optimizer step lasts as long as its slowest pipeline.
Rank-time of the epoch splits into compute (forwards, backwards and sends), recomputation (the recomputed
forwards and checkpoint's own work in the forwards) and idle time (the bubble: fill and drain, stages that wait
for slower ones, pipelines that wait for the slowest). The share of the idle time that comes from unequal
micro-batches is the epoch's idle time less that of the same epoch with every micro-batch at the mean cost,
over the former.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..pipeline.micro_batches import kind_scales, pack_kind_costs, stage_kind_times
from ..pipeline.partition import PipelinePlan
from ..pipeline.profile import ModelProfile
from ..pipeline.schedule import simulate
from .data import MicroBatches

__all__ = ["EpochTimes", "epoch_times", "micro_batch_scales"]


@dataclass(frozen=True)
class EpochTimes:
    """An epoch in milliseconds: ``step_ms`` per optimizer step (its slowest pipeline); ``busy_ms``,
    ``recompute_ms`` summed over every pipeline rank of the epoch; ``mean_step_ms`` per step with every
    micro-batch at the mean cost; ``ranks``: pipelines times stages (a tensor-parallel group counts once)."""

    step_ms: np.ndarray
    busy_ms: float
    recompute_ms: float
    mean_step_ms: np.ndarray
    mean_busy_ms: float
    ranks: int

    @property
    def epoch_ms(self) -> float:
        return float(self.step_ms.sum())

    @property
    def idle_ms(self) -> float:
        return self.ranks * self.epoch_ms - self.busy_ms

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the epoch's rank-time."""
        total = self.ranks * self.epoch_ms
        return self.idle_ms / total if total > 0 else 0.0

    @property
    def bubble_from_data(self) -> float:
        """Share of the idle time that unequal micro-batches add (module docstring)."""
        mean_idle = self.ranks * float(self.mean_step_ms.sum()) - self.mean_busy_ms
        return (self.idle_ms - mean_idle) / self.idle_ms if self.idle_ms > 0 else 0.0

    @property
    def recompute_fraction(self) -> float:
        total = self.ranks * self.epoch_ms
        return self.recompute_ms / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": int(self.step_ms.size),
            "epoch_ms": self.epoch_ms,
            "bubble_fraction": self.bubble_fraction,
            "bubble_from_data": self.bubble_from_data,
            "recompute_fraction": self.recompute_fraction,
        }


def micro_batch_scales(data: MicroBatches, cost_model: Any) -> dict[str, np.ndarray]:
    """Per layer kind, every micro-batch's cost over the data's mean micro-batch."""
    costs = pack_kind_costs(data.vit, data.llm, data.offsets, cost_model=cost_model)
    return kind_scales(costs, costs)


def _run(plan: PipelinePlan, times: Any, m: int) -> Any:
    return simulate(
        times.forward_ms,
        times.backward_ms,
        m,
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        comm_ms=plan.comm_ms or None,
        weight_ms=times.weight_ms,
    )


def epoch_times(
    plan: PipelinePlan, profile: ModelProfile, data: MicroBatches, scales: dict[str, np.ndarray]
) -> EpochTimes:
    """Simulates every optimizer step of ``data`` on every pipeline under ``plan`` (module docstring);
    ``scales``: :func:`micro_batch_scales` of ``data`` (computed once per data choice)."""
    counts = data.step_counts()
    dp = data.steps.shape[1]
    kind_times = stage_kind_times(plan, profile)
    step_ms = np.zeros(counts.size)
    mean_ms = np.zeros(counts.size)
    busy = recompute = mean_busy = 0.0
    mean_cache: dict[int, Any] = {}
    for k, m in enumerate(counts):
        m = int(m)
        slowest = 0.0
        for r in range(dp):
            ids = data.steps[k, r, :m]
            times = kind_times.times({kind: s[ids] for kind, s in scales.items()})
            result = _run(plan, times, m)
            slowest = max(slowest, result.step_ms)
            busy += float(sum(result.busy_ms))
            recompute += float(times.recompute_ms.sum())
            if times.checkpoint_forward_ms is not None:
                recompute += float(times.checkpoint_forward_ms.sum())
        if m not in mean_cache:
            mean_cache[m] = _run(plan, kind_times.times({kind: np.ones(m) for kind in scales}), m)
        mean = mean_cache[m]
        step_ms[k] = slowest
        mean_ms[k] = mean.step_ms
        mean_busy += dp * float(sum(mean.busy_ms))
    return EpochTimes(step_ms, busy, recompute, mean_ms, mean_busy, dp * plan.num_ranks)
