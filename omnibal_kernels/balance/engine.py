"""The C++ engine for given capacities: samples -> packs under two capacities -> (step, rank) slots.

Methods:

* ``"balanced"`` (default): randomized two-dimensional best fit in rounds (packs at the physical limit of
  the binding capacity), then packs sorted by the load that varies more across them, blocks re-sorted by
  the other load and smaller blocks by cost, and cut into steps, so the ranks of a step get near-equal ViT
  load, LLM load and cost; steps are laid out in a stratified random order (no load trend over the epoch)
  and ranks are shuffled within a step.
* ``"isf"``: the OmniBal paper's Iterative Sampling and Filtering, packs to ranks in random order.
* ``"random"``: random next-fit packs, in random order (the baseline).

Every plan is a pure function of ``(lengths, options, seed, epoch)``: every rank computes the same plan
without communication, on every platform.
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from .. import _ext
from .._checks import check_positive_int
from ..lengths import Lengths
from .cost import CostModel
from .packs import METHODS, OVERSIZE_POLICIES, OversizeError, Plan, TooFewPacksError, epoch_seed

__all__ = ["BEST_FIT_ROUNDS", "ISF_ITERATIONS", "ISF_LLM_MARGIN", "MAX_CAPACITY", "build_plan", "check_plan_options"]

# Best-fit rounds of the balanced method. On the InternVL-Chat SFT loads (18 tiles, 6016 tokens) the ViT
# fill is 0.9911 after 1 round, 0.9983 after 4, 0.9993 after 8 and 0.9997 after 16; later rounds only
# re-pack the few packs that are not yet full, so they cost little.
BEST_FIT_ROUNDS = 16
# The ISF thresholds of the authors' scripts: ViT threshold = ViT capacity, LLM threshold = capacity - 128.
ISF_LLM_MARGIN = 128
ISF_ITERATIONS = 50
# Far above any data-parallel world; bounds the slots a schedule allocates (world_size per step).
MAX_WORLD_SIZE = 1 << 24
# ISF rounds re-pack the pool each time; the authors use 50. Bounds a mistyped value's running time.
MAX_ISF_ITERATIONS = 100_000
# Far above any real pack (2**48 tokens), and the largest capacity the engine handles exactly: it places open
# packs in buckets by room * buckets / (capacity + 1) in float64, which must stay below the bucket count; up
# to 2**48 every term is exact and the quotient stays 2**-32 below it (at 2**62 a room rounded up to the
# capacity and indexed past the last bucket). Its int64 sums of a pack plus one sample are far from overflow.
MAX_CAPACITY = 1 << 48


def check_plan_options(lengths: Lengths, world_size: object, method: object, oversize: object,
                       iterations: object) -> tuple[int, int]:
    """Checks the options every plan needs; returns ``(world_size, iterations)`` as ints."""
    world_size = check_positive_int("world_size", world_size)
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be at most {MAX_WORLD_SIZE:,}, got {world_size:,}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {oversize!r}")
    iterations = check_positive_int("iterations", iterations)
    if iterations > MAX_ISF_ITERATIONS:
        raise ValueError(f"iterations must be at most {MAX_ISF_ITERATIONS:,}, got {iterations:,}")
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    return world_size, iterations


def build_plan(
    lengths: Lengths,
    *,
    world_size: int,
    method: str,
    vit_capacity: int,
    llm_capacity: int,
    vit_threshold: Optional[int],
    llm_threshold: Optional[int],
    iterations: int,
    oversize: str,
    drop_last: bool,
    seed: int,
    epoch: int,
    cost_model: CostModel,
    start: Optional[float] = None,
) -> Plan:
    """The plan for fixed capacities (options already checked by :func:`check_plan_options`).

    ``start``: the ``time.perf_counter()`` the planning began at (a capacity search included), for
    ``Plan.seconds``. Raises ``OversizeError`` and ``TooFewPacksError`` as :func:`plan_packs` documents.
    """
    start = time.perf_counter() if start is None else start
    plan_seed = epoch_seed(seed, epoch)
    vit_capacity = check_positive_int("vit_capacity", vit_capacity, minimum=0)
    llm_capacity = check_positive_int("llm_capacity", llm_capacity)
    for name, cap in (("vit_capacity", vit_capacity), ("llm_capacity", llm_capacity)):
        if cap > MAX_CAPACITY:
            raise ValueError(f"{name} must be at most 2**48 (far above any pack), got {cap}")
    if method == "isf":
        vit_threshold = vit_capacity if vit_threshold is None else vit_threshold
        llm_threshold = max(llm_capacity - ISF_LLM_MARGIN, 1) if llm_threshold is None else llm_threshold
        vit_threshold = check_positive_int("vit_threshold", vit_threshold, minimum=0)
        llm_threshold = check_positive_int("llm_threshold", llm_threshold, minimum=0)
        if vit_threshold > vit_capacity or llm_threshold > llm_capacity:
            raise ValueError(
                f"ISF thresholds (vit {vit_threshold}, llm {llm_threshold}) must not exceed the capacities "
                f"(vit {vit_capacity}, llm {llm_capacity}): a pack could never reach them"
            )
    elif vit_threshold is not None or llm_threshold is not None:
        raise ValueError("vit_threshold/llm_threshold apply to method='isf' only")

    vit, llm = lengths.vit, lengths.llm
    stats = lengths.stats()
    if stats.vit_max > vit_capacity or stats.llm_max > llm_capacity:
        over_mask = (vit > vit_capacity) | (llm > llm_capacity)
        oversize_ids = np.flatnonzero(over_mask).astype(np.int64)
    else:
        over_mask, oversize_ids = None, np.zeros(0, np.int64)
    if oversize_ids.size and oversize == "error":
        first = ", ".join(str(int(i)) for i in oversize_ids[:10])
        raise OversizeError(
            f"{oversize_ids.size} sample(s) alone exceed the capacities (vit {vit_capacity}, llm {llm_capacity}); "
            f"first: {first}. Raise the capacities, or pass oversize='single' or 'drop'."
        )
    # None: every sample (the extension enumerates them without an index array)
    items = np.flatnonzero(~over_mask).astype(np.int64) if oversize_ids.size else None

    if items is not None and items.size == 0 and oversize == "drop":
        raise ValueError(f"all {len(lengths)} samples alone exceed the capacities (vit {vit_capacity}, "
                         f"llm {llm_capacity}) and oversize='drop' leaves nothing to plan")
    C = _ext.load()
    singles = oversize_ids if oversize == "single" else np.zeros(0, np.int64)
    if method == "balanced":
        balanced = C.plan_balanced(
            vit, llm, items, singles if singles.size else None, vit_capacity, llm_capacity, cost_model.terms(),
            BEST_FIT_ROUNDS, world_size, drop_last, plan_seed)
        offsets, samples, assignment = balanced.packs.offsets, balanced.packs.samples, balanced.assignment
    else:
        if method == "isf":
            packs = C.isf(vit, llm, items, vit_capacity, llm_capacity, vit_threshold, llm_threshold, iterations,
                          plan_seed)
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
    dropped = [oversize_ids] if oversize == "drop" else []
    for p in np.asarray(dropped_packs, dtype=np.int64):
        dropped.append(samples[offsets[p] : offsets[p + 1]])
    dropped_ids = np.sort(np.concatenate(dropped)) if dropped else np.zeros(0, np.int64)

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
        seed=int(seed),
        epoch=int(epoch),
        oversize_samples=oversize_ids,
        dropped_samples=dropped_ids.astype(np.int64),
        duplicated_slots=int(duplicated),
        num_input_samples=len(lengths),
        seconds=time.perf_counter() - start,
    )

