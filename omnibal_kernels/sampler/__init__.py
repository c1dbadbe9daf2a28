"""Samplers over a plan: every data-parallel rank gets its balanced packs, one list of sample ids per micro-step.

``BalancedBatchSampler`` is a ``torch.utils.data.Sampler[list[int]]`` for ``DataLoader(batch_sampler=...)``.
Each epoch it plans packs with :func:`omnibal_kernels.balance.plan_packs` (a pure function of the lengths,
the options and the epoch), so every rank computes the same schedule without communication and keeps its own
column of it.

Gradient accumulation: with ``micro_steps_per_step = m`` the plan is made for ``world_size * m`` virtual
ranks, and every planned step is one optimizer step. The balanced method gives all packs of a planned step
near-equal loads, so both the per-micro-step loads of the ranks and their per-optimizer-step sums are
balanced, and an epoch always holds a whole number of optimizer steps.

Groups (the OmniBal multi-group mode): samples may be split into groups (e.g. text-only and image-text data)
that are packed separately, each under its own capacities; every optimizer step holds packs of one group.

Modules, each building on the ones before it:

=================  ==========================================================================================
``groups``         which samples plan together; each group's options and capacities (the per-group forms)
``epochs``         one epoch's schedule over all ranks (groups interleaved, micro-steps); the epochs kept
``report``         what an epoch gives the ranks (``SamplerReport``)
``state``          the position in an epoch, and the state that resumes it (fingerprints checked)
``steps``          what a batch carries besides its ids (``PlannedBatch``), and ``sampler.wrap(dataset)``
``batch_sampler``  ``BalancedBatchSampler`` itself
=================  ==========================================================================================
"""

from .batch_sampler import BalancedBatchSampler
from .report import SamplerReport
from .steps import PlannedBatch, PlannedDataset, PlannedStep

__all__ = ["BalancedBatchSampler", "PlannedBatch", "PlannedDataset", "PlannedStep", "SamplerReport"]
