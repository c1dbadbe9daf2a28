"""``BalancedBatchSampler``: the ``torch.utils.data.Sampler[list[int]]`` over the epochs' schedules."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, Optional, Union

import numpy as np
import torch.utils.data

from .._checks import check_epoch, check_int, check_positive_int, default_world
from .._warnings import DuplicatesWarning, OmnibalWarning
from ..balance.options import PlanOptions
from ..balance.packs import Plan, as_lengths
from ..context_parallel.options import ContextParallelOptions
from ..context_parallel.report import slot_rank_times
from ..lengths import Lengths
from .epochs import EpochCache, EpochSchedule, plan_epoch
from .groups import build_groups
from .report import SamplerReport, make_report, micro_step_loads
from .state import Cursor, config_fingerprint, make_state, read_state, resume_position
from .steps import PlannedBatch, PlannedDataset, planned_batch, step_label_counts

__all__ = ["BalancedBatchSampler"]


def _shared_field(name: str) -> Any:
    """A read-only attribute of the sampler: field ``name`` of the options, the same for every group."""
    return property(lambda self: getattr(self.options[0], name), doc=f"The options' ``{name}`` (every group's).")


# Duplicates above this share of an epoch's samples are warned about (once per sampler).
DUPLICATES_WARNING_FRACTION = 0.05


class BalancedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields, for this rank, one list of sample ids per micro-step: ``DataLoader(ds, batch_sampler=...)``.

    Each list is a :class:`~omnibal_kernels.sampler.steps.PlannedBatch`, which also carries its micro-step's
    place in the plan and, with label counts in the lengths, the optimizer step's label tokens over all ranks
    and micro-steps. ``DataLoader(sampler.wrap(dataset), batch_sampler=sampler, collate_fn=PackCollator(...))``
    hands that to the collator: every batch then has ``num_items_in_batch`` and each sample's loads are checked
    against the lengths (:meth:`wrap`).

    Args:
        lengths: per-sample loads (``Lengths``, a ``(vit, llm)`` tuple, or a 1-D array of token counts);
            sample ``i`` is ``dataset[i]``.
        options: a :class:`~omnibal_kernels.balance.options.PlanOptions` for every group, or a sequence with
            one per group (:mod:`~omnibal_kernels.sampler.groups` says which fields may differ).
        world_size, rank: all ranks and this one, both or neither; default torch.distributed's when
            initialized, else 1 and 0 (with ``WORLD_SIZE > 1`` in the environment that is an error: call
            ``torch.distributed.init_process_group`` first).
            Context parallelism is an option too (``PlanOptions(context_parallel=ContextParallelOptions(size=C,
            ...))``, the same for every group): the sampler's world is then the data-parallel one,
            ``world_size / C`` groups of the ``C`` consecutive ranks ``d * C, ..., d * C + C - 1`` (Megatron's and
            torchtitan's order without tensor parallelism; with another layout pass ``world_size = C *
            data-parallel size`` and ``rank = C * data-parallel rank + CP rank``), each group getting one pack per
            micro-step, the same on its ``C`` ranks; the batches of :meth:`wrap` carry the options and this
            rank's place in its group, so the collator hands each rank its shard. The capacities are per CP group
            (:func:`~omnibal_kernels.balance.plan_packs`). :attr:`world_size` and :attr:`rank` are the
            data-parallel ones, :attr:`context_parallel_rank` this rank's place in its group. Capacities not given
            are searched once, on each group's whole data, and kept for all epochs.
        micro_steps_per_step: micro-steps (gradient accumulation steps) per optimizer step.
        groups: ``None`` (one group), a per-sample array of integer group ids (groups in sorted id order), or
            a list of index arrays partitioning the samples. Each group is packed under its own capacities;
            each optimizer step holds packs of one group.
        dataset, num_samples: when given, the number of samples must equal ``len(lengths)``.
        plan_ahead: when a pass over an epoch starts, plan epoch ``epoch + 1`` on a background thread of this
            process, so that the pass after ``set_epoch(epoch + 1)`` starts without waiting for its plan (at
            hundreds of ranks a plan takes seconds, and every rank makes it). The plan is the same either way,
            and an error in it is raised where that epoch is first used. It costs one core while the plan is
            made, one more epoch's schedule in memory, and at exit a wait for a plan still in flight; another
            epoch than ``epoch + 1`` (and a copy of the sampler) is planned when asked for. ``False`` plans every
            epoch when it is first asked for: for runs of one epoch, or where no core is to spare.

    Raises:
        ValueError/TypeError: rank not in ``[0, world_size)``, only one of ``world_size`` and ``rank``, a
            context-parallel size that does not divide ``world_size``,
            ``WORLD_SIZE > 1`` without a process group, too few packs for the ranks with ``drop_last``, lengths
            not matching the dataset, bad groups or options (naming the argument, group or sample).

    Warns:
        CapacityWarning: capacities raised past those of ``target_batch_size`` (at construction).
        DuplicatesWarning: an epoch whose reused packs repeat more than 5% of its samples (once).
        OmnibalWarning: a wrapped dataset iterated without
            label counts in the lengths outside :func:`omnibal_kernels.loss.step_batches` (once), and a sampler
            planned with context parallelism iterated before :meth:`wrap` (once).
    """

    def __init__(
        self,
        lengths: Union[Lengths, tuple, np.ndarray],
        options: Union[PlanOptions, Sequence[PlanOptions], None] = None,
        *,
        world_size: Optional[int] = None,
        rank: Optional[int] = None,
        micro_steps_per_step: int = 1,
        groups: Any = None,
        dataset: Any = None,
        num_samples: Optional[int] = None,
        plan_ahead: bool = True,
    ) -> None:
        if not isinstance(plan_ahead, bool):
            raise TypeError(f"plan_ahead must be a bool, got {type(plan_ahead).__name__}")
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
        world_size, rank = default_world(world_size, rank, owner="BalancedBatchSampler")
        self.micro_steps_per_step = check_positive_int("micro_steps_per_step", micro_steps_per_step)
        cp = _first_options(options).context_parallel.size
        if world_size % cp:
            raise ValueError(
                f"BalancedBatchSampler: context_parallel.size={cp} does not divide world_size="
                f"{world_size}: the ranks must form whole context-parallel groups"
            )
        self.world_size, self.rank = world_size // cp, rank // cp
        self.context_parallel_rank = rank % cp
        self._context_parallel_size = cp
        self._groups = build_groups(
            self.lengths, groups, options, world_size=self.world_size, micro_steps=self.micro_steps_per_step
        )
        self._config_fingerprint = config_fingerprint(
            self.lengths, self._groups, self.world_size, self.micro_steps_per_step
        )
        self._cursor = Cursor()
        self._epochs = EpochCache(partial(plan_epoch, self._groups, self.world_size, self.micro_steps_per_step))
        self._plan_ahead = plan_ahead
        self._sample_costs: Optional[np.ndarray] = None
        self._wrapped = False  # wrap() was called: batches reach a collator that weights the loss
        self._counted_per_step = False  # step_batches counts the label tokens (one all-reduce per step)
        self._warned: set[str] = set()
        self._schedule()  # plan now: bad options fail at construction, not in the first DataLoader pass

    # ------------------------------------------------------------------------------------------ options

    @property
    def options(self) -> tuple[PlanOptions, ...]:
        """Every group's options, with its capacities (given or searched)."""
        return self._groups.options

    @property
    def groups(self) -> list[np.ndarray]:
        """Every group's sorted sample ids (one group: all samples)."""
        return list(self._groups.ids)

    @property
    def capacities(self) -> list[tuple[int, int]]:
        """``(vit_capacity, llm_capacity)`` of every group."""
        return self._groups.capacities

    method = _shared_field("method")
    seed = _shared_field("seed")
    drop_last = _shared_field("drop_last")
    oversize = _shared_field("oversize")
    cost_model = _shared_field("cost_model")
    context_parallel = _shared_field("context_parallel")

    # ------------------------------------------------------------------------------------------ sampling

    def _schedule(self, epoch: Optional[int] = None) -> EpochSchedule:
        """The schedule of ``epoch`` (checked; default: the current one)."""
        current = self._cursor.epoch
        schedule = self._epochs.get(current if epoch is None else check_epoch(epoch), current)
        if schedule.duplicated_fraction > DUPLICATES_WARNING_FRACTION and "duplicates" not in self._warned:
            self._warned.add("duplicates")
            slots = self.world_size * self.micro_steps_per_step
            warnings.warn(
                f"epoch {schedule.epoch}: {schedule.duplicated_fraction:.1%} of the epoch's samples are trained twice: "
                f"its packs do not fill a whole number of optimizer steps of world_size {self.world_size} x "
                f"micro_steps_per_step {self.micro_steps_per_step} = {slots} packs, and the ragged last step is "
                f"filled with reused packs (packs hold about {schedule.mean_pack_size:.3g} samples); pass "
                "drop_last=True to drop it instead, or use more samples, fewer ranks or smaller packs",
                DuplicatesWarning,
                stacklevel=3,
            )
        return schedule

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch to sample (a new plan per epoch). Setting the current epoch again keeps a
        resumed position, so ``load_state_dict`` followed by the usual ``set_epoch(e)`` continues mid-epoch."""
        self._cursor.set_epoch(check_epoch(epoch))

    def __len__(self) -> int:
        """Batches the next pass yields: the epoch's micro-steps, less those already done before a resume."""
        return self._schedule().num_micro_steps - self._cursor.start

    def __iter__(self) -> Iterator[list[int]]:
        if self.context_parallel.enabled and not self._wrapped and "context parallel" not in self._warned:
            self._warned.add("context parallel")
            warnings.warn(
                f"this sampler plans with context_parallel.size={self.context_parallel.size}: the "
                f"{self.context_parallel.size} ranks of a group get the same pack, and only batches of "
                "sampler.wrap(dataset) tell the collator (PackCollator) which shard is this rank's; iterated "
                "without it, every rank of the group trains the whole pack unless your collate_fn shards it",
                OmnibalWarning,
                stacklevel=2,
            )
        if (
            self._wrapped
            and self.lengths.label is None
            and not self._counted_per_step
            and "label counts" not in self._warned
        ):
            self._warned.add("label counts")
            warnings.warn(
                "the lengths carry no label counts, so the batches of sampler.wrap(dataset) get no "
                "num_items_in_batch and a model's loss would be a mean per pack, not over the optimizer step: "
                "iterate omnibal_kernels.step_batches(loader), which counts each step's label tokens with one "
                "all-reduce, or load lengths with label counts",
                OmnibalWarning,
                stacklevel=2,
            )
        return self._batches()

    def _batches(self) -> Iterator[PlannedBatch]:
        schedule = self._schedule()
        self._plan_after(self._cursor.epoch)
        counts = self._step_counts(schedule)
        for i in range(self._cursor.begin_pass(), schedule.num_micro_steps):
            self._cursor.position = i + 1
            yield planned_batch(schedule, i, self.rank, self.lengths, self.micro_steps_per_step, counts, self._cp)
        self._cursor.end_pass()

    def _plan_after(self, epoch: int) -> None:
        """A pass over ``epoch`` begins: with ``plan_ahead``, the next epoch is planned meanwhile."""
        if self._plan_ahead:
            self._epochs.plan_ahead(epoch + 1)

    def _step_counts(self, schedule: EpochSchedule) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Every optimizer step's label tokens and labelled samples (None without label counts), made once."""
        if self.lengths.label is None:
            return None
        if schedule.step_counts is None:
            schedule.step_counts = step_label_counts(schedule, self.lengths.label, self.micro_steps_per_step)
        return schedule.step_counts

    def wrap(self, dataset: Any, *, check_loads: bool = True) -> PlannedDataset:
        """``dataset`` for ``DataLoader(sampler.wrap(dataset), batch_sampler=sampler, collate_fn=...)``.

        The collator (:class:`~omnibal_kernels.packing.PackCollator`, ``pack_batch``) then receives each batch
        with its :class:`~omnibal_kernels.sampler.steps.PlannedStep` (in DataLoader workers too: it travels with
        the batch's indices) and gives every batch its ``num_items_in_batch``: the label tokens of the whole
        optimizer step over all ranks and micro-steps, known from the plan when the lengths carry label
        counts. A model's loss over it, times ``world_size`` under DDP (which averages gradients), has exactly
        the gradient of the token mean over the optimizer step.

        Args:
            dataset: the map-style dataset the lengths describe (sample ``i`` is ``dataset[i]``).
            check_loads: the collator checks every sample's tokens (``len(input_ids)``), ViT load (the first
                dimension of ``pixel_values`` and ``pixel_values_videos``: tiles or patches) and label tokens
                against its length entry, and raises ``ValueError`` naming the sample and both values on a
                difference, before the pack is built (stale lengths would overfill packs).

        Raises:
            ValueError: the dataset's length is not the number of samples of the lengths.
        """
        if not hasattr(dataset, "__len__"):
            raise TypeError("wrap: dataset must have a length (a map-style dataset)")
        if len(dataset) != len(self.lengths):
            raise ValueError(f"wrap: the dataset has {len(dataset)} samples but the lengths have {len(self.lengths)}")
        self._wrapped = True
        return PlannedDataset(dataset, check_loads=check_loads)

    # ------------------------------------------------------------------------------------------ state

    def fingerprint(self, epoch: Optional[int] = None) -> str:
        """Hash of the epoch's schedule over all ranks (equal on every rank; default: the current epoch)."""
        return self._schedule(epoch).fingerprint

    def state_dict(self, consumed: Optional[int] = None) -> dict[str, Any]:
        """The position in the epoch, to resume from (the same on every rank).

        Args:
            consumed: micro-steps the training loop consumed in the current (or just finished) pass, counted
                from where that pass started (a resumed position included). Default: all batches this
                sampler handed out, which is exact when batches are fetched on demand (``num_workers=0``); a
                DataLoader with workers prefetches, so pass the loop's count then.
        """
        schedule = self._schedule()
        return make_state(
            self._cursor,
            consumed,
            num_micro_steps=schedule.num_micro_steps,
            world_size=self.world_size,
            config_fingerprint=self._config_fingerprint,
            plan_fingerprint=schedule.fingerprint,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues where ``state`` was saved: the next pass yields exactly the remaining batches.

        Raises ValueError when the state was saved with other lengths, options or world size.
        """
        epoch = read_state(
            state,
            world_size=self.world_size,
            config_fingerprint=self._config_fingerprint,
            context_parallel=self._context_parallel_size,
        )
        schedule = self._schedule(epoch)
        position = resume_position(
            state, epoch=epoch, plan_fingerprint=schedule.fingerprint, num_micro_steps=schedule.num_micro_steps
        )
        self._cursor.resume(epoch, position)

    # ------------------------------------------------------------------------------------------ inspection

    def plans(self, epoch: Optional[int] = None) -> tuple[Plan, ...]:
        """Every group's :class:`Plan` of the epoch (over ``world_size * micro_steps_per_step`` virtual ranks);
        sample ids inside are group-local (``sampler.groups[g][id]`` is the dataset index)."""
        return self._schedule(epoch).plans

    def rank_batches(self, rank: Optional[int] = None, epoch: Optional[int] = None) -> list[PlannedBatch]:
        """All batches of ``rank`` (default this one) for the epoch, from its start, as :meth:`__iter__` yields them."""
        rank = self.rank if rank is None else check_int("rank", rank)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        schedule = self._schedule(epoch)
        counts = self._step_counts(schedule)
        return [
            planned_batch(schedule, i, rank, self.lengths, self.micro_steps_per_step, counts, self._cp)
            for i in range(schedule.num_micro_steps)
        ]

    def micro_step_loads(self, epoch: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vit, llm, cost)``, each ``(num_micro_steps, world_size)``: every rank's load of every micro-step."""
        if self._sample_costs is None:
            self._sample_costs = self.cost_model.sample_costs(self.lengths)
        return micro_step_loads(self._schedule(epoch), self.lengths, self._sample_costs, self.cost_model.per_pack)

    def report(self, epoch: Optional[int] = None, *, progress: Optional[bool] = None) -> SamplerReport:
        """The :class:`SamplerReport` of the epoch (default: the current one; made once per planned epoch). With
        context parallelism it holds every CP rank's predicted time per micro-step
        (:attr:`SamplerReport.context_parallel`; ``progress``: a progress bar while the packs are priced,
        default when stderr is a terminal)."""
        schedule = self._schedule(epoch)
        if schedule.report is None:
            cp = None
            if self.context_parallel.enabled:
                cp = slot_rank_times(
                    schedule.pack_offsets,
                    schedule.pack_samples,
                    schedule.micro_packs,
                    self.lengths.llm,
                    self.context_parallel,
                    progress=progress,
                    vision=self.lengths,
                )
            schedule.report = make_report(
                schedule, self._groups, self.micro_steps_per_step, self.micro_step_loads(schedule.epoch), cp
            )
        return schedule.report

    @property
    def _cp(self) -> tuple[ContextParallelOptions, int]:
        return self.context_parallel, self.context_parallel_rank

    def __repr__(self) -> str:
        size = self.context_parallel.size
        cp = f", context_parallel_size={size}, context_parallel_rank={self.context_parallel_rank}" if size > 1 else ""
        return (
            f"BalancedBatchSampler(samples={len(self.lengths)}, world_size={self.world_size}, rank={self.rank}"
            f"{cp}, method={self.method!r}, capacities={self.capacities}, micro_steps_per_step="
            f"{self.micro_steps_per_step}, groups={len(self.groups)}, epoch={self.epoch})"
        )


def _first_options(options: Union[PlanOptions, Sequence[PlanOptions], None]) -> PlanOptions:
    """The first group's options (groups must agree on everything but :data:`~.groups.PER_GROUP_FIELDS`; the
    groups' own check says where they do not); the defaults for None or anything else (checked there too)."""
    if isinstance(options, Sequence) and not isinstance(options, str) and len(options):
        options = options[0]
    return options if isinstance(options, PlanOptions) else PlanOptions()
