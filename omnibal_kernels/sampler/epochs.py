"""One epoch of the sampler over all ranks, and the planned epochs a sampler keeps.

An epoch's schedule holds every group's plan, their packs stacked in global sample ids, and the
``(micro_step, rank)`` table of pack ids: each planned step (of ``world_size * micro_steps`` virtual ranks) is
one optimizer step, virtual rank ``r * m + j`` giving micro-step ``j`` of rank ``r``, and with several groups
the groups' steps are interleaved in a seeded order that keeps each group's own step order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..balance.packs import Plan, hash_arrays
from ..balance.plan import plan_packs
from ..balance.schedule import concat_plans, interleave_steps, micro_step_packs
from .groups import SamplerGroups

__all__ = ["PLAN_AHEAD_THREAD", "EpochCache", "EpochSchedule", "plan_epoch"]

# The name of every thread that plans an epoch ahead, followed by the epoch (tests wait for such threads).
PLAN_AHEAD_THREAD = "omnibal-plan-epoch-"


@dataclass
class EpochSchedule:
    """One epoch in global sample ids: packs of all groups and the (micro_step, rank) table of pack ids."""

    epoch: int
    plans: tuple[Plan, ...]
    pack_offsets: np.ndarray  # (num_packs + 1,) int64
    pack_samples: np.ndarray  # global sample ids, pack after pack
    micro_packs: np.ndarray  # (num_micro_steps, world_size) int64
    fingerprint: str
    duplicated_fraction: float = 0.0  # extra occurrences of samples in reused packs over distinct samples
    mean_pack_size: float = 0.0  # distinct samples over distinct packs scheduled
    report: Any = None  # the epoch's SamplerReport, made when first asked for
    step_counts: Any = None  # every optimizer step's label tokens and labelled samples, made when first asked for

    @property
    def num_micro_steps(self) -> int:
        return int(self.micro_packs.shape[0])

    def batch(self, micro_step: int, rank: int) -> list[int]:
        p = int(self.micro_packs[micro_step, rank])
        return self.pack_samples[self.pack_offsets[p] : self.pack_offsets[p + 1]].tolist()


def plan_epoch(groups: SamplerGroups, world_size: int, micro_steps: int, epoch: int) -> EpochSchedule:
    """Plans every group for ``epoch`` and lays the plans out in micro-steps of ``world_size`` ranks.

    Planning errors keep their type (``OversizeError``, ``TooFewPacksError``) and gain the group and the
    slots per optimizer step.
    """
    m, world = micro_steps, world_size
    plans = []
    for g, (group_lengths, options) in enumerate(zip(groups.lengths, groups.options)):
        try:
            plan = plan_packs(group_lengths, options.replace(seed=groups.seed(g)), world_size=world * m, epoch=epoch)
        except ValueError as err:
            raise type(err)(
                f"{groups.where(g)}{err} [world_size {world} x micro_steps_per_step {m} = {world * m} "
                "packs per optimizer step]"
            ) from err
        plans.append(plan)

    stacked = concat_plans(plans, groups.ids)
    steps = np.concatenate([micro_step_packs(s, world, m) for s in stacked.step_packs])  # (steps, m, world)
    if len(plans) > 1:
        steps = steps[interleave_steps([p.num_steps for p in plans], groups.options[0].seed, epoch)]
    micro_packs = np.ascontiguousarray(steps.reshape(-1, world))
    pack_offsets, pack_samples = stacked.pack_offsets, stacked.pack_samples
    sizes = np.diff(pack_offsets)
    counts = np.bincount(micro_packs.reshape(-1), minlength=sizes.shape[0])
    distinct = int(sizes[counts > 0].sum())
    duplicated = int(((counts - 1).clip(min=0) * sizes).sum())
    return EpochSchedule(
        epoch,
        tuple(plans),
        pack_offsets,
        pack_samples,
        micro_packs,
        hash_arrays(pack_offsets, pack_samples, micro_packs),
        duplicated_fraction=duplicated / distinct if distinct else 0.0,
        mean_pack_size=distinct / max(int((counts > 0).sum()), 1),
    )


class EpochCache:
    """The planned epochs a sampler keeps: the current one and the last other one asked for, so that
    inspecting another epoch (a report, a fingerprint, a state to load) never evicts the current one, and
    at most one epoch planned ahead on a background thread (:meth:`plan_ahead`)."""

    def __init__(self, plan: Callable[[int], EpochSchedule]) -> None:
        self._plan = plan
        self._schedules: dict[int, EpochSchedule] = {}
        self._ahead: Optional[_PlannedAhead] = None

    def get(self, epoch: int, current: int) -> EpochSchedule:
        """The schedule of ``epoch``, planned now unless kept or planned ahead; ``current`` is the sampler's
        epoch."""
        schedule = self._schedules.get(epoch)
        if schedule is None:
            schedule = self._take_ahead(epoch)
            if schedule is None:
                schedule = self._plan(epoch)
            self._schedules = {e: s for e, s in self._schedules.items() if e == current}
            self._schedules[epoch] = schedule
        return schedule

    def plan_ahead(self, epoch: int) -> None:
        """Starts planning ``epoch`` on a background thread, unless it is kept or already being planned; the
        next :meth:`get` of it waits for that plan instead of making its own. The engine releases the GIL while
        it works, so the plan is made while the current epoch trains."""
        if epoch in self._schedules or (self._ahead is not None and self._ahead.epoch == epoch):
            return
        self._ahead = _PlannedAhead(epoch, self._plan)

    def _take_ahead(self, epoch: int) -> Optional[EpochSchedule]:
        """The schedule planned ahead for ``epoch`` (waiting for it), or None: another epoch was planned
        ahead, or its plan failed (planned again by the caller, whose own call raises the error)."""
        ahead = self._ahead
        if ahead is None or ahead.epoch != epoch:
            return None
        self._ahead = None
        ahead.thread.join()
        return ahead.schedule

    def __getstate__(self) -> dict[str, Any]:
        # A thread does not copy or pickle; a copy plans that epoch when it is asked for.
        return dict(self.__dict__, _ahead=None)


class _PlannedAhead:
    """One epoch being planned on a background thread. The thread is not a daemon: the engine runs without the
    GIL, and a daemon thread whose engine call returns while the interpreter shuts down aborts the process, so
    an exit waits for the plan in flight instead (one plan, begun when the last pass began)."""

    def __init__(self, epoch: int, plan: Callable[[int], EpochSchedule]) -> None:
        self.epoch = epoch
        self.schedule: Optional[EpochSchedule] = None
        self.thread = threading.Thread(target=self._run, args=(plan,), name=f"{PLAN_AHEAD_THREAD}{epoch}")
        self.thread.start()

    def _run(self, plan: Callable[[int], EpochSchedule]) -> None:
        try:
            self.schedule = plan(self.epoch)
        except Exception:  # EpochCache.get plans the epoch again and raises there, in the caller's thread
            self.schedule = None
