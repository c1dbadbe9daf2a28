"""The sampler's groups: which samples are planned together, and each group's options and capacities.

``options`` is one ``PlanOptions`` for every group or a sequence with one per group. Groups may differ only in
the fields of :data:`PER_GROUP_FIELDS` (``isf`` among them, since its thresholds follow the capacities); the
others (method, oversize, drop_last, seed, cost model, context parallelism) are the sampler's and must agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from ..balance.options import PlanOptions, check_options
from ..balance.packs import TooFewPacksError
from ..balance.search import Capacities, search_capacity
from ..balance.seeds import epoch_seed
from ..lengths import Lengths

__all__ = ["PER_GROUP_FIELDS", "SamplerGroups", "build_groups", "check_enough_packs", "group_options", "parse_groups"]

PER_GROUP_FIELDS = ("vit_capacity", "llm_capacity", "target_batch_size", "isf")


@dataclass(frozen=True)
class SamplerGroups:
    """The groups of a sampler: for each, its sorted global sample ids, its loads and its options (with
    capacities, given or searched), and the search result where capacities were searched (else None)."""

    ids: tuple[np.ndarray, ...]
    lengths: tuple[Lengths, ...]
    options: tuple[PlanOptions, ...]
    searched: tuple[Optional[Capacities], ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    def where(self, g: int) -> str:
        """The prefix of a message about group ``g`` (none with one group)."""
        return _where(g, len(self))

    def seed(self, g: int) -> int:
        """Group ``g``'s plan seed: one group plans exactly as ``plan_packs`` with the options' seed; several get
        independent seeds."""
        seed = self.options[0].seed
        return seed if len(self) == 1 else epoch_seed(seed, g)

    @property
    def capacities(self) -> list[tuple[int, int]]:
        """``(vit_capacity, llm_capacity)`` of every group."""
        return [opts.capacities() for opts in self.options]


def _where(g: int, num_groups: int) -> str:
    return f"group {g}: " if num_groups > 1 else ""


def parse_groups(groups: Any, n: int) -> list[np.ndarray]:
    """Groups as sorted arrays of sample ids that partition ``range(n)``: from ``None`` (one group), a per-sample
    array of integer group ids (groups in sorted id order), or a list of index arrays."""
    if groups is None:
        return [np.arange(n, dtype=np.int64)]
    if (isinstance(groups, np.ndarray) and groups.ndim == 1) or (
        isinstance(groups, Sequence) and len(groups) > 0 and all(np.ndim(g) == 0 for g in groups)
    ):
        ids = np.asarray(groups)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"per-sample group ids must be integers, got dtype {ids.dtype}")
        if ids.shape[0] != n:
            raise ValueError(f"groups has {ids.shape[0]} per-sample group ids for {n} samples")
        return [np.flatnonzero(ids == g).astype(np.int64) for g in np.unique(ids)]
    if not isinstance(groups, Sequence) or len(groups) == 0:
        raise TypeError("groups must be a per-sample array of group ids or a non-empty list of index arrays")
    parts = []
    for g, part in enumerate(groups):
        arr = np.asarray(part)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError(f"group {g} must be a 1-D array of sample ids, got shape {arr.shape} dtype {arr.dtype}")
        if arr.size == 0:
            raise ValueError(f"group {g} is empty")
        if arr.min() < 0 or arr.max() >= n:
            bad = int(arr[(arr < 0) | (arr >= n)][0])
            raise ValueError(f"group {g} holds sample id {bad}, outside [0, {n})")
        parts.append(np.sort(arr.astype(np.int64)))
    _check_partition(parts, n)
    return parts


def _check_partition(parts: list[np.ndarray], n: int) -> None:
    owner = np.full(n, -1, dtype=np.int64)
    for g, arr in enumerate(parts):
        twice = np.flatnonzero(np.diff(arr) == 0)  # arr is sorted
        if twice.size:
            raise ValueError(f"group {g} lists sample {int(arr[twice[0]])} more than once")
        seen = owner[arr]
        if (seen >= 0).any():
            first = int(np.flatnonzero(seen >= 0)[0])
            raise ValueError(
                f"sample {int(arr[first])} is in more than one group (group {int(seen[first])} and group {g})"
            )
        owner[arr] = g
    missing = np.flatnonzero(owner < 0)
    if missing.size:
        raise ValueError(f"{missing.size} sample(s) are in no group; first: sample {int(missing[0])}")


def group_options(options: Union[PlanOptions, Sequence[PlanOptions], None], num_groups: int) -> tuple[PlanOptions, ...]:
    """One ``PlanOptions`` per group from ``options`` (one for all, or a sequence with one per group). Raises
    ``ValueError`` where a sequence has another length than ``num_groups`` or groups differ in a shared field,
    and ``TypeError`` for what is not a ``PlanOptions`` (naming the group when there are several)."""
    if options is None or isinstance(options, PlanOptions):
        bases: list[Optional[PlanOptions]] = [options] * num_groups
    elif isinstance(options, Sequence) and not isinstance(options, str):
        bases = list(options)
        if len(bases) != num_groups:
            raise ValueError(f"options has {len(bases)} entries for {num_groups} groups")
    else:
        raise TypeError(
            f"options must be a PlanOptions or a sequence of them (one per group), got {type(options).__name__}"
        )
    out = []
    for g, base in enumerate(bases):
        try:
            out.append(check_options(base))
        except TypeError as err:
            if num_groups == 1:
                raise
            raise TypeError(f"{_where(g, num_groups)}{err}") from err
    shared = [f.name for f in dataclasses.fields(PlanOptions) if f.name not in PER_GROUP_FIELDS]
    for g, opts in enumerate(out[1:], 1):
        for name in shared:
            if getattr(opts, name) != getattr(out[0], name):
                raise ValueError(
                    f"the options of group {g} differ from group 0's in {name} "
                    f"({getattr(opts, name)!r} != {getattr(out[0], name)!r}); only "
                    f"{', '.join(PER_GROUP_FIELDS)} may differ between groups"
                )
    return tuple(out)


def build_groups(
    lengths: Lengths,
    groups: Any,
    options: Union[PlanOptions, Sequence[PlanOptions], None],
    *,
    world_size: int,
    micro_steps: int,
) -> SamplerGroups:
    """The sampler's groups with their options; capacities not given are searched once, on the group's whole
    data, for ``world_size * micro_steps`` virtual ranks. Raises as :func:`parse_groups`, :func:`group_options`
    and :func:`check_enough_packs`."""
    ids = parse_groups(groups, len(lengths))
    per_group = group_options(options, len(ids))
    group_lengths = tuple(lengths[g] for g in ids)
    slots = world_size * micro_steps
    planned, searched = [], []
    for g, (part, opts) in enumerate(zip(group_lengths, per_group)):
        caps = None
        if not opts.has_capacities:
            caps = search_capacity(part, opts, world_size=slots)
            opts = opts.replace(vit_capacity=caps.vit_capacity, llm_capacity=caps.llm_capacity)
        check_enough_packs(part, opts, world_size=world_size, micro_steps=micro_steps, where=_where(g, len(ids)))
        planned.append(opts)
        searched.append(caps)
    return SamplerGroups(tuple(ids), group_lengths, tuple(planned), tuple(searched))


def check_enough_packs(
    lengths: Lengths, options: PlanOptions, *, world_size: int, micro_steps: int, where: str = ""
) -> None:
    """Raise TooFewPacksError unless every epoch's plan fills ``world_size * micro_steps`` slots with distinct packs.

    Packs are drawn anew each epoch, so their count varies; but no packing needs fewer packs than its
    loads over the capacities, ``max(sum(vit) / Qv, sum(llm) / Qt)`` (plus one per oversize sample kept
    alone). Checking that bound decides once, at construction, instead of failing in a later epoch.
    """
    (qv, qt), oversize, slots = options.capacities(), options.oversize, world_size * micro_steps
    fits = (lengths.vit <= qv) & (lengths.llm <= qt)
    if (oversize == "error" and not fits.all()) or (oversize == "drop" and not fits.any()):
        return  # planning raises the clearer error (oversize samples, or nothing left to plan)
    loaded = (lengths.vit > 0) | (lengths.llm > 0)
    if not loaded.any() and slots > 1:
        raise TooFewPacksError(
            f"{where}all {len(lengths)} samples have ViT load 0 and LLM load 0, so any capacities hold them all "
            f"in one pack and {slots} packs per optimizer step (world_size {world_size} x "
            f"micro_steps_per_step {micro_steps}) cannot be filled; zero loads usually mean "
            "the lengths were read wrong (check the length file's token counts)"
        )
    bound = int(fits.any())  # samples that fit fill at least one pack, whatever their loads
    if qv > 0:
        bound = max(bound, -(-int(lengths.vit[fits].sum()) // qv))
    bound = max(bound, -(-int(lengths.llm[fits].sum()) // qt))
    if oversize == "single":
        bound += int((~fits).sum())
    if bound < slots:
        raise TooFewPacksError(
            f"{where}the samples fill at least {bound} pack(s), fewer than world_size {world_size} x "
            f"micro_steps_per_step {micro_steps} = {slots} packs per optimizer step; use fewer "
            "ranks, fewer micro-steps or smaller capacities"
        )
