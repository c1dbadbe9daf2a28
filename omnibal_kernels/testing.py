"""Plain, slow, obviously correct references, shared by tests and benchmarks.

Each fast path of the library is checked against one of these. They favour clarity over speed: Python
loops, numpy and plain torch only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# ---------------------------------------------------------------------------------------------------------
# Balance: grouping references (the C++ engine's shuffles are reused, so outputs match exactly)
# ---------------------------------------------------------------------------------------------------------

# Stream ids of csrc/grouping.cpp.
_STREAM_ISF_ROUND = 1
_STREAM_NEXT_FIT = 2


def next_fit_reference(order: Sequence[int], vit: np.ndarray, llm: np.ndarray, vit_capacity: int,
                       llm_capacity: int) -> list[list[int]]:
    """Next-fit over ``order``: a new pack whenever the next sample would overflow a capacity."""
    packs: list[list[int]] = []
    current: list[int] = []
    v_sum = t_sum = 0
    for i in order:
        v, t = int(vit[i]), int(llm[i])
        if current and (v_sum + v > vit_capacity or t_sum + t > llm_capacity):
            packs.append(current)
            current, v_sum, t_sum = [], 0, 0
        current.append(int(i))
        v_sum += v
        t_sum += t
    if current:
        packs.append(current)
    return packs


def isf_reference(vit: np.ndarray, llm: np.ndarray, items: np.ndarray, vit_capacity: int, llm_capacity: int,
                  vit_threshold: int, llm_threshold: int, iterations: int, seed: int) -> list[list[int]]:
    """The OmniBal Iterative Sampling and Filtering, step by step, with the engine's shuffles."""
    from . import _ext

    C = _ext.load()

    def shuffled(ids: Sequence[int], round_index: int) -> np.ndarray:
        return C.shuffle(np.asarray(ids, dtype=np.int64), C.derive_seed(seed, _STREAM_ISF_ROUND, round_index))

    out: list[list[int]] = []
    groups = next_fit_reference(shuffled(items, 0), vit, llm, vit_capacity, llm_capacity)
    for r in range(1, iterations):
        pool: list[int] = []
        for g in groups:
            if sum(int(vit[i]) for i in g) >= vit_threshold or sum(int(llm[i]) for i in g) >= llm_threshold:
                out.append(g)
            else:
                pool.extend(g)
        if not pool:
            groups = []
            break
        groups = next_fit_reference(shuffled(pool, r), vit, llm, vit_capacity, llm_capacity)
    out.extend(groups)
    return out


def random_next_fit_reference(vit: np.ndarray, llm: np.ndarray, items: np.ndarray, vit_capacity: int,
                              llm_capacity: int, seed: int) -> list[list[int]]:
    """Random next-fit with the engine's shuffle."""
    from . import _ext

    C = _ext.load()
    order = C.shuffle(np.asarray(items, dtype=np.int64), C.derive_seed(seed, _STREAM_NEXT_FIT, 0))
    return next_fit_reference(order, vit, llm, vit_capacity, llm_capacity)


def dist_ratio_reference(step_loads: Sequence[Sequence[float]], min_denominator: float = 0.0) -> float:
    """The paper's Dist Ratio, loop by loop as the authors' script computes it."""
    ratios = []
    for loads in step_loads:
        peak = max(loads)
        waste = sum(peak - x for x in loads)
        denom = max(peak * len(loads), min_denominator)
        ratios.append(waste / denom if denom > 0 else 0.0)
    return sum(ratios) / len(ratios) if ratios else 0.0
