"""Capacity search: from a wanted mean number of samples per pack to (ViT capacity, LLM capacity).

* ``balanced`` and ``random``: capacities that fit the data. The LLM capacity follows the ViT capacity at the
  data's own ratio of tokens to ViT load, plus a headroom for the spread of that ratio over the samples of a
  pack (``HEADROOM_SIGMAS`` standard deviations of a pack's token excess over the ratio), so the ViT load
  binds and the LLM load keeps room for the exchanges that balance steps; text-only data has only the LLM
  capacity. Both are sized so that packs hold ``target_batch_size`` samples on average, and raised together,
  keeping their ratio, until the largest sample fits: by default no sample is oversize. Then, where the
  samples over half the binding capacity (no two of which share a pack) leave more room in their packs than
  the smaller samples hold, packs cannot reach that capacity: both are raised until the smaller samples can
  fill that room (``_pairing_scale``), and ``search_capacity`` warns.
* ``isf``: the OmniBal authors' grid, an LLM step of ``tokens_per_vit_unit`` tokens (the mean 256-binned
  sample length over the mean ViT load, rounded down to a multiple of 16) from 4096 tokens and one ViT unit
  per step: candidate ``k`` is ``(4096 // step + k, 4096 + k * step)``. As the authors, every candidate whose
  mean pack size lies in ``[target, target + 1]`` is planned (in C++, milliseconds each) and the one with
  the lowest ViT + LLM dist ratio wins; the mean pack size is predicted in closed form,
  ``num_packs ~= max(sum(vit) / Qv, sum(llm) / Qt)``. Unless ``oversize`` allows oversize samples,
  candidates are raised until the largest sample fits.

Capacities given by the user are never searched: then the ``oversize`` policy of ``plan_packs`` applies.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, NamedTuple, Optional, Union

import numpy as np

from .._progress import progress_bar
from .._warnings import CapacityWarning
from ..lengths import Lengths
from .cost import CostModel
from .engine import build_plan
from .options import IsfOptions, PlanOptions, check_options, check_world_size, default_isf_thresholds
from .packs import as_lengths
from .report import balance_report

__all__ = ["Capacities", "search_capacity"]

_BASE_TOKENS = 4096  # the authors' starting LLM capacity
# The LLM headroom covers this many standard deviations of a pack's token excess over the data's ratio, so
# best fit almost never has to close a pack on its tokens while ViT room is left (ViT loads are coarse: one
# tile missing in a 16-tile pack is 6% of it). More headroom costs only LLM fill while the ViT capacity binds;
# benchmarks/bench_balance.py::test_headroom_sigmas measures fills and dist ratios per choice.
HEADROOM_SIGMAS = 4.0
# The spread of the token excess is estimated on an evenly strided subset of at most this many samples.
_SPREAD_SAMPLES = 1 << 16
_ALIGN = 16


class Capacities(NamedTuple):
    """Searched capacities, ISF's default thresholds for them, and the predicted mean samples per pack.

    ``raised``: the capacities were raised past those of ``target_batch_size`` so that the largest sample fits;
    ``predicted_batch_size`` then says how many samples packs hold instead (``search_capacity`` warns).
    """

    vit_capacity: int
    llm_capacity: int
    vit_threshold: int
    llm_threshold: int
    predicted_batch_size: float
    raised: bool = False


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
    options: Optional[PlanOptions] = None,
    *,
    world_size: int = 8,
    progress: Optional[bool] = None,
) -> Capacities:
    """Finds capacities whose packs hold about ``options.target_batch_size`` samples on average.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts).
        options: a :class:`~omnibal_kernels.balance.options.PlanOptions` without capacities (default: its
            defaults). ``method`` is the planning method the capacities are for (``"isf"`` evaluates candidates
            by planning them with the options' ``seed`` and ``isf.iterations``); with ``"isf"`` and
            ``oversize="error"`` the capacities hold the largest sample (the other methods' capacities always
            hold every sample).
        world_size: ranks, for the ISF evaluation.
        progress: show a progress bar over ISF candidates (default: when stderr is a terminal).

    Returns:
        ``Capacities(vit_capacity, llm_capacity, vit_threshold, llm_threshold, predicted_batch_size, raised)``;
        the thresholds are ISF's defaults (``vit_capacity`` and ``llm_capacity - 128``).

    Warns:
        CapacityWarning: when the capacities had to be raised past the target's so that the largest sample fits
            (``raised``), naming that sample's loads and the predicted mean samples per pack.
    """
    options = check_options(options)
    if options.has_capacities:
        raise ValueError(
            "options give vit_capacity and llm_capacity: there is nothing to search "
            "(search with options whose capacities are None)"
        )
    world_size = check_world_size(world_size)
    lengths = as_lengths(lengths)
    n = len(lengths)
    if n == 0:
        raise ValueError("lengths is empty")
    # A pack cannot hold more samples than there are: aim at most at one pack of everything.
    target = min(options.target_batch_size, float(n))
    if options.method != "isf":
        caps, reason = _fitted_capacities(lengths, target)
    else:
        caps = _isf_capacities(lengths, target, options, world_size, progress)
        reason = "largest" if caps.raised else ""
    if reason == "pairs":
        warnings.warn(
            f"target_batch_size={options.target_batch_size:g}: at the capacities it gives, the samples over half a "
            "capacity leave more room in their packs than the smaller samples can fill, so packs could not reach "
            f"the capacity; they were raised to ViT {caps.vit_capacity} / LLM {caps.llm_capacity}: packs hold about "
            f"{caps.predicted_batch_size:.3g} samples on average (predicted_batch_size), not "
            f"{options.target_batch_size:g}; give the capacities to keep smaller packs",
            CapacityWarning,
            stacklevel=2,
        )
    elif caps.raised:
        stats = lengths.stats()
        warnings.warn(
            f"target_batch_size={options.target_batch_size:g}: the capacities it gives cannot hold the largest "
            f"sample (ViT load {stats.vit_max}, {stats.llm_max} tokens), so they were raised to ViT "
            f"{caps.vit_capacity} / LLM {caps.llm_capacity}: packs hold about {caps.predicted_batch_size:.3g} "
            f"samples on average (predicted_batch_size), not {options.target_batch_size:g}; give the capacities "
            "with oversize='single' (--vit-capacity, --llm-capacity and --oversize single on the command line) to "
            "keep smaller packs",
            CapacityWarning,
            stacklevel=2,
        )
    return caps


def _isf_capacities(
    lengths: Lengths, target: float, options: PlanOptions, world_size: int, progress: Optional[bool]
) -> Capacities:
    """The authors' grid candidate for ``target`` (module docstring), raised to hold the largest sample unless
    ``oversize`` allows oversize samples."""
    n = len(lengths)
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
    k_target = k
    if options.oversize == "error":
        if has_vit:
            k = max(k, stats.vit_max - vit0)
        k = max(k, math.ceil((stats.llm_max - _BASE_TOKENS) / step))
    raised = k > k_target
    while predicted(k) < target * (1 - 1e-12):  # guards the rounding of the closed form (a step or two)
        k += 1

    k = _best_isf_candidate(lengths, k, caps, predicted, target, options, world_size, progress)
    qv, qt = caps(k)
    return Capacities(qv, qt, *default_isf_thresholds(qv, qt), predicted(k), raised)


def _fitted_capacities(lengths: Lengths, target: float) -> tuple[Capacities, str]:
    """Capacities at the data's ratio (plus headroom) for ``target`` samples per pack, holding every sample, and
    why they were raised past the target's ("": they were not; "largest": to hold the largest sample; "pairs": so
    that the samples over half the binding capacity can be filled, see :func:`_pairing_scale`)."""
    n = len(lengths)
    stats = lengths.stats()
    vit_total, llm_total = float(stats.vit_sum), float(stats.llm_sum)
    stride = max(n // _SPREAD_SAMPLES, 1)
    if vit_total == 0:  # text only: one capacity
        wanted = max(math.ceil(target * llm_total / n), 1)
        llm_cap = max(wanted, int(stats.llm_max))
        paired_cap = math.ceil(_pairing_scale(lengths.llm[::stride], lambda cap: cap, float(llm_cap)) - 1e-9)
        reason = "pairs" if paired_cap > llm_cap else ("largest" if llm_cap > wanted else "")
        llm_cap = max(llm_cap, paired_cap)
        return Capacities(
            0, llm_cap, *default_isf_thresholds(0, llm_cap), n / max(llm_total / llm_cap, 1.0), bool(reason)
        ), reason
    tokens_per_unit = llm_total / vit_total
    vit = lengths.vit[::stride].astype(np.float64)
    excess = lengths.llm[::stride] - vit * tokens_per_unit  # tokens beyond the ratio, per sample
    excess_std = float(np.sqrt(np.mean(excess * excess)))
    vit_mean = vit_total / n

    # Capacities for `scale` mean samples per pack: the ViT capacity holds scale mean ViT loads, the LLM
    # capacity their tokens at the ratio plus the headroom of a pack of `scale` samples.
    def caps(scale: float) -> tuple[float, float]:
        qv = scale * vit_mean
        return qv, qv * tokens_per_unit + HEADROOM_SIGMAS * math.sqrt(scale) * excess_std

    scale = target
    for _ in range(64):  # raise the scale until the largest sample fits (the headroom grows with it)
        qv, qt = caps(scale)
        need = max(stats.vit_max / qv, stats.llm_max / qt)
        if need <= 1.0:
            break
        scale *= need
    reason = "largest" if scale > target else ""
    paired = _pairing_scale(vit, lambda s: caps(s)[0], scale)
    if paired > scale:
        scale, reason = paired, "pairs"
    qv, qt = caps(scale)
    qv_int = max(math.ceil(qv - 1e-9), int(stats.vit_max), 1)
    qt_int = max(math.ceil(qt - 1e-9), int(stats.llm_max), 1)
    packs = max(vit_total / qv_int, llm_total / qt_int, 1.0)
    return Capacities(qv_int, qt_int, *default_isf_thresholds(qv_int, qt_int), n / packs, bool(reason)), reason


def _pairing_scale(load: np.ndarray, capacity_at: Callable[[float], float], start: float) -> float:
    """The least scale from ``start`` at which the samples at or below half the binding capacity
    (``capacity_at(scale)``) hold at least as much load as the room the samples above half of it leave.

    No two samples over half a capacity share a pack, so each needs smaller ones to fill the rest of its pack;
    where the smaller ones hold less than that room, packs cannot reach the capacity and their count stays
    above the volume bound (and samples alone in a pack repeat in every epoch). ``load``: the binding load of (a
    strided subset of) the samples. Returns ``start`` when it holds there.
    """
    low = start
    load = np.sort(np.asarray(load, np.float64))
    total = np.concatenate([[0.0], np.cumsum(load)])

    def unfilled(scale: float) -> bool:
        cap = capacity_at(scale)
        half = int(np.searchsorted(load, cap / 2, side="right"))  # load[:half] <= cap / 2
        room = (load.size - half) * cap - (total[-1] - total[half])
        return bool(room > total[half])

    if load.size == 0 or not unfilled(low):
        return low
    high = low
    while unfilled(high):  # at twice the largest load no sample is over half the capacity
        high *= 2.0
    for _ in range(40):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if unfilled(mid) else (low, mid)
    return high


# ISF packs and orders without a cost model; the report of a candidate does not depend on this one.
_ISF_COST = CostModel.internvl_7b()
# At most this many ISF candidates are planned (the authors' [target, target + 1] window holds about
# target + 1 of them when the ViT capacity binds).
_MAX_ISF_CANDIDATES = 32


def _best_isf_candidate(
    lengths: Lengths,
    k_first: int,
    caps: Callable[[int], tuple[int, int]],
    predicted: Callable[[int], float],
    target: float,
    options: PlanOptions,
    world_size: int,
    progress: Optional[bool],
) -> int:
    """The authors' choice among candidates: lowest vit_dist + llm_dist with ave_bs in [target, target + 1]."""
    # each candidate is planned as the authors do: default thresholds, no dropped step, epoch 0
    candidate = options.replace(
        isf=IsfOptions(iterations=options.isf.iterations), drop_last=False, cost_model=_ISF_COST
    )
    best_k, best_score = k_first, math.inf
    k = k_first
    bar = progress_bar(total=None, desc="capacity search (isf)", enabled=progress)
    try:
        while True:
            qv, qt = caps(k)
            plan = build_plan(
                lengths, candidate.replace(vit_capacity=qv, llm_capacity=qt), world_size=world_size, epoch=0
            )
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
