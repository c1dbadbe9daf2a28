"""``plan_packs``: the public entry of planning. Checks the options, searches capacities when they are not
given (:mod:`~omnibal_kernels.balance.search`) and builds the plan (:mod:`~omnibal_kernels.balance.engine`,
whose docstring describes the methods).
"""
from __future__ import annotations

import time
from typing import Optional, Union

import numpy as np

from ..lengths import Lengths
from .cost import CostModel
from .engine import ISF_ITERATIONS, build_plan, check_plan_options
from .packs import Method, OversizePolicy, Plan, as_lengths, epoch_seed
from .search import search_capacity

__all__ = ["plan_packs"]


def plan_packs(
    lengths: Union[Lengths, tuple, np.ndarray],
    *,
    world_size: int,
    method: Method = "balanced",
    target_batch_size: float = 4.0,
    vit_capacity: Optional[int] = None,
    llm_capacity: Optional[int] = None,
    vit_threshold: Optional[int] = None,
    llm_threshold: Optional[int] = None,
    iterations: int = ISF_ITERATIONS,
    oversize: OversizePolicy = "error",
    drop_last: bool = False,
    seed: int = 0,
    epoch: int = 0,
    cost_model: Optional[CostModel] = None,
) -> Plan:
    """Groups samples into packs under a ViT and an LLM capacity and schedules them on ranks and steps.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts).
        world_size: data-parallel ranks; every step gives each rank one pack.
        method: ``"balanced"`` (default), ``"isf"`` or ``"random"`` (see the module docstring).
        target_batch_size: mean samples per pack wanted, used to search capacities when they are not given.
        vit_capacity, llm_capacity: the capacities (tiles/patches and tokens per pack); both or neither.
        vit_threshold, llm_threshold: ISF keep thresholds (default: ``vit_capacity`` and
            ``llm_capacity - 128``, as the authors' scripts).
        iterations: ISF rounds (default 50).
        oversize: what to do with samples that alone exceed a capacity: ``"error"`` (raise
            ``OversizeError``), ``"single"`` (each in its own pack, reported) or ``"drop"`` (left out, reported).
        drop_last: drop the packs of a ragged last step (reported) instead of filling it with reused packs.
        seed, epoch: the plan is a pure function of these (and the rest); each epoch gets new packs and order.
        cost_model: per-sample cost the balanced method equalizes (default ``CostModel.internvl_7b()``).

    Returns:
        A ``Plan``.

    Raises:
        OversizeError: a sample alone exceeds a capacity and ``oversize="error"`` (naming the samples).
        TooFewPacksError: ``drop_last=True`` and fewer packs than ``world_size`` (no whole step).
        ValueError/TypeError: bad options, naming the argument.
    """
    start = time.perf_counter()
    lengths = as_lengths(lengths)
    world_size, iterations = check_plan_options(lengths, world_size, method, oversize, iterations)
    epoch_seed(seed, epoch)  # checks seed and epoch before any search
    if (vit_capacity is None) != (llm_capacity is None):
        raise ValueError("give both vit_capacity and llm_capacity, or neither (then they are searched)")
    if vit_capacity is None:
        caps = search_capacity(lengths, target_batch_size, method=method, world_size=world_size,
                               oversize=oversize, seed=seed, iterations=iterations)
        vit_capacity, llm_capacity = caps.vit_capacity, caps.llm_capacity
    return build_plan(lengths, world_size=world_size, method=method, vit_capacity=vit_capacity,
                      llm_capacity=llm_capacity, vit_threshold=vit_threshold, llm_threshold=llm_threshold,
                      iterations=iterations, oversize=oversize, drop_last=drop_last, seed=seed, epoch=epoch,
                      cost_model=cost_model or CostModel.internvl_7b(), start=start)
