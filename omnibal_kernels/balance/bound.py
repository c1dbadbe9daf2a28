"""A lower bound on the epoch cost of every plan of given samples under given capacities at a world size.

The epoch cost of a plan is the sum over its steps of the slowest rank's pack cost (what a data-parallel step
waits for); a pack costs the sum of its samples' costs plus ``per_pack``. :func:`epoch_bound` returns a number
no plan can go below: at least the ideal (all costs spread evenly over the ranks), more where single samples
or the few packs heavy enough to stand out bind.

Derivation. Take any plan with steps ``s`` of ``W`` slots (one pack each), ``M_s`` the costliest pack of step
``s`` and ``E = sum_s M_s``. Write ``x`` for a level of a pack's cost less ``per_pack`` (so ``x >= -per_pack``)
and ``n(x)`` for the number of distinct packs whose samples cost more than ``x`` together.

1. Layer cake: ``E = int_{-per_pack}^inf #{s : M_s - per_pack > x} dx``. The ``n(x)`` packs above ``x`` sit
   in at least ``ceil(n(x) / W)`` steps, each with ``M_s - per_pack > x``; so ``E >= int ceil(n(x) / W) dx``.
   Slots that repeat a pack only add to ``E``.
2. ``int n(x) dx`` is the cost of the distinct packs, at least ``T = sum_i c_i + per_pack * P_min`` (every
   sample in a pack, at least ``P_min`` packs). For ``n`` anywhere in ``[L(x), U(x)]`` (bounds valid for every
   plan, below) and any ``lambda`` in ``[0, 1 / W]``: ``ceil(n / W) >= lambda n + min_{L <= m <= U}
   (ceil(m / W) - lambda m)``. Integrated, ``E >= lambda T + int min(...) dx``; the right side is linear in
   ``lambda``, so its best value is at an end:

   * ``lambda = 1 / W``: ``E >= T / W + int gamma dx`` with ``gamma = ceil(L / W) - U / W`` where no multiple
     of ``W`` lies in ``[L, U]`` and ``L > 0``, else 0 (``ceil(m / W) - m / W`` is 0 at a multiple of ``W``
     and, inside one run of ``W``, least at the largest ``m``). ``T / W`` is the ideal.
   * ``lambda = 0``: ``E >= int ceil(L / W) dx``: the steps that samples too costly to share a step force,
     at least the costliest sample plus ``per_pack``.

   The bound is the larger of the two.
3. ``L(x)``: the samples with ``c_i > x`` lie in packs above ``x``, so there are at least as many of those
   as these samples need packs: the larger of their volume in either load and their number over half a
   capacity, at least one when there are any; for all the samples, :func:`min_packs` (tighter, and one pass
   over the samples rather than one per level).
4. ``U(x)``, the least of these counts, each an upper bound on ``n(x)`` for every plan:

   * samples: ``N`` (every pack holds one); with ``num_steps`` given, also ``num_steps * W``.
   * reach: with normalized loads ``l_i = alpha t_i / Qt + (1 - alpha) v_i / Qv`` (a pack's sum is at most 1),
     let ``j`` be a pack's sample of largest ``l``. Every other sample of the pack has ``l <= min(l_j, 1 -
     l_j)`` and so costs at most ``l`` times ``D(min(l_j, 1 - l_j))``, ``D(y)`` the largest ``c_i / l_i`` over
     the samples with ``l_i <= y``; their loads sum to at most ``1 - l_j``. The pack costs at most ``R_j = c_j +
     (1 - l_j) D(min(l_j, 1 - l_j))``, and packs above ``x`` have distinct samples ``j``: ``n(x) <= #{R_j >
     x}``. Mixes ``alpha`` in :data:`MIXES` (only ``1`` for text).

   A count by each pack's cost above a linear budget (``rho Qt + sigma Qv`` plus the samples' excess over
   ``rho t_i + sigma v_i``) is valid too but raises this bound neither on the synthetic classes nor on random
   instances, for many sorts more: it is not used.

5. Numerically, on levels ``x_0 < ... < x_m`` (``x_0 = -per_pack``, the sample costs, geometric ones between
   them; at most :data:`MAX_LEVELS`): ``n`` does not grow with ``x``, so on ``[x_k, x_{k+1})`` the bound takes
   ``L`` of the samples costing at least ``x_{k+1}`` and ``U`` at ``x_k``. Any levels and any parameters give a
   valid bound; more only tighten it. Counts are taken a little below each level (``_SLACK``) so that
   rounding can only lower the bound.

Samples over a capacity count as their own packs (``oversize="single"``): their loads are clipped to the
capacity, which keeps every step above valid for such packs. Exact where every sample fills a pack (then
``L = U = n``; up to ``MAX_LEVELS - 1024`` distinct costs, all of them levels). Tested against exhaustive
optima of tiny instances and against plans of every method (``tests/test_epoch_bound.py``).
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from .._checks import check_positive_int
from ..lengths import Lengths
from .cost import CostModel

__all__ = ["MIXES", "costs_epoch_bound", "epoch_bound", "min_packs"]

# Normalized-load mixes of the reach count (step 4): the ViT load alone, the LLM load alone, and between; text
# data uses the LLM load only. Each costs two sorts of the samples.
MIXES = (0.0, 0.5, 1.0)
# Levels of the integral (step 5): geometric ones and the sample costs, evenly chosen when there are more.
_GEOMETRIC_LEVELS = 1024
MAX_LEVELS = 8192
# Counts are taken this far (relative to the costliest sample) below each level: float rounding in the costs,
# loads and sums can then only raise a count, never lower it.
_SLACK = 1e-9
# Geometric levels start no lower than this share of the costliest sample (no overflow for tiny
# costs; any start is valid).
_DYNAMIC_RANGE = 1e-12


def _clipped(load: np.ndarray, capacity: int) -> np.ndarray:
    return np.minimum(load, capacity) if capacity > 0 else np.zeros_like(load)


def _prefix_min_packs(vit: np.ndarray, llm: np.ndarray, vit_capacity: int, llm_capacity: int) -> np.ndarray:
    """``(N + 1,)`` int64 lower bounds on the packs of the first ``j`` samples, ``j = 0 .. N`` (loads clipped):
    the larger of their volume in either load and their number over half a capacity."""
    zero = np.zeros(1, np.int64)

    def need(load: np.ndarray, capacity: int) -> np.ndarray:
        volume = -(-np.concatenate([zero, np.cumsum(load)]) // capacity)
        big = np.concatenate([zero, np.cumsum(2 * load > capacity)])
        return np.maximum(volume, big)

    out = need(llm, llm_capacity)
    if vit_capacity > 0:
        out = np.maximum(out, need(vit, vit_capacity))
    out[1:] = np.maximum(out[1:], 1)
    return out


def _bin_packing_bound(loads: np.ndarray, capacity: int) -> int:
    """The L2 lower bound (Martello and Toth) on the bins of ``capacity`` that hold ``loads`` (each within it).

    For a threshold ``a <= capacity / 2``: a load over ``capacity - a`` fills its bin for loads of at least
    ``a``; a load over half the capacity shares its bin with no other such load; the loads from ``a`` to half
    the capacity need whatever room the bins of the loads over half leave, and bins of their own past that.
    The bound is the largest count over the thresholds ``0`` and each load up to half the capacity; it is at
    least ``ceil(sum / capacity)`` (the threshold 0) and the number of loads over half the capacity."""
    x = np.sort(loads[loads > 0])
    if x.size == 0:
        return 0
    prefix = np.concatenate([np.zeros(1, np.int64), np.cumsum(x)])
    thresholds = np.unique(np.concatenate([np.zeros(1, np.int64), x[2 * x <= capacity]]))
    over_half = int(np.searchsorted(2 * x, capacity, side="right"))  # first load over half the capacity
    full = np.searchsorted(x, capacity - thresholds, side="right")  # first load that leaves no room for a
    small = np.searchsorted(x, thresholds, side="left")  # first load of at least a
    alone = x.size - full
    halves = full - over_half
    room = halves * capacity - (prefix[full] - prefix[over_half])
    rest = np.maximum(0, -(-(prefix[over_half] - prefix[small] - room) // capacity))
    return int((alone + halves + rest).max())


def over_capacity(vit: np.ndarray, llm: np.ndarray, vit_capacity: int, llm_capacity: int) -> np.ndarray:
    """``(N,)`` bool: the samples over a capacity (``vit_capacity`` 0: the ViT load is not bounded), each a pack
    of its own."""
    over = np.asarray(llm) > llm_capacity
    if vit_capacity > 0:
        over |= np.asarray(vit) > vit_capacity
    return over


def min_packs(vit: np.ndarray, llm: np.ndarray, vit_capacity: int, llm_capacity: int) -> int:
    """The fewest packs that can hold these samples, as a lower bound.

    A pack of its own for every sample over a capacity; for the others, the larger over the two loads of the
    bin-packing bound L2 of Martello and Toth: the samples over half a capacity need a pack each, and the
    smaller ones fill at most the room those leave. It is at least their volume in either load
    (``ceil(sum / capacity)``) and their number over half a capacity, and above both where the smaller samples
    do not fit the room the large ones leave (pages of 12 tiles and of 9 under a 20-tile capacity: no 9 fits
    beside a 12). At least 1 for any samples, 0 for none.

    Args:
        vit, llm: ``(N,)`` int per-sample loads.
        vit_capacity: ViT capacity (0: the ViT load is not bounded).
        llm_capacity: LLM capacity, positive.
    """
    vit, llm = np.asarray(vit, np.int64), np.asarray(llm, np.int64)
    over = over_capacity(vit, llm, vit_capacity, llm_capacity)
    within = ~over
    packs = _bin_packing_bound(llm[within], llm_capacity)
    if vit_capacity > 0:
        packs = max(packs, _bin_packing_bound(vit[within], vit_capacity))
    packs += int(np.count_nonzero(over))
    return max(packs, 1) if vit.size else 0


def _reach_counts(c: np.ndarray, load: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Step 4, reach: an upper bound on the packs above each of ``levels``, for normalized loads ``load``."""
    if ((load <= 0) & (c > 0)).any():  # a costly sample without this load: no density bound
        return np.full(levels.shape, np.inf)
    keep = load > 0
    c, load = c[keep], load[keep]
    by_load = np.argsort(load, kind="stable")
    best_density = np.maximum.accumulate(c[by_load] / load[by_load])
    partner = np.minimum(load, 1.0 - load) * (1.0 + _SLACK) + _SLACK
    k = np.searchsorted(load[by_load], partner, side="right")
    reach = c + np.maximum(1.0 - load, 0.0) * np.where(k > 0, best_density[np.maximum(k - 1, 0)], 0.0)
    reach = np.sort(reach)
    # samples of no cost and no load reach at most 0: counted at every level below 0 by the caller's N
    return (reach.size - np.searchsorted(reach, levels, side="right")).astype(np.float64) + (levels < 0) * (~keep).sum()


