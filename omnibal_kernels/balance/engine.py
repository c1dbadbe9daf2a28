"""The C++ engine for given capacities: samples -> packs under two capacities -> (step, rank) slots.

Methods:

* ``"balanced"`` (default): randomized two-dimensional best fit in rounds (packs at the physical limit of
  the binding capacity); where the pack count is not a multiple of ``world_size``, the packs whose smaller half
  can cost the most are split in two (no pack repeated, none dropped, no nearly empty pack); packs sorted by
  cost and cut into steps, a pack whose costliest sample alone stands above its step's mean moved up one step;
  then samples exchanged (moves, one-for-one swaps and one-for-two trades, within the capacities) between the
  packs of each step until its costliest pack, what the step waits for, costs about the step's mean, partners
  found among all the step's samples by cost and by ViT load; a step left above its mean also trades with the
  packs of the steps before and after it, and cost sinks into a step before whose costliest pack cannot come
  down; once every step is refined, a step still above its mean trades with the packs of the step with the
  most room below its own costliest pack (within it), then moves samples of its costliest packs into packs with
  room in other steps, each kept within its own step's costliest pack (where a capacity fills every pack of the
  step, as long text at its capacity, no exchange inside it moves cost); the cheaper packs of a step left above
  its mean then take cost up to its costliest pack from the packs of the cheapest balanced steps (a sample taken
  where they have room, else one for one or for several of their small ones, which under a quadratic cost cost
  less than one long sample in the same room; partners found by each load and by cost), and those steps are
  refined again about their lower mean (the plan before this is kept where it ends cheaper); then a step's
  costliest packs trade places with cheaper ones of the step above, and the plan is never above its own packs
  sorted by cost, nor above the packs it started from. A pack costs its samples' ``cost_model.sample_costs``
  plus ``per_pack``; with ``objective="stages"`` its ViT and LLM costs are balanced each on its own within each
  step (a pack's score is the larger of the two, each relative to the step's mean). Steps are laid out in a
  stratified random order (no load trend over the epoch) and ranks are shuffled within a step.
* ``"isf"``: the OmniBal paper's Iterative Sampling and Filtering, packs to ranks in random order.
* ``"random"``: random next-fit packs, in random order (the baseline).

Every plan is a pure function of the lengths, the options (the seed among them), the world size and the epoch:
every rank computes the same plan without communication, on every platform.
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

from .. import _ext
from ..lengths import Lengths
from .cost import CostModel
from .options import PlanOptions
from .packs import OversizeError, Plan, TooFewPacksError
from .seeds import epoch_seed

__all__ = ["BEST_FIT_ROUNDS", "REFINE_WORK_PER_SAMPLE", "build_plan"]

# Best-fit rounds of the balanced method: each round raises the fill a little, and later rounds only re-pack
# the few packs that are not yet full, so they cost little (benchmarks/bench_balance.py::test_best_fit_rounds
# measures fill and time per round count).
BEST_FIT_ROUNDS = 16
# The step refinement's work bound, in units (one sample looked at, one binary-search probe) per sample of a
# step: it keeps planning within a fixed factor of sorting the lengths at any pack size
# (benchmarks/bench_balance.py::test_refine_work measures epoch cost and planning time at several bounds;
# 0 turns the exchanges off, 2**62 leaves them unbounded).
REFINE_WORK_PER_SAMPLE = 4096


def build_plan(
    lengths: Lengths, options: PlanOptions, *, world_size: int, epoch: int, start: Optional[float] = None
) -> Plan:
    """The plan of ``lengths`` under ``options``, whose capacities are given.

    ``world_size`` and ``epoch`` are checked by the caller (:func:`~omnibal_kernels.balance.plan_packs`);
    ``start``: the ``time.perf_counter()`` the planning began at (a capacity search included), for
    ``Plan.seconds``. Raises ``OversizeError`` and ``TooFewPacksError`` as :func:`plan_packs` documents.
    """
    start = time.perf_counter() if start is None else start
    plan_seed = epoch_seed(options.seed, epoch)
    method, oversize, drop_last, cost_model = options.method, options.oversize, options.drop_last, options.cost_model
    vit_capacity, llm_capacity = options.capacities()
    vit_threshold, llm_threshold = options.isf_thresholds() if method == "isf" else (None, None)
    iterations = options.isf.iterations
    vit, llm = lengths.vit, lengths.llm
    items, oversize_ids = _split_oversize(lengths, vit_capacity, llm_capacity, oversize)
    C = _ext.load()
    singles = oversize_ids if oversize == "single" else np.zeros(0, np.int64)
    if method == "balanced":
        balanced = C.plan_balanced(
            vit,
            llm,
            items,
            singles if singles.size else None,
            vit_capacity,
            llm_capacity,
            _sample_costs(lengths, cost_model, options.objective),
            cost_model.per_pack,
            BEST_FIT_ROUNDS,
            world_size,
            drop_last,
            plan_seed,
            REFINE_WORK_PER_SAMPLE,
        )
        offsets, samples, assignment = balanced.packs.offsets, balanced.packs.samples, balanced.assignment
    else:
        if method == "isf":
            packs = C.isf(
                vit, llm, items, vit_capacity, llm_capacity, vit_threshold, llm_threshold, iterations, plan_seed
            )
        else:
            packs = C.random_next_fit(vit, llm, items, vit_capacity, llm_capacity, plan_seed)
        offsets, samples = packs.offsets, packs.samples
        if singles.size:
            offsets = np.concatenate([offsets, offsets[-1] + np.arange(1, singles.size + 1, dtype=np.int64)])
            samples = np.concatenate([samples, singles])
        assignment = C.assign_random(len(offsets) - 1, world_size, drop_last, plan_seed)
    step_packs, duplicated, dropped_packs = assignment.step_packs, assignment.duplicated_slots, assignment.dropped_packs

    if step_packs.shape[0] == 0:
        raise TooFewPacksError(
            f"only {len(offsets) - 1} pack(s) for {world_size} ranks: with drop_last=True no step is left "
            "(use drop_last=False, fewer ranks or smaller capacities)"
        )
    return Plan(
        method=method,
        pack_offsets=offsets,
        pack_samples=samples,
        step_packs=step_packs,
        world_size=world_size,
        vit_capacity=vit_capacity,
        llm_capacity=llm_capacity,
        vit_threshold=vit_threshold,
        llm_threshold=llm_threshold,
        seed=options.seed,
        epoch=int(epoch),
        oversize_samples=oversize_ids,
        dropped_samples=_dropped_samples(oversize_ids if oversize == "drop" else None, offsets, samples, dropped_packs),
        duplicated_slots=int(duplicated),
        num_input_samples=len(lengths),
        seconds=time.perf_counter() - start,
    )


def _sample_costs(lengths: Lengths, cost_model: CostModel, objective: str) -> np.ndarray:
    """What the balanced method balances: ``(N,)`` float64 sample costs (``"time"``), or ``(N, 2)`` their ViT
    and LLM parts (``"stages"``; ``per_sample`` in the LLM part, ``per_pack`` added there by the engine)."""
    if objective == "time":
        return cost_model.sample_costs(lengths)
    vit = CostModel(vit_linear=cost_model.vit_linear, vit_quadratic=cost_model.vit_quadratic)
    llm = CostModel(
        llm_linear=cost_model.llm_linear, llm_quadratic=cost_model.llm_quadratic, per_sample=cost_model.per_sample
    )
    return np.stack([vit.sample_costs(lengths), llm.sample_costs(lengths)], axis=1)


def _split_oversize(
    lengths: Lengths, vit_capacity: int, llm_capacity: int, oversize: str
) -> tuple[Optional[np.ndarray], np.ndarray]:
    """``(items, oversize_ids)``: the ids of the samples within the capacities (``None``: every sample, which the
    engine enumerates without an index array) and of those that alone exceed one."""
    stats = lengths.stats()
    if stats.vit_max <= vit_capacity and stats.llm_max <= llm_capacity:
        return None, np.zeros(0, np.int64)
    over_mask = (lengths.vit > vit_capacity) | (lengths.llm > llm_capacity)
    oversize_ids = np.flatnonzero(over_mask).astype(np.int64)
    if oversize == "error":
        first = ", ".join(str(int(i)) for i in oversize_ids[:10])
        raise OversizeError(
            f"{oversize_ids.size} sample(s) alone exceed the capacities (vit {vit_capacity}, llm {llm_capacity}); "
            f"first: {first}. Raise the capacities, or set PlanOptions(oversize='single' or 'drop') "
            "(--oversize single|drop on the command line)."
        )
    items = np.flatnonzero(~over_mask).astype(np.int64)
    if items.size == 0 and oversize == "drop":
        raise ValueError(
            f"all {len(lengths)} samples alone exceed the capacities (vit {vit_capacity}, "
            f"llm {llm_capacity}) and oversize='drop' leaves nothing to plan"
        )
    return items, oversize_ids


def _dropped_samples(
    oversize_dropped: Optional[np.ndarray], offsets: np.ndarray, samples: np.ndarray, dropped_packs: np.ndarray
) -> np.ndarray:
    """Sorted ids of the samples in no slot: the oversize samples dropped and those of the dropped packs."""
    dropped = [] if oversize_dropped is None else [oversize_dropped]
    for p in np.asarray(dropped_packs, dtype=np.int64):
        dropped.append(samples[offsets[p] : offsets[p + 1]])
    return np.sort(np.concatenate(dropped)).astype(np.int64) if dropped else np.zeros(0, np.int64)
