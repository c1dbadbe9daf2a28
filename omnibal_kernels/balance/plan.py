"""Planning: samples -> packs under two capacities -> (step, rank) slots. The heavy lifting is in C++ (_C).

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

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence, Union

import numpy as np

from .. import _ext
from ..lengths import Lengths
from .cost import CostModel

__all__ = ["Plan", "OversizeError", "TooFewPacksError", "plan_packs", "METHODS", "OVERSIZE_POLICIES"]

Method = Literal["balanced", "isf", "random"]
OversizePolicy = Literal["error", "single", "drop"]
METHODS: tuple[str, ...] = ("balanced", "isf", "random")
OVERSIZE_POLICIES: tuple[str, ...] = ("error", "single", "drop")

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

_MASK64 = (1 << 64) - 1


class OversizeError(ValueError):
    """Some samples alone exceed a capacity (with ``oversize="error"``)."""


class TooFewPacksError(ValueError):
    """Fewer packs than ranks with ``drop_last=True``: not one whole step is left."""


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def _check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    value = _check_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_epoch(epoch: object) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
    return int(epoch)


def _hash_arrays(*arrays: np.ndarray) -> str:
    """A short sha256 of the arrays' values as int64 (the same on every platform)."""
    h = hashlib.sha256()
    for arr in arrays:
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def epoch_seed(seed: int, epoch: int) -> int:
    """The 64-bit seed of one epoch's plan: ``seed`` and ``epoch`` mixed by two SplitMix64 steps."""
    seed = _check_int("seed", seed)
    epoch = _check_epoch(epoch)

    def mix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    return mix(mix(seed & _MASK64) ^ epoch)


