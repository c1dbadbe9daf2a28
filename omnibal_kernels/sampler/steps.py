"""What a sampler's batch carries besides its sample ids, so that the collator can check loads and weight the loss.

``BalancedBatchSampler`` yields :class:`PlannedBatch` objects: lists of sample ids that also hold the
:class:`PlannedStep` of their micro-step: where it sits (epoch, optimizer step, micro-step, rank), each sample's
loads as the lengths give them and, when the lengths carry label counts, the label tokens and the labelled
samples of the whole optimizer step over all ranks and micro-steps. Every rank knows these from the plan,
without communication.

DataLoader workers hold copies of the dataset and the collator, made when they start (persistent workers keep
theirs for the whole run). So nothing here lives in the dataset: what a batch needs travels with its indices,
which the batch sampler yields in the main process and the DataLoader sends to the worker. Forked, spawned and
persistent workers, the duplicated packs of a ragged last step and resumed runs all see the plan's values.

:class:`PlannedDataset` (``sampler.wrap(dataset)``) hands the step on to the collator: ``__getitems__`` returns
the samples as :class:`PlannedSamples`, a list that also holds the step and the sample ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch.utils.data

from ..balance.report import pack_sums
from ..context_parallel.options import ContextParallelOptions
from ..lengths import Lengths
from .epochs import EpochSchedule

__all__ = ["PlannedBatch", "PlannedDataset", "PlannedSamples", "PlannedStep", "planned_batch", "step_label_counts"]


@dataclass(frozen=True)
class PlannedStep:
    """One micro-step of one rank, as the plan has it.

    Attributes:
        epoch, step, micro_step: the epoch, the optimizer step in it and the micro-step in that
            (``0 <= micro_step < micro_steps_per_step``).
        micro_steps_per_step, world_size, rank: the sampler's.
        vit, llm: each sample's ViT load and tokens per the lengths, in batch order.
        label: each sample's label tokens per the lengths (:attr:`~omnibal_kernels.lengths.Lengths.label`), or
            None when the lengths carry no label counts.
        num_items_in_batch: label tokens of the whole optimizer step, all ranks and micro-steps (duplicated
            packs counted as often as they are trained); None without label counts.
        num_samples_in_batch: samples of the optimizer step with at least one label token, counted the same
            way; None without label counts.
        context_parallel, context_parallel_rank: the plan's context-parallel options and this rank's place in
            its CP group: the collator shards the pack with them.
    """

    epoch: int
    step: int
    micro_step: int
    micro_steps_per_step: int
    world_size: int
    rank: int
    vit: tuple[int, ...]
    llm: tuple[int, ...]
    label: Optional[tuple[int, ...]]
    num_items_in_batch: Optional[int]
    num_samples_in_batch: Optional[int]
    context_parallel: ContextParallelOptions = field(default_factory=ContextParallelOptions)
    context_parallel_rank: int = 0


class PlannedBatch(list):
    """The sample ids of one micro-step (a ``list[int]``, equal to the plain list) and its :class:`PlannedStep`."""

    __slots__ = ("step",)

    def __init__(self, ids: list[int], step: PlannedStep) -> None:
        super().__init__(ids)
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlannedBatch, (list(self), self.step))

    def __index__(self) -> int:
        # A dataset indexed with a whole batch was handed this sampler as ``sampler=``: say so where Python
        # asks for an integer index (list and tuple datasets), instead of an error about the index's type.
        raise TypeError(
            "a whole batch of sample ids reached the dataset as one index: a BalancedBatchSampler yields "
            "batches, so pass it as DataLoader(dataset, batch_sampler=sampler), not sampler=sampler"
        )


class PlannedSamples(list):
    """The samples of a :class:`PlannedBatch` (a list, as ``dataset.__getitems__`` returns), with its step.

    Attributes:
        step: the :class:`PlannedStep`.
        ids: the samples' dataset indices (what error messages name).
        check_loads: whether the collator checks each sample's loads against ``step``.
    """

    __slots__ = ("step", "ids", "check_loads")

    def __init__(self, samples: list[Any], step: PlannedStep, ids: list[int], check_loads: bool) -> None:
        super().__init__(samples)
        self.step, self.ids, self.check_loads = step, ids, check_loads

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlannedSamples, (list(self), self.step, self.ids, self.check_loads))


class PlannedDataset(torch.utils.data.Dataset):
    """``dataset`` as a sampler's batches fetch it: ``DataLoader(sampler.wrap(dataset), batch_sampler=sampler)``.

    Item ``i`` is ``dataset[i]``. A batch of a :class:`PlannedBatch` comes back as :class:`PlannedSamples`, so
    that :class:`~omnibal_kernels.packing.PackCollator` checks the loads and gives the batch its
    ``num_items_in_batch``. Uses ``dataset.__getitems__`` where it has one (``datasets.Dataset``).

    Args:
        dataset: a map-style dataset whose sample ``i`` the lengths describe.
        check_loads: check every sample's tokens, ViT load and label tokens against its length entry.
    """

    def __init__(self, dataset: Any, *, check_loads: bool = True) -> None:
        if not isinstance(check_loads, bool):
            raise TypeError(f"check_loads must be a bool, got {check_loads!r}")
        self.dataset = dataset
        self.check_loads = check_loads

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, list):
            raise TypeError(
                "a whole batch of sample ids reached the dataset as one index: a BalancedBatchSampler yields "
                "batches, so pass it as DataLoader(dataset, batch_sampler=sampler), not sampler=sampler"
            )
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        ids = list(indices)
        fetch = getattr(self.dataset, "__getitems__", None)
        samples = list(fetch(ids)) if callable(fetch) else [self.__getitem__(i) for i in ids]
        if isinstance(indices, PlannedBatch):
            return PlannedSamples(samples, indices.step, ids, self.check_loads)
        return samples

    def __repr__(self) -> str:
        return f"PlannedDataset({self.dataset!r}, check_loads={self.check_loads})"


def step_label_counts(schedule: EpochSchedule, label: np.ndarray, micro_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``(items, samples)``, each ``(num_steps,)`` int64: every optimizer step's label tokens and samples with at
    least one label token, over all ranks and micro-steps (a reused pack counts every time it is scheduled)."""
    rows = schedule.micro_packs.reshape(-1, micro_steps * schedule.micro_packs.shape[1])  # (steps, m * world)
    offsets, samples = schedule.pack_offsets, schedule.pack_samples
    items = pack_sums(offsets, samples, label)[rows].sum(axis=1)
    labelled = pack_sums(offsets, samples, (label > 0).astype(np.int64))[rows].sum(axis=1)
    return items.astype(np.int64), labelled.astype(np.int64)