def _geometric(low: float, top: float, count: int) -> np.ndarray:
    """``count`` geometric values from ``low`` (at least ``top * _DYNAMIC_RANGE``) to ``top``."""
    low = max(low, top * _DYNAMIC_RANGE)
    return low * (top / low) ** np.linspace(0.0, 1.0, count)


def _levels(costs_desc: np.ndarray, per_pack: float) -> np.ndarray:
    """Step 5: increasing levels from ``-per_pack`` to the costliest sample."""
    positive = costs_desc[costs_desc > 0]
    if positive.size == 0:
        return np.array([-per_pack, 0.0]) if per_pack > 0 else np.zeros(1)
    top, low = positive[0], positive[-1]
    geometric = _geometric(low, top, _GEOMETRIC_LEVELS)
    samples = np.unique(positive)
    if samples.size > MAX_LEVELS - _GEOMETRIC_LEVELS:
        samples = samples[np.linspace(0, samples.size - 1, MAX_LEVELS - _GEOMETRIC_LEVELS).astype(np.int64)]
    return np.unique(np.concatenate([[-per_pack, 0.0, low, top], geometric, samples]))


def _upper_counts(
    c: np.ndarray, vit: np.ndarray, llm: np.ndarray, vit_capacity: int, llm_capacity: int, levels: np.ndarray
) -> np.ndarray:
    """Step 4: the least of the reach counts at each of ``levels`` (loads clipped)."""
    upper = np.full(levels.shape, np.inf)
    has_vit = vit_capacity > 0 and bool(vit.any())
    mixes = MIXES if has_vit else (1.0,)
    t = llm / llm_capacity
    u = vit / vit_capacity if has_vit else np.zeros_like(t)
    for alpha in mixes:
        upper = np.minimum(upper, _reach_counts(c, alpha * t + (1.0 - alpha) * u, levels))
    return upper


