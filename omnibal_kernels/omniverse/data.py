"""The two ways a run feeds its pipelines: random padded micro-batches and balanced packs.

Both give :class:`MicroBatches`: every micro-batch's per-sample loads as the model trains them (a padded
micro-batch's samples each count as many tokens as its longest one), and which micro-batch every pipeline
trains in every optimizer step. One plan step gives every data-parallel rank one micro-batch; ``micro_batches``
plan steps make an optimizer step (the last one ragged when the plan's steps are not a multiple).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .._checks import check_positive_int
from .._csr import row_totals
from ..balance import PlanOptions, plan_packs
from ..balance.cost import CostModel
from ..balance.padded import random_padded_plan
from ..lengths import Lengths

__all__ = ["DATA_CHOICES", "MicroBatches", "balanced_micro_batches", "padded_micro_batches", "resample"]

DATA_CHOICES = ("padded", "balanced")


@dataclass(frozen=True)
class MicroBatches:
    """Micro-batches of one epoch as the pipelines train them.

    Attributes:
        name: ``"padded"`` or ``"balanced"``.
        vit, llm: per sample, micro-batch after micro-batch, the ViT load and the LLM tokens trained (the
            padded length for a padded micro-batch).
        offsets: ``(num_micro_batches + 1,)``, micro-batch ``p`` holding entries ``offsets[p]:offsets[p + 1]``.
        steps: ``(num_steps, dp, micro_batches)`` micro-batch ids, ``-1`` where the last step is short.
        samples: samples of the data set (each trained once, plus the plan's repeats).
        padding_fraction: share of the trained LLM token positions that are padding.
        capacities: the balanced packs' ``(vit, llm)`` capacities, or ``None``.
        sample_ids: per entry of ``vit`` / ``llm``, the sample of the data set it is.
    """

    name: str
    vit: np.ndarray
    llm: np.ndarray
    offsets: np.ndarray
    steps: np.ndarray
    samples: int
    padding_fraction: float
    capacities: Optional[tuple[int, int]] = None
    sample_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_micro_batches(self) -> int:
        return self.offsets.size - 1

    @property
    def num_steps(self) -> int:
        return int(self.steps.shape[0])

    def step_counts(self) -> np.ndarray:
        """Micro-batches per pipeline in every optimizer step."""
        return (self.steps[:, 0, :] >= 0).sum(axis=1)

    def samples_of(self, micro_batch: int) -> np.ndarray:
        """The sample ids of one micro-batch."""
        return self.sample_ids[self.offsets[micro_batch] : self.offsets[micro_batch + 1]]

    def loads(self, ids: Iterable[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The ``(vit, llm)`` per-sample loads of micro-batches ``ids``."""
        return [
            (self.vit[self.offsets[p] : self.offsets[p + 1]], self.llm[self.offsets[p] : self.offsets[p + 1]])
            for p in ids
        ]

    def largest(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The micro-batches of most ViT load and of most tokens (what memory must hold)."""
        vit = row_totals(self.offsets, self.vit)
        llm = row_totals(self.offsets, self.llm)
        return self.loads(np.unique([int(np.argmax(vit)), int(np.argmax(llm))]))


def _steps(step_packs: np.ndarray, micro_batches: int) -> np.ndarray:
    """``(plan steps, dp)`` -> ``(optimizer steps, dp, micro_batches)``, ``-1`` past the last plan step."""
    plan_steps, dp = step_packs.shape
    count = -(-plan_steps // micro_batches)
    out = np.full((count * micro_batches, dp), -1, np.int64)
    out[:plan_steps] = step_packs
    return out.reshape(count, micro_batches, dp).transpose(0, 2, 1).copy()


def padded_micro_batches(
    lengths: Lengths, *, dp: int, micro_batches: int, batch_size: int, seed: int = 0
) -> MicroBatches:
    """Random micro-batches of ``batch_size`` samples (:func:`~omnibal_kernels.balance.padded.random_padded_plan`),
    each sample's tokens padded to the longest of its micro-batch, as InternVL-Chat's collator pads them (the
    tiles are concatenated, not padded)."""
    plan = random_padded_plan(lengths, world_size=dp, batch_size=batch_size, seed=seed)
    ids = plan.pack_samples.reshape(-1, batch_size)
    longest = lengths.llm[ids].max(axis=1)
    llm = np.repeat(longest, batch_size).astype(np.float64)
    real = float(lengths.llm[ids].sum())
    return MicroBatches(
        name="padded",
        vit=lengths.vit[plan.pack_samples].astype(np.float64),
        llm=llm,
        offsets=plan.pack_offsets.copy(),
        steps=_steps(plan.step_packs, micro_batches),
        samples=len(lengths),
        padding_fraction=1.0 - real / float(llm.sum()) if llm.sum() else 0.0,
        sample_ids=plan.pack_samples.copy(),
    )


def balanced_micro_batches(
    lengths: Lengths,
    *,
    dp: int,
    micro_batches: int,
    cost_model: CostModel,
    capacities: tuple[int, int],
    seed: int = 0,
) -> MicroBatches:
    """Balanced packs (:func:`~omnibal_kernels.balance.plan_packs`, ``objective="time"`` with the model's
    ``cost_model``) under ``capacities``, one pack per micro-batch; a sample above a capacity trains alone."""
    options = PlanOptions(
        vit_capacity=int(capacities[0]),
        llm_capacity=int(capacities[1]),
        cost_model=cost_model,
        oversize="single",
        seed=seed,
    )
    plan = plan_packs(lengths, world_size=dp, options=options)
    return MicroBatches(
        name="balanced",
        vit=lengths.vit[plan.pack_samples].astype(np.float64),
        llm=lengths.llm[plan.pack_samples].astype(np.float64),
        offsets=plan.pack_offsets.copy(),
        steps=_steps(plan.step_packs, micro_batches),
        samples=len(lengths),
        padding_fraction=0.0,
        capacities=(int(capacities[0]), int(capacities[1])),
        sample_ids=plan.pack_samples.copy(),
    )


def resample(lengths: Lengths, samples: int, seed: int = 0) -> Lengths:
    """``samples`` samples drawn with replacement from ``lengths`` (seeded): a data set of another size with
    the same distribution of loads."""
    samples = check_positive_int("samples", samples)
    pick = np.sort(np.random.default_rng(seed).integers(0, len(lengths), samples))
    return lengths[pick]


def data_summary(data: MicroBatches) -> dict[str, Any]:
    """Counts of one data choice, for reports."""
    sizes = np.diff(data.offsets)
    return {
        "name": data.name,
        "micro_batches": data.num_micro_batches,
        "steps": data.num_steps,
        "samples_per_micro_batch": float(sizes.mean()),
        "padding_fraction": data.padding_fraction,
        "capacities": list(data.capacities) if data.capacities else None,
    }
