"""The collator's side of a sampler's plan: each sample's loads checked against its length entry, and the
:class:`~omnibal_kernels.packing.LossCounts` that weight a batch's loss over its optimizer step.

Samples arrive as :class:`~omnibal_kernels.sampler.steps.PlannedSamples` when the dataset is
``sampler.wrap(dataset)``; any other list of samples gets counts of its own batch only.

The loads of a sample, as length files count them: ``llm`` is ``len(input_ids)`` (image placeholders included);
``vit`` the first dimension of ``pixel_values`` plus that of ``pixel_values_videos`` (InternVL tiles, or Qwen2-VL
patches); ``label`` the positions after the first whose label is not ``ignore_index`` (the causal loss's targets:
packing masks each sample's first label, so the pack trains exactly these).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional, cast

import numpy as np

from .._csr import row_sums
from ..sampler.steps import PlannedSamples
from .batch import LossCounts
from .options import PackOptions

__all__ = ["batch_counts", "check_planned_loads", "sample_loads"]

# The fields whose first dimension is a sample's ViT load (tiles or patches).
_VIT_FIELDS = ("pixel_values", "pixel_values_videos")


def _first_dim(value: Any) -> Optional[int]:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    try:
        return len(value)
    except TypeError:
        return None


def sample_loads(sample: Mapping[str, Any]) -> tuple[Optional[int], int]:
    """``(llm, vit)`` of one sample as the module docstring counts them; ``llm`` None when ``input_ids`` has no
    length (pack_batch then names the problem)."""
    vit = 0
    for key in _VIT_FIELDS:
        if key in sample:
            vit += _first_dim(sample[key]) or 0
    return _first_dim(sample.get("input_ids")), vit


def _stale(index: int, what: str, actual: int, entry: str, expected: int) -> ValueError:
    return ValueError(
        f"sample {index}: {what} is {actual} but its length entry says {entry} {expected}; the "
        "lengths do not describe this dataset (recompute them), or pass "
        "sampler.wrap(dataset, check_loads=False) if they are estimates on purpose"
    )


def check_planned_loads(samples: PlannedSamples) -> None:
    """Each sample's tokens and ViT load against its length entry, before the pack is built.

    Raises ValueError naming the sample's dataset index and both values (a pack built from stale lengths can
    exceed the capacities it was planned under).
    """
    step = samples.step
    if len(samples) != len(step.llm):
        raise ValueError(f"the dataset returned {len(samples)} samples for a batch of {len(step.llm)} sample ids")
    for j, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            continue  # pack_batch names it
        llm, vit = sample_loads(sample)
        if llm is not None and llm != step.llm[j]:
            raise _stale(samples.ids[j], "len(input_ids)", llm, "llm", step.llm[j])
        if vit != step.vit[j]:
            raise _stale(
                samples.ids[j],
                "the ViT load (first dimension of pixel_values and pixel_values_videos)",
                vit,
                "vit",
                step.vit[j],
            )


def _check_labels(samples: PlannedSamples, fields: dict[str, Any], opts: PackOptions, num_samples: int) -> None:
    """Each sample's trained label tokens in the packed row against its length entry."""
    # per-sample sums as differences of one running sum at the samples' bounds: exact for empty samples
    # anywhere in the pack (a reduceat gives an empty sample the value at its start, and its start index can
    # not pass the row's end), and the padding after the last sample is never counted
    trained = fields["labels"][0].numpy() != opts.ignore_index
    bounds = fields["cu_seqlens"][: num_samples + 1].numpy().astype(np.int64)
    found = row_sums(bounds, trained).tolist()
    expected = cast(tuple[int, ...], samples.step.label)  # the caller checks labels only when it is set
    if tuple(found) != expected:
        j = next(j for j, (a, b) in enumerate(zip(found, expected)) if a != b)
        raise _stale(
            samples.ids[j],
            "the number of label tokens (labels after the first that are not ignore_index)",
            found[j],
            "label",
            expected[j],
        )


def batch_counts(
    samples: Sequence[Any], fields: dict[str, Any], opts: PackOptions, takes_num_items: bool
) -> LossCounts:
    """The :class:`LossCounts` of a packed batch: its samples' lengths and, for planned samples, the plan's counts
    of its optimizer step (their label tokens checked against the packed labels when ``check_loads``).

    Raises ValueError when planned samples with label counts are packed with ``mask_first_label=False``: the
    pack would then train each sample's first label, which no per-sample count (nor the model alone) includes.
    """
    num_samples = len(samples)
    sample_lens = tuple(fields["seq_lens"][:num_samples].tolist())
    if not isinstance(samples, PlannedSamples):
        return LossCounts(sample_lens, takes_num_items=takes_num_items)
    step = samples.step
    if step.label is not None:
        if not opts.mask_first_label:
            raise ValueError(
                "label counts need mask_first_label=True: they count each sample's labels after its "
                "first token, as the model trains the sample alone"
            )
        if samples.check_loads:
            _check_labels(samples, fields, opts, num_samples)
    return LossCounts(
        sample_lens,
        step.num_items_in_batch,
        step.num_samples_in_batch,
        step.epoch,
        step.step,
        step.micro_step,
        step.micro_steps_per_step,
        step.world_size,
        takes_num_items,
    )