def planned_batch(
    schedule: EpochSchedule,
    micro_step: int,
    rank: int,
    lengths: Lengths,
    micro_steps: int,
    counts: Optional[tuple[np.ndarray, np.ndarray]],
    context_parallel: tuple[ContextParallelOptions, int],
) -> PlannedBatch:
    """The batch of ``(micro_step, rank)`` with its :class:`PlannedStep`; ``counts``: :func:`step_label_counts`
    of the schedule (None without label counts); ``context_parallel``: the plan's CP options and this rank's
    place in its CP group."""
    ids = schedule.batch(micro_step, rank)
    index = np.asarray(ids, dtype=np.int64)
    step = micro_step // micro_steps
    label = None if lengths.label is None else tuple(lengths.label[index].tolist())
    return PlannedBatch(
        ids,
        PlannedStep(
            epoch=schedule.epoch,
            step=step,
            micro_step=micro_step % micro_steps,
            micro_steps_per_step=micro_steps,
            world_size=int(schedule.micro_packs.shape[1]),
            rank=rank,
            vit=tuple(lengths.vit[index].tolist()),
            llm=tuple(lengths.llm[index].tolist()),
            label=label,
            num_items_in_batch=None if counts is None else int(counts[0][step]),
            num_samples_in_batch=None if counts is None else int(counts[1][step]),
            context_parallel=context_parallel[0],
            context_parallel_rank=context_parallel[1],
        ),
    )