def costs_epoch_bound(
    costs: np.ndarray,
    vit: np.ndarray,
    llm: np.ndarray,
    *,
    vit_capacity: int,
    llm_capacity: int,
    world_size: int,
    per_pack: float = 0.0,
    num_steps: Optional[int] = None,
) -> float:
    """:func:`epoch_bound` from per-sample costs (the module docstring derives it).

    Args:
        costs: ``(N,)`` float per-sample cost, finite and non-negative (``per_sample`` included).
        vit, llm: ``(N,)`` int per-sample loads.
        vit_capacity: ViT capacity (0: text only, the ViT load unbounded).
        llm_capacity: LLM capacity, positive.
        world_size: data-parallel ranks; every step gives each one pack.
        per_pack: the cost every pack adds, non-negative.
        num_steps: when given, the bound holds for plans of exactly that many steps (at most ``num_steps *
            world_size`` packs); ``None``: for plans of any length.

    Returns:
        The bound, at least ``(sum(costs) + per_pack * min_packs) / world_size``; 0 for no samples.

    Raises:
        ValueError: mismatched shapes, negative or non-finite costs or loads, non-positive capacities or world
            size, or ``num_steps`` too few to hold the samples' :func:`min_packs`.
    """
    return ideal_and_bound(
        costs,
        vit,
        llm,
        vit_capacity=vit_capacity,
        llm_capacity=llm_capacity,
        world_size=world_size,
        per_pack=per_pack,
        num_steps=num_steps,
    )[1]


