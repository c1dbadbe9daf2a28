"""``plan_packs``: the public entry of planning. Searches capacities where the options give none
(:mod:`~omnibal_kernels.balance.search`) and builds the plan (:mod:`~omnibal_kernels.balance.engine`, whose
docstring describes the methods).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Union

import numpy as np

from .._checks import check_epoch
from ..lengths import Lengths
from .cost import CostModel
from .engine import build_plan
from .options import UNSET, Method, Objective, OversizePolicy, PlanOptions, check_world_size, plan_options
from .packs import Plan, as_lengths
from .search import search_capacity

__all__ = ["plan_packs"]


def plan_packs(
    lengths: Union[Lengths, tuple, np.ndarray],
    *,
    world_size: int,
    epoch: int = 0,
    options: Optional[PlanOptions] = None,
    method: Method = UNSET,
    target_batch_size: float = UNSET,
    vit_capacity: Optional[int] = UNSET,
    llm_capacity: Optional[int] = UNSET,
    vit_threshold: Optional[int] = UNSET,
    llm_threshold: Optional[int] = UNSET,
    iterations: int = UNSET,
    oversize: OversizePolicy = UNSET,
    drop_last: bool = UNSET,
    seed: int = UNSET,
    cost_model: Optional[CostModel] = UNSET,
    context_parallel_size: int = UNSET,
    objective: Objective = UNSET,
) -> Plan:
    """Groups samples into packs under a ViT and an LLM capacity and schedules them on ranks and steps.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts).
        world_size: data-parallel ranks; every step gives each rank one pack. With context parallelism these
            are the CP groups (all ranks over ``context_parallel_size``): every rank of a group trains its
            group's pack, a shard of it each.
        epoch: with the options' seed, what the plan is drawn from; each epoch gets new packs and order.
        options: a :class:`~omnibal_kernels.balance.options.PlanOptions` (default: its defaults).
        method, target_batch_size, vit_capacity, llm_capacity, oversize, drop_last, seed, cost_model,
            context_parallel_size, objective: fields of ``PlanOptions``, replacing those of ``options``;
            ``vit_threshold``, ``llm_threshold`` and ``iterations`` are fields of its ``isf`` part.
            Capacities not given are searched from ``target_batch_size``
            (:func:`~omnibal_kernels.balance.search_capacity`). With
            ``context_parallel_size = C`` the capacities are those of a CP group: ``llm_capacity`` is the
            tokens of a whole pack (Megatron's ``--seq-length`` and torchtitan's ``seq_len`` with CP are the
            full sequence too), which :func:`~omnibal_kernels.shard_for_context_parallel` then splits over
            the ``C`` ranks; :func:`~omnibal_kernels.balance.context_parallel_report` gives each CP rank's
            predicted time.

    Returns:
        A ``Plan``.

    Raises:
        OversizeError: a sample alone exceeds a capacity and ``oversize="error"`` (naming the samples).
        TooFewPacksError: ``drop_last=True`` and fewer packs than ``world_size`` (no whole step).
        ValueError/TypeError: bad options, naming the argument.
    """
    start = time.perf_counter()
    lengths = as_lengths(lengths)
    options = plan_options(
        options,
        method=method,
        target_batch_size=target_batch_size,
        vit_capacity=vit_capacity,
        llm_capacity=llm_capacity,
        vit_threshold=vit_threshold,
        llm_threshold=llm_threshold,
        iterations=iterations,
        oversize=oversize,
        drop_last=drop_last,
        seed=seed,
        cost_model=cost_model,
        context_parallel_size=context_parallel_size,
        objective=objective,
    )
    world_size = check_world_size(world_size)
    epoch = check_epoch(epoch)
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    if not options.has_capacities:
        caps = search_capacity(lengths, options=options, world_size=world_size)
        options = options.replace(vit_capacity=caps.vit_capacity, llm_capacity=caps.llm_capacity)
    plan = build_plan(lengths, options, world_size=world_size, epoch=epoch, start=start)
    if options.context_parallel_size > 1:
        plan = dataclasses.replace(plan, context_parallel_size=options.context_parallel_size)
    return plan
