"""Several plans as one schedule: the sampler's groups and micro-steps, and the streaming packer's buffers.

A plan's sample ids index its own ``Lengths``; :func:`concat_plans` maps them to global ids and stacks the packs
of several plans, so one table of pack ids can address all of them. :func:`micro_step_packs` turns a plan made
for ``world_size * micro_steps`` virtual ranks into micro-steps of ``world_size`` real ranks, and
:func:`interleave_steps` lays the steps of several groups out in one seeded order that keeps each group's own
step order. Everything here is integer-only and seeded through the engine's RNG, so every rank on every
platform computes the same schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .. import _ext
from .packs import Plan
from .seeds import epoch_seed

__all__ = ["StackedPlans", "concat_plans", "interleave_steps", "micro_step_packs"]


class StackedPlans(NamedTuple):
    """Packs of several plans in one CSR table, in global sample ids."""

    pack_offsets: np.ndarray
    """``(num_packs + 1,)`` int64 over all plans, plan after plan"""
    pack_samples: np.ndarray
    """int64 global sample ids, pack after pack"""
    step_packs: tuple[np.ndarray, ...]
    """per plan, its ``(num_steps, world_size)`` slots as ids into the stacked packs"""


def concat_plans(plans: Sequence[Plan], sample_ids: Sequence[np.ndarray]) -> StackedPlans:
    """Stacks ``plans``; ``sample_ids[k]`` maps plan ``k``'s sample ids to global ids."""
    if len(plans) != len(sample_ids):
        raise ValueError(f"{len(plans)} plans but {len(sample_ids)} sample id maps")
    offsets, samples, steps = [np.zeros(1, np.int64)], [], []
    base_pack = base_sample = 0
    for plan, ids in zip(plans, sample_ids):
        samples.append(np.asarray(ids, dtype=np.int64)[plan.pack_samples])
        offsets.append(plan.pack_offsets[1:] + base_sample)
        steps.append(plan.step_packs + base_pack)
        base_sample += int(plan.pack_offsets[-1])
        base_pack += plan.num_packs
    return StackedPlans(
        np.concatenate(offsets), np.concatenate(samples) if samples else np.zeros(0, np.int64), tuple(steps)
    )


def micro_step_packs(step_packs: np.ndarray, world_size: int, micro_steps: int) -> np.ndarray:
    """``(num_steps, world_size * micro_steps)`` slots of virtual ranks -> ``(num_steps, micro_steps, world_size)``.

    Virtual rank ``r * micro_steps + j`` of a planned step becomes micro-step ``j`` of real rank ``r``, so each
    rank's micro-steps of one optimizer step come from one balanced step of the plan.
    """
    num_steps = step_packs.shape[0]
    return step_packs.reshape(num_steps, world_size, micro_steps).transpose(0, 2, 1)


def interleave_steps(step_counts: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """A seeded order of the steps of several groups that keeps each group's own step order.

    Returns ``order`` with ``order[k]`` the index (into the groups' steps, group after group) of the ``k``-th
    step of the schedule. The groups' labels are shuffled with the engine's integer shuffle (stream
    ``STREAMS["group_steps"]``), and the ``i``-th label of group ``g`` takes group ``g``'s ``i``-th step: the
    engine lays a group's steps out with no load trend over the epoch, and a shuffle of all steps would undo it.
    """
    C = _ext.load()
    labels = np.repeat(np.arange(len(step_counts), dtype=np.int64), np.asarray(step_counts, dtype=np.int64))
    labels = C.shuffle(labels, C.derive_seed(epoch_seed(seed, epoch), C.STREAMS["group_steps"], 0))
    order = np.empty(labels.shape[0], dtype=np.int64)
    order[np.argsort(labels, kind="stable")] = np.arange(labels.shape[0])
    return order