def ideal_and_bound(
    costs: np.ndarray,
    vit: np.ndarray,
    llm: np.ndarray,
    *,
    vit_capacity: int,
    llm_capacity: int,
    world_size: int,
    per_pack: float = 0.0,
    num_steps: Optional[int] = None,
) -> tuple[float, float]:
    """The ideal, ``(sum(costs) + per_pack * min_packs) / world_size``, and :func:`costs_epoch_bound` (at least
    the ideal), from one pass: both 0 for no samples. Arguments and errors as :func:`costs_epoch_bound`."""
    world_size = check_positive_int("world_size", world_size, minimum=1)
    llm_capacity = check_positive_int("llm_capacity", llm_capacity, minimum=1)
    vit_capacity = check_positive_int("vit_capacity", vit_capacity, minimum=0)
    c = np.asarray(costs, np.float64)
    vit, llm = np.asarray(vit), np.asarray(llm)
    if c.ndim != 1 or vit.shape != c.shape or llm.shape != c.shape:
        raise ValueError(
            f"costs, vit and llm must be (N,) arrays of one length, got shapes {c.shape}, {vit.shape}, {llm.shape}"
        )
    if not (np.isfinite(c).all() and (c >= 0).all()):
        raise ValueError("costs must be finite and non-negative")
    if (vit < 0).any() or (llm < 0).any():
        raise ValueError("vit and llm loads must be non-negative")
    per_pack = float(per_pack)
    if not (np.isfinite(per_pack) and per_pack >= 0):
        raise ValueError(f"per_pack must be finite and non-negative, got {per_pack!r}")
    n = c.shape[0]
    if n == 0:
        return 0.0, 0.0
    all_samples = min_packs(vit, llm, vit_capacity, llm_capacity)
    vit = _clipped(vit.astype(np.int64), vit_capacity)
    llm = _clipped(llm.astype(np.int64), llm_capacity)
    order = np.lexsort((np.arange(n), -c))
    cs = c[order]
    forced = _prefix_min_packs(vit[order], llm[order], vit_capacity, llm_capacity)
    forced[-1] = max(int(forced[-1]), all_samples)
    most_packs = float(n)
    if num_steps is not None:
        num_steps = check_positive_int("num_steps", num_steps, minimum=1)
        if num_steps * world_size < forced[-1]:
            raise ValueError(
                f"num_steps: {num_steps} steps of {world_size} packs cannot hold these samples, "
                f"which need at least {int(forced[-1])} packs"
            )
        most_packs = min(most_packs, float(num_steps * world_size))
    ideal = (float(c.sum()) + per_pack * float(forced[-1])) / world_size
    levels = _levels(cs, per_pack)
    if levels.size < 2:
        return ideal, ideal
    slack = _SLACK * float(cs[0])
    upper = np.minimum(_upper_counts(c, vit, llm, vit_capacity, llm_capacity, levels[:-1] - slack), most_packs)
    # on [levels[k], levels[k+1]): L of the samples costing at least levels[k+1], U at levels[k]
    lower = forced[np.searchsorted(-cs, -levels[1:], side="right")].astype(np.float64)
    upper = np.maximum(upper, lower)
    width = np.diff(levels)
    steps = np.ceil(lower / world_size)
    gamma = np.where((lower > 0) & (upper < steps * world_size), steps - upper / world_size, 0.0)
    return ideal, float(max(ideal + (gamma * width).sum(), (steps * width).sum()))


