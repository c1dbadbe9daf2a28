"""``plan_packs``: the public entry of planning. Searches capacities where the options give none
(:mod:`~omnibal_kernels.balance.search`) and builds the plan (:mod:`~omnibal_kernels.balance.engine`, whose
docstring describes the methods).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Optional, Union

import numpy as np

from .._checks import check_epoch
from .._warnings import TooFewPacksWarning
from ..lengths import Lengths
from .engine import build_plan
from .options import PlanOptions, check_options, check_world_size
from .packs import Plan, as_lengths
from .search import search_capacity

__all__ = ["plan_packs", "plan_packs_without_warning"]


def plan_packs(
    lengths: Union[Lengths, tuple, np.ndarray],
    options: Optional[PlanOptions] = None,
    *,
    world_size: int,
    epoch: int = 0,
) -> Plan:
    """Groups samples into packs under a ViT and an LLM capacity and schedules them on ranks and steps.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts).
        options: how to plan, a :class:`~omnibal_kernels.balance.options.PlanOptions` (default: its defaults).
            Capacities not given are searched from ``target_batch_size``
            (:func:`~omnibal_kernels.balance.search_capacity`). With ``context_parallel.size = C`` the
            capacities are those of a CP group: ``llm_capacity`` is the tokens of a whole pack (Megatron's
            ``--seq-length`` and torchtitan's ``seq_len`` with CP are the full sequence too), which the collator
            then splits over the ``C`` ranks; :func:`~omnibal_kernels.context_parallel.context_parallel_report`
            gives each CP rank's predicted time.
        world_size: data-parallel ranks; every step gives each rank one pack. With context parallelism these
            are the CP groups (all ranks over ``context_parallel.size``): every rank of a group trains its
            group's pack, a shard of it each.
        epoch: with the options' seed, what the plan is drawn from; each epoch gets new packs and order.

    Returns:
        A ``Plan``.

    Raises:
        OversizeError: a sample alone exceeds a capacity and ``oversize="error"`` (naming the samples).
        TooFewPacksError: ``drop_last=True`` and fewer packs than ``world_size`` (no whole step).

    Warns:
        TooFewPacksWarning: fewer packs than ``world_size`` (``drop_last=False``): the one step repeats packs.
        ValueError/TypeError: bad options, naming the argument.
    """
    plan = plan_packs_without_warning(lengths, options, world_size=world_size, epoch=epoch)
    if plan.num_packs < plan.world_size:
        warnings.warn(
            f"only {plan.num_packs} pack(s) for world_size {plan.world_size}: the plan's one step trains each pack "
            f"about {plan.world_size / plan.num_packs:.1f} times (BalancedBatchSampler refuses this with "
            "TooFewPacksError); use fewer ranks or smaller capacities",
            TooFewPacksWarning,
            stacklevel=2,
        )
    return plan


def plan_packs_without_warning(
    lengths: Union[Lengths, tuple, np.ndarray],
    options: Optional[PlanOptions] = None,
    *,
    world_size: int,
    epoch: int = 0,
) -> Plan:
    """:func:`plan_packs` without its ``TooFewPacksWarning``, for callers that report the packs they repeat
    themselves (a stream's last buffer, whose report counts its duplicated samples)."""
    start = time.perf_counter()
    lengths = as_lengths(lengths)
    options = check_options(options)
    world_size = check_world_size(world_size)
    epoch = check_epoch(epoch)
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    if not options.has_capacities:
        caps = search_capacity(lengths, options, world_size=world_size)
        options = options.replace(vit_capacity=caps.vit_capacity, llm_capacity=caps.llm_capacity)
    plan = build_plan(lengths, options, world_size=world_size, epoch=epoch, start=start)
    if options.context_parallel.enabled:
        plan = dataclasses.replace(plan, context_parallel=options.context_parallel)
    return plan
