"""Capacity search: from a wanted mean number of samples per pack to (ViT capacity, LLM capacity).

The grid is the OmniBal authors': an LLM step of ``tokens_per_vit_unit`` tokens (the mean 256-binned sample
length over the mean ViT load, rounded down to a multiple of 16) starting from 4096 tokens, and one ViT unit
per step: candidate ``k`` is ``(4096 // step + k, 4096 + k * step)``. The authors run ISF on every candidate
(12-20 s on 70k samples); here the packs per candidate are predicted in closed form, since packs fill the
binding capacity: ``num_packs ~= max(sum(vit) / Qv, sum(llm) / Qt)``.

* ``balanced`` and ``random``: the smallest candidate whose predicted mean pack size reaches the target.
* ``isf``: as the authors, every candidate whose mean pack size lies in ``[target, target + 1]`` is planned
  (in C++, milliseconds each) and the one with the lowest ViT + LLM dist ratio wins.

Unless ``oversize`` allows oversize samples, candidates are raised until the largest sample fits.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Union

import numpy as np

from ..lengths import Lengths
from .._progress import progress_bar
from .cost import CostModel
from .engine import ISF_ITERATIONS, ISF_LLM_MARGIN, build_plan
from .packs import METHODS, OVERSIZE_POLICIES, as_lengths
from .report import balance_report

__all__ = ["Capacities", "search_capacity"]

_BASE_TOKENS = 4096  # the authors' starting LLM capacity
_ALIGN = 16


class Capacities(NamedTuple):
    """Searched capacities, ISF's default thresholds for them, and the predicted mean samples per pack."""

    vit_capacity: int
    llm_capacity: int
    vit_threshold: int
    llm_threshold: int
    predicted_batch_size: float


def _grid_step(lengths: Lengths) -> tuple[int, int]:
    """(tokens per ViT unit step, ViT capacity at 4096 tokens) of the authors' grid."""
    stats = lengths.stats()
    mean_vit = stats.vit_sum / len(lengths)
    mean_binned = stats.llm_sum_binned / len(lengths)  # lengths rounded up to 256 tokens, as the authors
    step = int(((mean_binned // max(mean_vit, 1.0) + 1) // _ALIGN) * _ALIGN)
    step = max(step, _ALIGN)
    return step, max(_BASE_TOKENS // step, 1)


def search_capacity(
    lengths: Union[Lengths, tuple, np.ndarray],
    target_batch_size: float = 4.0,
    *,
    method: str = "balanced",
    world_size: int = 8,
    oversize: str = "error",
    seed: int = 0,
    iterations: int = ISF_ITERATIONS,
    progress: Optional[bool] = None,
) -> Capacities:
    """Finds capacities whose packs hold about ``target_batch_size`` samples on average.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts).
        target_batch_size: wanted mean samples per pack (> 0).
        method: the planning method the capacities are for (``"isf"`` evaluates candidates by planning).
        world_size: ranks, for the ISF evaluation.
        oversize: when ``"error"``, capacities hold the largest sample.
        seed, iterations: for the ISF evaluation.
        progress: show a progress bar over ISF candidates (default: when stderr is a terminal).

    Returns:
        ``Capacities(vit_capacity, llm_capacity, vit_threshold, llm_threshold, predicted_batch_size)``;
        the thresholds are ISF's defaults (``vit_capacity`` and ``llm_capacity - 128``).
    """
    if not (isinstance(target_batch_size, numbers.Real) and not isinstance(target_batch_size, bool)
            and target_batch_size > 0 and math.isfinite(target_batch_size)):
        raise ValueError(f"target_batch_size must be a positive number, got {target_batch_size!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {oversize!r}")
    lengths = as_lengths(lengths)
    n = len(lengths)
    if n == 0:
        raise ValueError("lengths is empty")
    # A pack cannot hold more samples than there are: aim at most at one pack of everything.
    target = min(float(target_batch_size), float(n))
    step, vit0 = _grid_step(lengths)
    stats = lengths.stats()
    vit_total = float(stats.vit_sum)
    llm_total = float(stats.llm_sum)
    has_vit = vit_total > 0

    def caps(k: int) -> tuple[int, int]:
        return (vit0 + k if has_vit else 0), _BASE_TOKENS + k * step

    def predicted(k: int) -> float:
        qv, qt = caps(k)
        packs = max(vit_total / qv if has_vit else 0.0, llm_total / qt)
        return n / max(packs, 1.0)

    # Smallest k whose predicted mean pack size reaches the target, in closed form on both axes.
    k_min = 1 - vit0 if has_vit else -((_BASE_TOKENS - 1) // step)
    k = k_min
    if has_vit:
        k = max(k, math.ceil(target * vit_total / n) - vit0)
    k = max(k, math.ceil((target * llm_total / n - _BASE_TOKENS) / step))
    if oversize == "error":
        if has_vit:
            k = max(k, stats.vit_max - vit0)
        k = max(k, math.ceil((stats.llm_max - _BASE_TOKENS) / step))
    while predicted(k) < target * (1 - 1e-12):  # guards the rounding of the closed form (a step or two)
        k += 1

    if method == "isf":
        k = _best_isf_candidate(lengths, k, caps, predicted, target, world_size, oversize, seed, iterations,
                                progress)
    qv, qt = caps(k)
    return Capacities(qv, qt, qv, max(qt - ISF_LLM_MARGIN, 1), predicted(k))


# ISF packs and orders without a cost model; the report of a candidate does not depend on this one.
_ISF_COST = CostModel.internvl_7b()
# At most this many ISF candidates are planned (the authors' [target, target + 1] window holds about
# target + 1 of them when the ViT capacity binds).
_MAX_ISF_CANDIDATES = 32


def _best_isf_candidate(lengths, k_first, caps, predicted, target, world_size, oversize, seed, iterations,
                        progress) -> int:
    """The authors' choice among candidates: lowest vit_dist + llm_dist with ave_bs in [target, target + 1]."""
    best_k, best_score = k_first, math.inf
    k = k_first
    bar = progress_bar(total=None, desc="capacity search (isf)", enabled=progress)
    try:
        while True:
            qv, qt = caps(k)
            plan = build_plan(lengths, world_size=world_size, method="isf", vit_capacity=qv, llm_capacity=qt,
                              vit_threshold=None, llm_threshold=None, iterations=iterations, oversize=oversize,
                              drop_last=False, seed=seed, epoch=0, cost_model=_ISF_COST)
            rep = balance_report(plan, lengths)
            bar.update(1)
            if rep.ave_bs > target + 1 or predicted(k) > target + 1 or k - k_first >= _MAX_ISF_CANDIDATES:
                break
            if rep.ave_bs >= target and rep.vit_dist + rep.llm_dist < best_score:
                best_k, best_score = k, rep.vit_dist + rep.llm_dist
            k += 1
    finally:
        bar.close()
    return best_k