def epoch_bound(
    lengths: Union[Lengths, tuple, np.ndarray],
    cost_model: Optional[CostModel] = None,
    *,
    vit_capacity: int,
    llm_capacity: int,
    world_size: int,
    num_steps: Optional[int] = None,
) -> float:
    """A lower bound on the epoch cost of every plan of ``lengths`` under the capacities at ``world_size``.

    The epoch cost of a plan is the sum over its steps of the slowest rank's pack cost, a pack costing its
    samples' ``cost_model.sample_costs(lengths)`` plus ``per_pack``; the balance report's ``epoch_cost``. No
    plan that schedules every sample once (each over a capacity in a pack of its own) goes below this number.
    It is at least the ideal, ``(sum of sample costs + per_pack * min_packs) / world_size``, and higher where
    costly samples, or the few packs costly enough to stand out, force steps of their own. The module
    docstring derives it; it takes a few sorts of the samples (``O(N log N)``), fast enough for every report.

    Args:
        lengths: a ``Lengths`` (its ``vit_seqlens`` used by the cost model), a ``(vit, llm)`` tuple or token
            counts.
        cost_model: the cost model (``None``: ``CostModel.internvl_7b()``, as the planner's default).
        vit_capacity, llm_capacity: the capacities (``vit_capacity`` 0: text only).
        world_size: data-parallel ranks.
        num_steps: plans of exactly that many steps only (``None``: any).

    Returns:
        The bound, in the cost model's units.

    Raises:
        TypeError: ``cost_model`` not a ``CostModel``.
        ValueError: as :func:`costs_epoch_bound`.
    """
    from .packs import as_lengths

    lengths = as_lengths(lengths)
    model = CostModel.internvl_7b() if cost_model is None else cost_model
    if not isinstance(model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(model).__name__}")
    return costs_epoch_bound(
        model.sample_costs(lengths),
        lengths.vit,
        lengths.llm,
        vit_capacity=vit_capacity,
        llm_capacity=llm_capacity,
        world_size=world_size,
        per_pack=model.per_pack,
        num_steps=num_steps,
    )
