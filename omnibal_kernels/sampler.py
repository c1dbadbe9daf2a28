"""Samplers over a plan: every data-parallel rank gets its balanced packs, one list of sample ids per micro-step.

``BalancedBatchSampler`` is a ``torch.utils.data.Sampler[list[int]]`` for ``DataLoader(batch_sampler=...)``.
Each epoch it plans packs with :func:`omnibal_kernels.balance.plan_packs` (a pure function of the lengths,
the options, ``seed`` and the epoch), so every rank computes the same schedule without communication and
keeps its own column of it.

Gradient accumulation: with ``micro_steps_per_step = m`` the plan is made for ``world_size * m`` virtual
ranks. Rank ``r`` takes the packs of virtual ranks ``r*m .. r*m + m - 1`` of every planned step, one per
micro-step. The balanced method gives all packs of a planned step near-equal loads, so both the per-micro-step
loads of the ranks and their per-optimizer-step sums are balanced; every planned step is one optimizer step,
so the epoch always holds a whole number of optimizer steps.

Groups (the OmniBal multi-group mode): samples may be split into groups (e.g. text-only and image-text data)
that are packed separately, each under its own capacities; every optimizer step holds packs of one group,
and the groups' steps are interleaved in a seeded random order that keeps each group's own step order.

Resuming: ``state_dict()`` records the epoch, the micro-steps already handed out and fingerprints of the
options and of the epoch's plan; ``load_state_dict`` continues with exactly the remaining batches and
raises when the lengths or options differ.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import torch.utils.data

from ._checks import check_epoch, check_int, check_positive_int, default_world
from .balance.cost import CostModel
from .balance.packs import METHODS, OVERSIZE_POLICIES, Plan, TooFewPacksError, as_lengths, epoch_seed, hash_arrays
from .balance.plan import plan_packs
from .balance.report import BalanceReport, balance_report, dist_ratio, mean_over_max, pack_sums
from .balance.schedule import concat_plans, interleave_steps, micro_step_packs
from .balance.search import search_capacity
from .lengths import Lengths

__all__ = ["BalancedBatchSampler", "SamplerReport"]

_STATE_VERSION = 1


@dataclass(frozen=True)
class SamplerReport:
    """What one epoch of a :class:`BalancedBatchSampler` gives the ranks.

    Attributes:
        epoch: the epoch.
        world_size, micro_steps_per_step: ranks and micro-steps per optimizer step.
        num_micro_steps: batches each rank gets (``len(sampler)`` from the epoch start).
        num_steps: optimizer steps (``num_micro_steps / micro_steps_per_step``).
        num_samples: distinct samples scheduled over all ranks.
        micro_vit_dist, micro_llm_dist: the paper's Dist Ratio over the ranks' loads of every micro-step.
        step_vit_dist, step_llm_dist: the same over the ranks' loads summed over each optimizer step.
        micro_step_efficiency, step_efficiency: mean over (micro-)steps of ``mean(cost) / max(cost)`` over ranks.
        groups: the :class:`BalanceReport` of every group's plan (over ``world_size * micro_steps_per_step``
            virtual ranks).
        dropped_samples: sorted ids of samples in no batch (oversize ``"drop"``, ``drop_last``).
        duplicated_samples: sorted ids of the extra occurrences of samples in reused packs (a sample that
            appears three times is listed twice).
    """

    epoch: int
    world_size: int
    micro_steps_per_step: int
    num_micro_steps: int
    num_steps: int
    num_samples: int
    micro_vit_dist: float
    micro_llm_dist: float
    step_vit_dist: float
    step_llm_dist: float
    micro_step_efficiency: float
    step_efficiency: float
    groups: tuple[BalanceReport, ...]
    dropped_samples: np.ndarray
    duplicated_samples: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """Numbers only (group reports as dicts, sample id lists as counts)."""
        out = {k: getattr(self, k) for k in (
            "epoch", "world_size", "micro_steps_per_step", "num_micro_steps", "num_steps", "num_samples",
            "micro_vit_dist", "micro_llm_dist", "step_vit_dist", "step_llm_dist", "micro_step_efficiency",
            "step_efficiency")}
        out["dropped"] = int(self.dropped_samples.size)
        out["duplicated"] = int(self.duplicated_samples.size)
        out["groups"] = [g.to_dict() for g in self.groups]
        return out


@dataclass
class _Schedule:
    """One epoch in global sample ids: packs of all groups and the (micro_step, rank) table of pack ids."""

    epoch: int
    plans: tuple[Plan, ...]
    pack_offsets: np.ndarray  # (num_packs + 1,) int64
    pack_samples: np.ndarray  # global sample ids, pack after pack
    micro_packs: np.ndarray  # (num_micro_steps, world_size) int64
    fingerprint: str
    report: Optional["SamplerReport"] = None  # made on the first balance_report() of the epoch

    def batch(self, micro_step: int, rank: int) -> list[int]:
        p = int(self.micro_packs[micro_step, rank])
        return self.pack_samples[self.pack_offsets[p] : self.pack_offsets[p + 1]].tolist()


def _per_group(name: str, value: Any, num_groups: int) -> list[Any]:
    """A scalar option for every group, or a sequence with one value per group."""
    if isinstance(value, (list, tuple, np.ndarray)):
        values = list(value)
        if len(values) != num_groups:
            raise ValueError(f"{name} has {len(values)} entries for {num_groups} groups")
        return values
    return [value] * num_groups


def _parse_groups(groups: Any, n: int) -> list[np.ndarray]:
    """Groups as sorted arrays of sample ids that partition ``range(n)``."""
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
    owner = np.full(n, -1, dtype=np.int64)
    for g, arr in enumerate(parts):
        twice = np.flatnonzero(np.diff(arr) == 0)  # arr is sorted
        if twice.size:
            raise ValueError(f"group {g} lists sample {int(arr[twice[0]])} more than once")
        seen = owner[arr]
        if (seen >= 0).any():
            first = int(np.flatnonzero(seen >= 0)[0])
            raise ValueError(f"sample {int(arr[first])} is in more than one group (group {int(seen[first])} "
                             f"and group {g})")
        owner[arr] = g
    missing = np.flatnonzero(owner < 0)
    if missing.size:
        raise ValueError(f"{missing.size} sample(s) are in no group; first: sample {int(missing[0])}")
    return parts


class BalancedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields, for this rank, one list of sample ids per micro-step: ``DataLoader(ds, batch_sampler=...)``.

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts);
            sample ``i`` is ``dataset[i]``.
        world_size, rank: data-parallel ranks and this one; default torch.distributed's when initialized,
            else 1 and 0.
        method: ``"balanced"`` (default), ``"isf"`` or ``"random"`` (see :func:`plan_packs`).
        target_batch_size: mean samples per pack wanted when capacities are searched (per group: a sequence).
        vit_capacity, llm_capacity: capacities of a pack (both or neither; per group: sequences). Searched
            once, on the whole data (each group's), when not given; fixed for all epochs.
        seed: the plan of epoch ``e`` depends only on the lengths, the options, ``seed`` and ``e``.
        drop_last: drop the packs of a ragged last step (reported) instead of reusing packs to fill it.
        micro_steps_per_step: micro-steps (gradient accumulation steps) per optimizer step.
        oversize: ``"error"``, ``"single"`` or ``"drop"`` (see :func:`plan_packs`).
        cost_model: the cost the balanced method equalizes (default ``CostModel.internvl_7b()``).
        groups: ``None`` (one group), a per-sample array of integer group ids (groups in sorted id order), or
            a list of index arrays partitioning the samples. Each group is packed under its own capacities;
            each optimizer step holds packs of one group.
        dataset, num_samples: when given, the number of samples must equal ``len(lengths)``.

    Raises:
        ValueError/TypeError: rank not in ``[0, world_size)``, too few packs for the ranks with ``drop_last``,
            lengths not matching the dataset, bad groups or options (naming the argument, group or sample).
    """

    def __init__(
        self,
        lengths: Union[Lengths, tuple, np.ndarray],
        *,
        world_size: Optional[int] = None,
        rank: Optional[int] = None,
        method: str = "balanced",
        target_batch_size: Union[float, Sequence[float]] = 4.0,
        vit_capacity: Union[int, Sequence[int], None] = None,
        llm_capacity: Union[int, Sequence[int], None] = None,
        seed: int = 0,
        drop_last: bool = False,
        micro_steps_per_step: int = 1,
        oversize: str = "error",
        cost_model: Optional[CostModel] = None,
        groups: Any = None,
        dataset: Any = None,
        num_samples: Optional[int] = None,
    ) -> None:
        self.lengths = as_lengths(lengths)
        n = len(self.lengths)
        if n == 0:
            raise ValueError("lengths is empty: nothing to sample")
        if dataset is not None:
            if not hasattr(dataset, "__len__"):
                raise TypeError("dataset must have a length (a map-style dataset) to check it against lengths")
            if len(dataset) != n:
                raise ValueError(f"lengths has {n} samples but the dataset has {len(dataset)}")
        if num_samples is not None and num_samples != n:
            raise ValueError(f"lengths has {n} samples but num_samples is {num_samples}")
        self.world_size, self.rank = default_world(world_size, rank)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if oversize not in OVERSIZE_POLICIES:
            raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {oversize!r}")
        self.method = method
        self.seed = check_int("seed", seed)
        self.drop_last = bool(drop_last)
        self.micro_steps_per_step = check_positive_int("micro_steps_per_step", micro_steps_per_step)
        self.oversize = oversize
        self.cost_model = cost_model or CostModel.internvl_7b()
        self.groups = _parse_groups(groups, n)
        self._group_lengths = [self.lengths[g] for g in self.groups]
        num_groups = len(self.groups)
        virtual = self.world_size * self.micro_steps_per_step

        vit_caps = _per_group("vit_capacity", vit_capacity, num_groups)
        llm_caps = _per_group("llm_capacity", llm_capacity, num_groups)
        targets = _per_group("target_batch_size", target_batch_size, num_groups)
        self.capacities: list[tuple[int, int]] = []
        for g, (qv, qt, target) in enumerate(zip(vit_caps, llm_caps, targets)):
            if (qv is None) != (qt is None):
                raise ValueError(f"group {g}: give both vit_capacity and llm_capacity, or neither")
            if qv is None:
                caps = search_capacity(self._group_lengths[g], target, method=method, world_size=virtual,
                                       oversize=oversize, seed=self.seed)
                qv, qt = caps.vit_capacity, caps.llm_capacity
            self.capacities.append((check_positive_int("vit_capacity", qv, minimum=0),
                                    check_positive_int("llm_capacity", qt)))
            self._check_enough_packs(g, virtual)
        self._config_fingerprint = self._make_config_fingerprint()
        self._epoch = 0
        self._start = 0  # micro-step the next pass starts at (a resumed position)
        self._pass_start = 0  # micro-step the current (or last) pass started at: what `consumed` counts from
        self._position = 0  # micro-steps of the epoch handed out so far
        self._schedules: dict[int, _Schedule] = {}  # the current epoch's and the last other one asked for
        self._sample_costs: Optional[np.ndarray] = None
        self._schedule_for(0)  # plan now: bad options fail at construction, not in the first DataLoader pass

    # ------------------------------------------------------------------------------------------ planning

    def _make_config_fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(self.lengths.vit.tobytes())
        h.update(self.lengths.llm.tobytes())
        for g in self.groups:
            h.update(np.int64(g.size).tobytes())
            h.update(g.tobytes())
        options = (self.world_size, self.method, self.capacities, self.seed, self.drop_last,
                   self.micro_steps_per_step, self.oversize, self.cost_model.terms())
        h.update(repr(options).encode())
        return h.hexdigest()[:16]

    def _check_enough_packs(self, g: int, slots: int) -> None:
        """Raise TooFewPacksError unless every epoch's plan of group ``g`` fills ``slots`` with distinct packs.

        Packs are drawn anew each epoch, so their count varies; but no packing needs fewer packs than its
        loads over the capacities, ``max(sum(vit) / Qv, sum(llm) / Qt)`` (plus one per oversize sample kept
        alone). Checking that bound decides once, at construction, instead of failing in a later epoch.
        """
        lengths, (qv, qt) = self._group_lengths[g], self.capacities[g]
        fits = (lengths.vit <= qv) & (lengths.llm <= qt)
        if (self.oversize == "error" and not fits.all()) or (self.oversize == "drop" and not fits.any()):
            return  # planning raises the clearer error (oversize samples, or nothing left to plan)
        where = f"group {g}: " if len(self.groups) > 1 else ""
        loaded = (lengths.vit > 0) | (lengths.llm > 0)
        if not loaded.any() and slots > 1:
            raise TooFewPacksError(
                f"{where}all {len(lengths)} samples have ViT load 0 and LLM load 0, so any capacities hold them all "
                f"in one pack and {slots} packs per optimizer step (world_size {self.world_size} x "
                f"micro_steps_per_step {self.micro_steps_per_step}) cannot be filled; zero loads usually mean "
                "the lengths were read wrong (check the length file's token counts)"
            )
        bound = int(fits.any())  # samples that fit fill at least one pack, whatever their loads
        if qv > 0:
            bound = max(bound, -(-int(lengths.vit[fits].sum()) // qv))
        bound = max(bound, -(-int(lengths.llm[fits].sum()) // qt))
        if self.oversize == "single":
            bound += int((~fits).sum())
        if bound < slots:
            raise TooFewPacksError(
                f"{where}the samples fill at least {bound} pack(s), fewer than world_size {self.world_size} x "
                f"micro_steps_per_step {self.micro_steps_per_step} = {slots} packs per optimizer step; use fewer "
                "ranks, fewer micro-steps or smaller capacities"
            )

    def _group_seed(self, g: int) -> int:
        # one group: exactly plan_packs(..., seed=seed); several: an independent seed per group
        return self.seed if len(self.groups) == 1 else epoch_seed(self.seed, g)

    def _schedule_for(self, epoch: int) -> _Schedule:
        schedule = self._schedules.get(epoch)
        if schedule is None:
            schedule = self._plan_epoch(epoch)
            # inspecting another epoch (a report, a fingerprint, a state to load) must not evict the current one
            self._schedules = {e: s for e, s in self._schedules.items() if e == self._epoch}
            self._schedules[epoch] = schedule
        return schedule

    def _plan_epoch(self, epoch: int) -> _Schedule:
        m, world = self.micro_steps_per_step, self.world_size
        plans = []
        for g, (group_lengths, (qv, qt)) in enumerate(zip(self._group_lengths, self.capacities)):
            try:
                plan = plan_packs(group_lengths, world_size=world * m, method=self.method, vit_capacity=qv,
                                  llm_capacity=qt, oversize=self.oversize, drop_last=self.drop_last,
                                  seed=self._group_seed(g), epoch=epoch, cost_model=self.cost_model)
            except ValueError as err:  # the same error type (OversizeError, TooFewPacksError), with context
                where = f"group {g}: " if len(self.groups) > 1 else ""
                raise type(err)(f"{where}{err} [world_size {world} x micro_steps_per_step {m} = {world * m} "
                                "packs per optimizer step]") from err
            plans.append(plan)

        stacked = concat_plans(plans, self.groups)
        steps = np.concatenate([micro_step_packs(s, world, m) for s in stacked.step_packs])  # (steps, m, world)
        if len(plans) > 1:
            steps = steps[interleave_steps([p.num_steps for p in plans], self.seed, epoch)]
        micro_packs = np.ascontiguousarray(steps.reshape(-1, world))
        pack_offsets, pack_samples = stacked.pack_offsets, stacked.pack_samples
        return _Schedule(epoch, tuple(plans), pack_offsets, pack_samples, micro_packs,
                         hash_arrays(pack_offsets, pack_samples, micro_packs))

    # ------------------------------------------------------------------------------------------ sampling

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch to sample (a new plan per epoch). Setting the current epoch again keeps a
        resumed position, so ``load_state_dict`` followed by the usual ``set_epoch(e)`` continues mid-epoch."""
        epoch = check_epoch(epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._start = self._pass_start = self._position = 0

    def _epoch_or_current(self, epoch: Optional[int]) -> int:
        return self._epoch if epoch is None else check_epoch(epoch)

    def _num_micro_steps(self) -> int:
        return int(self._schedule_for(self._epoch).micro_packs.shape[0])

    def __len__(self) -> int:
        """Batches the next pass yields: the epoch's micro-steps, less those already done before a resume."""
        return self._num_micro_steps() - self._start

    def __iter__(self) -> Iterator[list[int]]:
        schedule = self._schedule_for(self._epoch)
        total = schedule.micro_packs.shape[0]
        start = self._start
        self._pass_start = self._position = start
        for i in range(start, total):
            self._position = i + 1
            yield schedule.batch(i, self.rank)
        # a finished pass: the next pass (without set_epoch) replays the epoch from its start
        self._start = 0

    # ------------------------------------------------------------------------------------------ state

    def fingerprint(self, epoch: Optional[int] = None) -> str:
        """Hash of the epoch's schedule over all ranks (equal on every rank; default: the current epoch)."""
        return self._schedule_for(self._epoch_or_current(epoch)).fingerprint

    def state_dict(self, consumed: Optional[int] = None) -> dict[str, Any]:
        """The position in the epoch, to resume from (the same on every rank).

        Args:
            consumed: micro-steps the training loop consumed in the current (or just finished) pass, counted
                from where that pass started (a resumed position included). Default: all batches this
                sampler handed out, which is exact when batches are fetched on demand (``num_workers=0``); a
                DataLoader with workers prefetches, so pass the loop's count then.
        """
        if consumed is None:
            position = self._position
        else:
            consumed = check_positive_int("consumed", consumed, minimum=0)
            position = self._pass_start + consumed
            if position > self._num_micro_steps():
                raise ValueError(f"consumed={consumed} runs past the epoch's {self._num_micro_steps()} micro-steps "
                                 f"(pass started at {self._pass_start})")
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "micro_steps": int(position),
            "num_micro_steps": self._num_micro_steps(),
            "world_size": self.world_size,
            "config_fingerprint": self._config_fingerprint,
            "plan_fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues where ``state`` was saved: the next pass yields exactly the remaining batches.

        Raises ValueError when the state was saved with other lengths, options or world size.
        """
        missing = {"epoch", "micro_steps", "config_fingerprint", "plan_fingerprint"} - set(state)
        if missing:
            raise ValueError(f"state_dict lacks {sorted(missing)}")
        if state.get("version", _STATE_VERSION) > _STATE_VERSION:
            raise ValueError(f"state_dict version {state['version']} is newer than this sampler's ({_STATE_VERSION})")
        if state.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"state was saved with world_size {state['world_size']}, this sampler has "
                             f"{self.world_size}")
        if state["config_fingerprint"] != self._config_fingerprint:
            raise ValueError("state was saved by a sampler with other lengths or options (config fingerprint "
                             f"{state['config_fingerprint']} != {self._config_fingerprint})")
        epoch = check_epoch(state["epoch"])
        schedule = self._schedule_for(epoch)
        if state["plan_fingerprint"] != schedule.fingerprint:
            raise ValueError(f"epoch {epoch} plans differently now (plan fingerprint {state['plan_fingerprint']} "
                             f"!= {schedule.fingerprint}); the planning engine or its inputs changed")
        position = check_int("micro_steps", state["micro_steps"])
        total = schedule.micro_packs.shape[0]
        if not 0 <= position <= total:
            raise ValueError(f"micro_steps {position} is outside [0, {total}]")
        self._epoch = epoch
        self._start = self._pass_start = self._position = position

    # ------------------------------------------------------------------------------------------ inspection

    def plans(self, epoch: Optional[int] = None) -> tuple[Plan, ...]:
        """Every group's :class:`Plan` of the epoch (over ``world_size * micro_steps_per_step`` virtual ranks);
        sample ids inside are group-local (``sampler.groups[g][id]`` is the dataset index)."""
        return self._schedule_for(self._epoch_or_current(epoch)).plans

    def rank_batches(self, rank: Optional[int] = None, epoch: Optional[int] = None) -> list[list[int]]:
        """All batches of ``rank`` (default this one) for the epoch, from its start."""
        rank = self.rank if rank is None else check_int("rank", rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        schedule = self._schedule_for(self._epoch_or_current(epoch))
        return [schedule.batch(i, rank) for i in range(schedule.micro_packs.shape[0])]

    def micro_step_loads(self, epoch: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vit, llm, cost)``, each ``(num_micro_steps, world_size)``: every rank's load of every micro-step."""
        schedule = self._schedule_for(self._epoch_or_current(epoch))
        if self._sample_costs is None:
            self._sample_costs = self.cost_model.sample_costs(self.lengths.vit, self.lengths.llm)
        vit, llm, cost = (pack_sums(schedule.pack_offsets, schedule.pack_samples, values)[schedule.micro_packs]
                          for values in (self.lengths.vit, self.lengths.llm, self._sample_costs))
        return vit, llm, cost

    def balance_report(self, epoch: Optional[int] = None) -> SamplerReport:
        """The :class:`SamplerReport` of the epoch (default: the current one; made once per planned epoch)."""
        epoch = self._epoch_or_current(epoch)
        schedule = self._schedule_for(epoch)
        if schedule.report is None:
            schedule.report = self._make_report(schedule)
        return schedule.report

    def _make_report(self, schedule: _Schedule) -> SamplerReport:
        epoch = schedule.epoch
        m, world = self.micro_steps_per_step, self.world_size
        vit, llm, cost = self.micro_step_loads(epoch)
        steps = vit.shape[0] // m
        step_vit = vit.reshape(steps, m, world).sum(axis=1)
        step_llm = llm.reshape(steps, m, world).sum(axis=1)
        step_cost = cost.reshape(steps, m, world).sum(axis=1)

        dropped, duplicated = [], []
        for g, plan in enumerate(schedule.plans):
            dropped.append(self.groups[g][plan.dropped_samples])
            counts = np.bincount(plan.step_packs.reshape(-1), minlength=plan.num_packs)
            for p in np.flatnonzero(counts > 1):
                duplicated.append(np.repeat(self.groups[g][plan.pack(int(p))], counts[p] - 1))
        group_reports = tuple(balance_report(plan, gl, self.cost_model)
                              for plan, gl in zip(schedule.plans, self._group_lengths))
        return SamplerReport(
            epoch=epoch,
            world_size=world,
            micro_steps_per_step=m,
            num_micro_steps=int(vit.shape[0]),
            num_steps=int(steps),
            num_samples=int(sum(r.num_samples for r in group_reports)),
            micro_vit_dist=dist_ratio(vit, min_denominator=1.0),
            micro_llm_dist=dist_ratio(llm),
            step_vit_dist=dist_ratio(step_vit, min_denominator=1.0),
            step_llm_dist=dist_ratio(step_llm),
            micro_step_efficiency=mean_over_max(cost),
            step_efficiency=mean_over_max(step_cost),
            groups=group_reports,
            dropped_samples=np.sort(np.concatenate(dropped)) if dropped else np.zeros(0, np.int64),
            duplicated_samples=np.sort(np.concatenate(duplicated)) if duplicated else np.zeros(0, np.int64),
        )

    def __repr__(self) -> str:
        return (f"BalancedBatchSampler(samples={len(self.lengths)}, world_size={self.world_size}, rank={self.rank}, "
                f"method={self.method!r}, capacities={self.capacities}, micro_steps_per_step="
                f"{self.micro_steps_per_step}, groups={len(self.groups)}, epoch={self._epoch})")
