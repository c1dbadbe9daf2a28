"""A plan on context-parallel (CP) groups: the predicted time of every CP rank for every step's packs.

With ``context_parallel.size = C`` a plan's ranks are the data-parallel ones, each a CP group of ``C`` ranks
that trains its slot's pack sharded by :func:`~omnibal_kernels.context_parallel.shard_for_context_parallel`.
A step lasts as long as its slowest rank over all groups and all their CP ranks; this report prices every pack
from its samples' LLM lengths, in pack order, with
:func:`~omnibal_kernels.context_parallel.context_parallel_rank_times` (the layout the collator builds for the
same batch and options), so that imbalance inside a group is reported, not hidden behind balanced pack totals.
A sampler's report (:meth:`~omnibal_kernels.BalancedBatchSampler.report`) holds the same for its micro-steps.

Vision-language samples (a ViT load in the lengths) add each CP rank's share of the pack's ViT work: the
pack's images (each ViT sequence of ``vit_seqlens``, else each sample's whole ViT load) divided among the CP
ranks as the collator divides them (:func:`~omnibal_kernels.context_parallel.vision.divide_vision_units`),
priced by the cost's ViT terms, so a rank's time is what it waits for: its tokens and its images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from .._progress import progress_bar
from ..balance.packs import Plan, as_lengths
from ..lengths import Lengths
from .options import ContextParallelOptions, check_options
from .strategy import context_parallel_rank_times
from .vision import divide_vision_units, sample_unit_costs

__all__ = ["ContextParallelReport", "context_parallel_report", "slot_rank_times"]


@dataclass(frozen=True)
class ContextParallelReport:
    """Every step's packs on their CP groups under one strategy.

    Attributes:
        options: the context-parallel options the packs were priced under (``options.strategy`` the strategy
            asked for; ``"auto"`` chooses per pack and :attr:`strategies` says what).
        times: ``(steps, groups, C)`` float64 predicted time of every CP rank of every data-parallel rank (CP
            group) in every step, in the unit of the :class:`~omnibal_kernels.ContextParallelCost`.
        tokens: ``(steps, groups, C)`` int64 tokens each CP rank holds (padding included).
        kv_exchanged: ``(steps, groups)`` int64 K/V rows the ranks of the group receive.
        padding: ``(steps, groups)`` int64 tokens the layout adds (Megatron padding).
        strategies: ``(steps, groups)`` the strategy of each pack's layout (``"auto"`` resolved).
        vit_times: ``(steps, groups, C)`` float64 each CP rank's share of the pack's ViT work (in ``times``
            too); zeros for text-only packs.
    """

    options: ContextParallelOptions
    times: np.ndarray
    tokens: np.ndarray
    kv_exchanged: np.ndarray
    padding: np.ndarray
    strategies: np.ndarray
    vit_times: Optional[np.ndarray] = None

    @property
    def vit_imbalance(self) -> np.ndarray:
        """``(steps, groups)`` the most ViT work of a CP rank over the mean (1.0: balanced or no images)."""
        vit = np.zeros_like(self.times) if self.vit_times is None else self.vit_times
        mean = vit.mean(axis=2)
        return np.where(mean > 0, vit.max(axis=2) / np.where(mean > 0, mean, 1.0), 1.0)

    @property
    def group_imbalance(self) -> np.ndarray:
        """``(steps, groups)`` slowest CP rank over the mean CP rank of each pack (1.0: perfect balance)."""
        mean = self.times.mean(axis=2)
        return np.where(mean > 0, self.times.max(axis=2) / np.where(mean > 0, mean, 1.0), 1.0)

    @property
    def step_times(self) -> np.ndarray:
        """``(steps,)`` the slowest rank of each step, over every group and CP rank."""
        return self.times.reshape(self.times.shape[0], -1).max(axis=1)

    @property
    def step_efficiency(self) -> float:
        """Mean over steps of ``mean / max`` over all ranks (groups times CP ranks): the share of a step the
        average rank works rather than waits."""
        flat = self.times.reshape(self.times.shape[0], -1)
        peak = flat.max(axis=1) if flat.size else np.zeros(0)
        if peak.size == 0:
            return 1.0
        return float(np.mean(np.where(peak > 0, flat.mean(axis=1) / np.where(peak > 0, peak, 1.0), 1.0)))

    def to_dict(self) -> dict[str, Any]:
        """Summary numbers: mean and worst group imbalance, step efficiency, K/V rows and padding per step,
        and how often ``"auto"`` chose each strategy."""
        imbalance = self.group_imbalance
        names, counts = np.unique(self.strategies, return_counts=True)
        steps = max(self.times.shape[0], 1)
        return {
            "strategy": self.options.strategy,
            "context_parallel_size": self.options.size,
            "mean_group_imbalance": float(imbalance.mean()) if imbalance.size else 1.0,
            "worst_group_imbalance": float(imbalance.max()) if imbalance.size else 1.0,
            "step_efficiency": self.step_efficiency,
            "kv_exchanged_per_step": float(self.kv_exchanged.sum()) / steps,
            "padding_per_step": float(self.padding.sum()) / steps,
            "strategies": {str(n): int(c) for n, c in zip(names, counts)},
            "worst_vit_imbalance": float(self.vit_imbalance.max()) if imbalance.size else 1.0,
        }


def slot_rank_times(
    pack_offsets: np.ndarray,
    pack_samples: np.ndarray,
    slots: np.ndarray,
    llm: np.ndarray,
    options: ContextParallelOptions,
    *,
    progress: Optional[bool] = None,
    vision: Optional[Lengths] = None,
) -> ContextParallelReport:
    """The :class:`ContextParallelReport` of a table of pack ids.

    Args:
        pack_offsets, pack_samples: the packs (pack ``p`` holds ``pack_samples[pack_offsets[p]:pack_offsets[p+1]]``).
        slots: ``(steps, groups)`` int pack id of every slot (a plan's ``step_packs``, a sampler's micro-steps).
        llm: per-sample LLM tokens, indexed by the ids in ``pack_samples``.
        options: the context-parallel options, as :func:`~.strategy.context_parallel_rank_times` takes them.
        progress: a progress bar over the distinct packs (default: when stderr is a terminal).
        vision: the samples' loads (``vit`` and ``vit_seqlens``, indexed like ``llm``) to price each CP rank's
            share of the pack's ViT work; None: text only.
    """
    options = check_options(options, "options")
    cp = options.size
    has_vit = vision is not None and bool(np.any(vision.vit))
    slots = np.asarray(slots, dtype=np.int64)
    distinct, inverse = np.unique(slots, return_inverse=True)
    n = distinct.size
    times, tokens, vit = np.zeros((n, cp)), np.zeros((n, cp), np.int64), np.zeros((n, cp))
    kv, padding, names = np.zeros(n, np.int64), np.zeros(n, np.int64), np.empty(n, dtype=object)
    bar = progress_bar(n, "context-parallel rank times", progress)
    try:
        for i, p in enumerate(distinct.tolist()):
            ids = pack_samples[pack_offsets[p] : pack_offsets[p + 1]]
            rt = context_parallel_rank_times(llm[ids], options)
            if has_vit:
                assert vision is not None
                costs = sample_unit_costs(vision.vit, ids, options.cost, vision.vit_seqlens, vision.vit_seqlens_offsets)
                vit[i] = np.bincount(divide_vision_units(costs, cp), weights=costs, minlength=cp)
            times[i], tokens[i], kv[i], padding[i], names[i] = (
                rt.times,
                rt.tokens,
                rt.kv_exchanged,
                rt.padding,
                rt.strategy,
            )
            bar.update()
    finally:
        bar.close()
    inverse = inverse.reshape(slots.shape)
    return ContextParallelReport(
        options,
        (times + vit)[inverse],
        tokens[inverse],
        kv[inverse],
        padding[inverse],
        names[inverse].astype(str),
        vit[inverse],
    )


def context_parallel_report(
    plan: Plan,
    lengths: Union[Lengths, tuple, np.ndarray],
    options: Optional[ContextParallelOptions] = None,
    *,
    progress: Optional[bool] = None,
) -> ContextParallelReport:
    """Every CP rank's predicted time for every step of ``plan``.

    Args:
        plan: a plan of :func:`~omnibal_kernels.balance.plan_packs`.
        lengths: the loads it was planned from.
        options: the context-parallel options to price with (the size, the strategy the collator shards with,
            the cost terms); None: those the plan was made with (``plan.context_parallel``). Pricing one plan
            under several strategies compares them on the same packs.
        progress: a progress bar over the packs (default: when stderr is a terminal).

    Returns:
        :class:`ContextParallelReport` with ``(num_steps, world_size, C)`` times. Each pack is priced by its
        samples' lengths (their ViT loads included: each rank's share of the pack's images); a padding segment
        that a collator's static shapes add is not in them.

    Raises:
        ValueError: lengths of another size than the plan's input, and what ``context_parallel_rank_times``
            raises (a fixed strategy over ``max_rank_tokens``).
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a Plan, got {type(plan).__name__}")
    lengths = as_lengths(lengths)
    if len(lengths) != plan.num_input_samples:
        raise ValueError(f"plan was made for {plan.num_input_samples} samples, lengths has {len(lengths)}")
    options = plan.context_parallel if options is None else check_options(options, "options")
    return slot_rank_times(
        plan.pack_offsets, plan.pack_samples, plan.step_packs, lengths.llm, options, progress=progress, vision=lengths
    )