@dataclass(frozen=True)
class Plan:
    """Packs of samples and their (step, rank) schedule for one epoch.

    Attributes:
        method: how the packs were made (``"balanced"``, ``"isf"`` or ``"random"``).
        pack_offsets: (num_packs + 1,) int64; pack ``p`` holds ``pack_samples[pack_offsets[p]:pack_offsets[p+1]]``.
        pack_samples: int64 sample ids, pack after pack.
        step_packs: (num_steps, world_size) int64 pack id of every (step, rank) slot.
        world_size: number of data-parallel ranks.
        vit_capacity, llm_capacity: the capacities packs were made under.
        vit_threshold, llm_threshold: ISF's keep thresholds (``None`` for other methods).
        seed, epoch: what the plan was drawn from.
        oversize_samples: ids of samples that alone exceed a capacity (own packs with ``"single"``,
            dropped with ``"drop"``).
        dropped_samples: ids of samples in no slot (oversize ``"drop"`` and ``drop_last``).
        duplicated_slots: slots of the ragged last step filled by reusing packs.
        num_input_samples: samples in the input.
        seconds: planning time (capacity search included).
    """

    method: str
    pack_offsets: np.ndarray
    pack_samples: np.ndarray
    step_packs: np.ndarray
    world_size: int
    vit_capacity: int
    llm_capacity: int
    vit_threshold: Optional[int] = None
    llm_threshold: Optional[int] = None
    seed: int = 0
    epoch: int = 0
    oversize_samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped_samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    duplicated_slots: int = 0
    num_input_samples: int = 0
    seconds: float = 0.0

    @property
    def num_packs(self) -> int:
        return int(self.pack_offsets.shape[0] - 1)

    @property
    def num_steps(self) -> int:
        return int(self.step_packs.shape[0])

    def pack(self, p: int) -> np.ndarray:
        """Sample ids of pack ``p``."""
        return self.pack_samples[self.pack_offsets[p] : self.pack_offsets[p + 1]]

    def pack_sizes(self) -> np.ndarray:
        """(num_packs,) samples per pack."""
        return np.diff(self.pack_offsets)

    def scheduled_packs(self) -> np.ndarray:
        """Sorted ids of the packs that have at least one slot."""
        return np.unique(self.step_packs)

    def rank_batches(self, rank: int) -> list[np.ndarray]:
        """One array of sample ids per step, for ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return [self.pack(int(p)) for p in self.step_packs[:, rank]]

    def slot_samples(self) -> np.ndarray:
        """All sample ids in slot order (step-major, then rank); duplicated slots appear twice."""
        packs = self.step_packs.reshape(-1)
        sizes = self.pack_sizes()[packs]
        starts = self.pack_offsets[packs]
        # Gather each slot's range without a Python loop: positions = starts repeated + local offsets.
        local = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.pack_samples[np.repeat(starts, sizes) + local]

    def fingerprint(self) -> str:
        """A short hash of the schedule: equal on every rank that computed the same plan."""
        return _hash_arrays(self.pack_offsets, self.pack_samples, self.step_packs)

    def save(self, path: Union[str, Path]) -> None:
        """Writes the plan to an ``.npz`` file (``Plan.load`` reads it back)."""
        meta = {k: getattr(self, k) for k in ("method", "world_size", "vit_capacity", "llm_capacity", "seed",
                                              "epoch", "duplicated_slots", "num_input_samples", "seconds")}
        np.savez(
            path,
            pack_offsets=self.pack_offsets,
            pack_samples=self.pack_samples,
            step_packs=self.step_packs,
            oversize_samples=self.oversize_samples,
            dropped_samples=self.dropped_samples,
            thresholds=np.array([-1 if self.vit_threshold is None else self.vit_threshold,
                                 -1 if self.llm_threshold is None else self.llm_threshold], np.int64),
            **{f"meta_{k}": np.array(v) for k, v in meta.items()},
        )

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Plan":
        with np.load(path, allow_pickle=False) as z:
            meta = {k[5:]: z[k].item() for k in z.files if k.startswith("meta_")}
            vt, lt = (int(x) for x in z["thresholds"])
            return cls(
                pack_offsets=z["pack_offsets"],
                pack_samples=z["pack_samples"],
                step_packs=z["step_packs"],
                oversize_samples=z["oversize_samples"],
                dropped_samples=z["dropped_samples"],
                vit_threshold=None if vt < 0 else vt,
                llm_threshold=None if lt < 0 else lt,
                **meta,
            )


def _as_lengths(lengths: Union[Lengths, tuple, Sequence[int], np.ndarray]) -> Lengths:
    if isinstance(lengths, Lengths):
        return lengths
    if isinstance(lengths, tuple) and len(lengths) == 2:
        return Lengths(np.asarray(lengths[0]), np.asarray(lengths[1]))
    arr = np.asarray(lengths)
    if arr.ndim == 1:  # token counts only: text data
        return Lengths(np.zeros(arr.shape, np.int64), arr)
    raise TypeError("lengths must be a Lengths, a (vit, llm) tuple of arrays, or a 1-D array of token counts")


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
    lengths = _as_lengths(lengths)
    world_size = _check_positive_int("world_size", world_size)
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be at most {MAX_WORLD_SIZE:,}, got {world_size:,}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {oversize!r}")
    iterations = _check_positive_int("iterations", iterations)
    if iterations > MAX_ISF_ITERATIONS:
        raise ValueError(f"iterations must be at most {MAX_ISF_ITERATIONS:,}, got {iterations:,}")
    if len(lengths) == 0:
        raise ValueError("lengths is empty: nothing to plan")
    cost_model = cost_model or CostModel.internvl_7b()
    plan_seed = epoch_seed(seed, epoch)

    if (vit_capacity is None) != (llm_capacity is None):
        raise ValueError("give both vit_capacity and llm_capacity, or neither (then they are searched)")
    if vit_capacity is None:
        from .search import search_capacity

        caps = search_capacity(lengths, target_batch_size, method=method, world_size=world_size,
                               oversize=oversize, seed=seed, iterations=iterations)
        vit_capacity, llm_capacity = caps.vit_capacity, caps.llm_capacity
    vit_capacity = _check_positive_int("vit_capacity", vit_capacity, minimum=0)
    llm_capacity = _check_positive_int("llm_capacity", llm_capacity)
    if method == "isf":
        vit_threshold = vit_capacity if vit_threshold is None else vit_threshold
        llm_threshold = max(llm_capacity - ISF_LLM_MARGIN, 1) if llm_threshold is None else llm_threshold
        vit_threshold = _check_positive_int("vit_threshold", vit_threshold, minimum=0)
        llm_threshold = _check_positive_int("llm_threshold", llm_threshold, minimum=0)
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
        offsets, samples, step_packs, duplicated, dropped_packs = C.plan_balanced(
            vit, llm, items, singles if singles.size else None, vit_capacity, llm_capacity, cost_model.terms(),
            BEST_FIT_ROUNDS, world_size, drop_last, plan_seed)
    else:
        if method == "isf":
            offsets, samples = C.isf(vit, llm, items, vit_capacity, llm_capacity, vit_threshold, llm_threshold,
                                     iterations, plan_seed)
        else:
            offsets, samples = C.random_next_fit(vit, llm, items, vit_capacity, llm_capacity, plan_seed)
        if singles.size:
            offsets = np.concatenate([offsets, offsets[-1] + np.arange(1, singles.size + 1, dtype=np.int64)])
            samples = np.concatenate([samples, singles])
        step_packs, duplicated, dropped_packs = C.assign_random(len(offsets) - 1, world_size, drop_last, plan_seed)

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

